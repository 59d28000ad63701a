#!/usr/bin/env bash
# The PgBouncer tests (tests/pg/test_pgbouncer.py) run their own pgbouncer process in
# front of the test server. Install Debian's package when no pgbouncer binary is found
# (needs root). Idempotent and quiet (silent on success). The package's system service
# is not used (and not needed): the tests start their own pgbouncer process.
set -euo pipefail

find_pgbouncer() {
    # Debian installs it in /usr/sbin, which an unprivileged user's PATH may lack
    command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]
}

if find_pgbouncer; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "sqlsink tests: pgbouncer is not installed and apt-get is not available;" \
        "install PgBouncer (1.18 or newer) so that 'pgbouncer' is on PATH, and retry" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "sqlsink tests: pgbouncer is not installed; install Debian's pgbouncer package" \
        "(as root: apt-get install pgbouncer) and retry" >&2
    exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
lock_wait=(-o DPkg::Lock::Timeout=120)  # another apt at work: wait for it, boundedly
if ! apt-get "${lock_wait[@]}" update -qq >"$log" 2>&1 \
    || ! DEBIAN_FRONTEND=noninteractive apt-get "${lock_wait[@]}" install -y -qq \
        --no-install-recommends pgbouncer >>"$log" 2>&1; then
    echo "sqlsink tests: 'apt-get install pgbouncer' failed:" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
if ! find_pgbouncer; then
    echo "sqlsink tests: the pgbouncer package is installed but no pgbouncer binary was found" >&2
    exit 1
fi
