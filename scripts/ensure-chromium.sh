#!/usr/bin/env bash
# The documentation's screenshots (scripts/screenshot_docs.sh) need a headless browser:
# install Debian's Chromium when missing (needs root). Not part of make setup or make test.
set -euo pipefail
for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "$(id -u)" -ne 0 ]; then
    echo "sqlsink docs: chromium is missing; install it (as root: apt-get install chromium)" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
