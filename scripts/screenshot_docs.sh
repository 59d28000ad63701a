#!/usr/bin/env bash
# Build the documentation site and take screenshots of the home page, the quick start
# and the runbook with headless Chromium, to look at them. Not part of make test.
#   bash scripts/screenshot_docs.sh [OUT_DIR]      (default: docs-screenshots/, untracked)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs-screenshots}
bash scripts/ensure-chromium.sh
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
NO_MKDOCS_2_WARNING=1 "${VENV:-.venv}/bin/mkdocs" build --strict -d "$SITE"
mkdir -p "$OUT"
BROWSER=$(command -v chromium || command -v chromium-browser)
shot() {  # name, page, width, height
    "$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --window-size="$3,$4" --screenshot="$OUT/$1.png" "file://$SITE/$2" 2>/dev/null
}
shot home index.html 1280 1100
shot quickstart getting-started/index.html 1280 2600
shot runbook operations/runbook/index.html 1280 2400
shot runbook-phone operations/runbook/index.html 420 1600
ls -l "$OUT"
