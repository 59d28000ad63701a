#!/usr/bin/env bash
# The metrics tests (tests/pg/test_metrics_prometheus.py) run a real Prometheus server
# that scrapes `sqlsink metrics`, and check the alert rules with promtool. Install
# Debian's prometheus package (it ships both) when either binary is missing (needs
# root). Idempotent and quiet (silent on success). The tests start their own prometheus
# process on a free port with a temporary storage directory; the package's system
# service is not used: when this script installs the package on a systemd host, it
# stops and disables the service the package started (on :9090).
set -euo pipefail

have_both() {
    command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1
}

if have_both; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "sqlsink tests: prometheus/promtool are not installed and apt-get is not available;" \
        "install Prometheus 2.x so that 'prometheus' and 'promtool' are on PATH, and retry" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "sqlsink tests: prometheus is not installed; install Debian's prometheus package" \
        "(as root: apt-get install --no-install-recommends prometheus) and retry" >&2
    exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
lock_wait=(-o DPkg::Lock::Timeout=120)  # another apt at work: wait for it, boundedly
if ! apt-get "${lock_wait[@]}" update -qq >"$log" 2>&1 \
    || ! DEBIAN_FRONTEND=noninteractive apt-get "${lock_wait[@]}" install -y -qq \
        --no-install-recommends prometheus >>"$log" 2>&1; then
    echo "sqlsink tests: 'apt-get install prometheus' failed:" >&2
    tail -n 20 "$log" >&2
    exit 1
fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
if ! have_both; then
    echo "sqlsink tests: the prometheus package is installed but prometheus or promtool" \
        "is not on PATH" >&2
    exit 1
fi
