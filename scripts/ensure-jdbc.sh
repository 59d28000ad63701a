#!/usr/bin/env bash
# The benchmark compares sqlsink with Spark's JDBC writer, which needs PostgreSQL's
# JDBC driver at /usr/share/java/postgresql.jar. Install Debian's when missing (needs root).
set -euo pipefail
JAR=/usr/share/java/postgresql.jar
if [ -f "$JAR" ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "sqlsink bench: $JAR is missing; install libpostgresql-jdbc-java (as root) and retry" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libpostgresql-jdbc-java >/dev/null
if [ ! -f "$JAR" ]; then
    echo "sqlsink bench: libpostgresql-jdbc-java installed but $JAR is still missing" >&2
    exit 1
fi
