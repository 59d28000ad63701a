#!/usr/bin/env bash
# The benchmarks compare sqlsink with Spark's JDBC writer, which needs the databases' JDBC
# drivers: PostgreSQL's at /usr/share/java/postgresql.jar (libpostgresql-jdbc-java) and
# MariaDB's Connector/J at /usr/share/java/mariadb-java-client.jar (libmariadb-java).
# Install Debian's packages when a jar is missing (needs root).
set -euo pipefail
declare -A PACKAGE=(
    [/usr/share/java/postgresql.jar]=libpostgresql-jdbc-java
    [/usr/share/java/mariadb-java-client.jar]=libmariadb-java
)
missing=()
for jar in "${!PACKAGE[@]}"; do
    [ -f "$jar" ] || missing+=("$jar")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
packages=()
for jar in "${missing[@]}"; do
    packages+=("${PACKAGE[$jar]}")
done
if [ "$(id -u)" -ne 0 ]; then
    echo "sqlsink bench: ${missing[*]} missing; install ${packages[*]} (as root) and retry" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >/dev/null
for jar in "${missing[@]}"; do
    if [ ! -f "$jar" ]; then
        echo "sqlsink bench: ${PACKAGE[$jar]} installed but $jar is still missing" >&2
        exit 1
    fi
done
