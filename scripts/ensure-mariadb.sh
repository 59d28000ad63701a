#!/usr/bin/env bash
# The MariaDB tests (tests/fix_mariadb.py) start their own server from Debian's binaries:
# mariadbd and mariadb-install-db, MariaDB 10.11 on bookworm. Install them when missing
# (needs root; without root the MariaDB tests are skipped, with a note). Only
# mariadb-server-core (and mariadb-client-core, which mariadb-install-db needs): the
# server binaries, without the service package, so no service
# is enabled or started, and the machine's own server on port 3306 (if any) is neither
# touched nor used. Idempotent and quiet.
set -euo pipefail

# mariadb-install-db runs my_print_defaults (mariadb-client-core)
if [ -x /usr/sbin/mariadbd ] && command -v mariadb-install-db >/dev/null 2>&1 \
    && command -v my_print_defaults >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "sqlsink tests: no MariaDB server binaries here, so the MariaDB tests are skipped" \
        "(as root: apt-get install mariadb-server-core mariadb-client-core)" >&2
    exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
lock_wait=(-o DPkg::Lock::Timeout=120)  # another apt at work: wait for it, boundedly
apt-get "${lock_wait[@]}" update -qq >"$log" 2>&1 || true
if ! DEBIAN_FRONTEND=noninteractive apt-get "${lock_wait[@]}" install -y -qq \
    --no-install-recommends -o Dpkg::Options::=--force-confold mariadb-server-core mariadb-client-core >>"$log" 2>&1; then
    echo "sqlsink tests: 'apt-get install mariadb-server-core mariadb-client-core' failed:" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
