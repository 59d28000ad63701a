#!/usr/bin/env bash
# Spark needs a Java 17+ runtime. Install Debian's when none is there (needs root).
set -euo pipefail
if java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "sqlsink: Spark needs Java 17 or newer; install a JDK/JRE 17+ and retry" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
