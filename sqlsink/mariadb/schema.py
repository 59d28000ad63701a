"""The commit log's database on MariaDB: created and migrated at first use.

The DDL is ``sqlsink/mariadb/sql/NNN_*.sql``, applied in order from the first version
``schema_version`` lacks, statement by statement (MariaDB's DDL commits each one, so
every statement is written to be run again: a crash half-way leaves a version that the
next use completes), under the server-wide named lock ``sqlsink:schema``: one migrator
at a time, waited for at most ``timeout_s``."""

from __future__ import annotations

from importlib import resources

from sqlsink.errors import ConfigError, TransientError
from sqlsink.mariadb.connection import LOG_DATABASE, Connection, errno, execute, rows

SCHEMA_LOCK = "sqlsink:schema"
_ER_NO_SUCH_TABLE = 1146
_ER_BINLOG_CREATE_ROUTINE_NEED_SUPER = 1419


def migrations() -> list[tuple[int, str]]:
    files = resources.files("sqlsink.mariadb").joinpath("sql")
    found = []
    for entry in files.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            found.append((int(name[:3]), entry.read_text(encoding="utf-8")))
    return sorted(found)


def statements(text: str) -> list[str]:
    """The statements of a DDL file (each ends at a line ``-- ;``), comments dropped."""
    out = []
    for chunk in text.split("\n-- ;\n"):
        lines = [ln for ln in chunk.splitlines() if not ln.lstrip().startswith("--")]
        statement = "\n".join(lines).strip()
        if statement:
            out.append(statement)
    return out


def version(conn: Connection, database: str = LOG_DATABASE) -> int | None:
    try:
        found = rows(conn, f"SELECT max(version) FROM `{database}`.schema_version")
    except Exception as exc:
        if errno(exc) == _ER_NO_SUCH_TABLE or errno(exc) == 1049:  # no table, no database
            return None
        raise
    return None if not found or found[0][0] is None else int(found[0][0])


def ensure_schema(conn: Connection, database: str = LOG_DATABASE, timeout_s: float = 30) -> int:
    """The commit log at the newest version; the version. Leaves the session's default
    database as it found it."""
    wanted = migrations()
    newest = wanted[-1][0]
    if version(conn, database) == newest:
        return newest
    got = rows(conn, "SELECT GET_LOCK(%s, %s)", (SCHEMA_LOCK, timeout_s))
    if not got or got[0][0] != 1:
        raise TransientError(
            f"waited {timeout_s:.0f} s for the named lock {SCHEMA_LOCK!r} to migrate the "
            f"commit log (database {database!r}): another sqlsink session is migrating it, "
            "or hangs holding it; see SELECT IS_USED_LOCK('sqlsink:schema') and end that "
            "connection (KILL) if it is stuck"
        )
    before = rows(conn, "SELECT DATABASE()")[0][0]
    try:
        try:
            execute(conn, f"CREATE DATABASE IF NOT EXISTS `{database}`")
        except Exception as exc:
            if errno(exc) not in (1044, 1227):  # no right to create it: it must exist
                raise
        execute(conn, f"USE `{database}`")
        current = version(conn, database) or 0
        for number, text in wanted:
            if number <= current:
                continue
            for statement in statements(text):
                try:
                    execute(conn, statement)
                except Exception as exc:
                    if errno(exc) == _ER_BINLOG_CREATE_ROUTINE_NEED_SUPER:
                        raise ConfigError(
                            f"migrating the commit log (database {database!r}) to version "
                            f"{number} needs to create its triggers, and with the binary log "
                            "on MariaDB lets a user without SUPER do that only when "
                            "log_bin_trust_function_creators is ON. Fix: SET GLOBAL "
                            "log_bin_trust_function_creators = ON (and in the server's "
                            "configuration), or connect once as an administrator so that the "
                            "commit log is created"
                        ) from None
                    raise ConfigError(
                        f"migrating the commit log (database {database!r}) to version "
                        f"{number} failed at: {statement.splitlines()[0]}: {exc}. Grant the "
                        f"sink's role ALL on `{database}`.* (it creates its tables and "
                        "triggers there), then run again"
                    ) from None
        return newest
    finally:
        if before:
            execute(conn, f"USE `{before}`")
        rows(conn, "SELECT RELEASE_LOCK(%s)", (SCHEMA_LOCK,))
