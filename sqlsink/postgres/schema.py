"""The ``sqlsink`` schema: versioned DDL from ``sql/``, applied in order, once."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import psycopg
from psycopg import sql

from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.locks import describe_holders, relation_lock_holders, take_schema_lock

log = logging.getLogger("sqlsink")

_MIGRATION = re.compile(r"(\d{3})_[a-z0-9_]+\.sql")
# a migration that must lock a table which prepared partition transactions hold says so
# on a line of its own ("-- lock: sqlsink.markers"): it is applied only when that lock is
# free at once, else deferred (see ensure_schema)
_LOCKS = re.compile(r"^-- lock: (sqlsink\.[a-z_]+)\s*$", re.MULTILINE)


def sql_dir() -> Path:
    """The DDL folder: inside the installed package, or the checkout's top-level ``sql/``."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "sql", here.parent / "sql"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"sqlsink's DDL folder is missing (looked beside {here})")


def migrations() -> list[tuple[int, Path]]:
    found = [
        (int(m.group(1)), p) for p in sql_dir().iterdir() if (m := _MIGRATION.fullmatch(p.name))
    ]
    return sorted(found)


def latest_version() -> int:
    return migrations()[-1][0]


def installed_version(conn: Connection) -> int:
    """0 when the schema is not installed."""
    row = conn.execute("SELECT to_regclass('sqlsink.schema_version') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    version = conn.execute(
        "SELECT coalesce(max(version), 0) FROM sqlsink.schema_version"
    ).fetchone()
    return int(str(version[0])) if version else 0


MIGRATION_LOCK_TIMEOUT_S = 15.0
_COMMIT_LOG = (
    "sqlsink.sinks",
    "sqlsink.decisions",
    "sqlsink.markers",
    "sqlsink.runs",
    "sqlsink.schema_version",
)


def ensure_schema(conn: Connection) -> int:
    """Install or migrate the schema; return the version now installed. Cheap when up
    to date.

    A migration waits for its locks at most ``MIGRATION_LOCK_TIMEOUT_S``: behind a
    long transaction on the commit log it gives up, names the holder and changes
    nothing (docs/DESIGN.md invariant 11). ``markers`` is never waited for: prepared
    leftovers hold it until they are resolved, and resolving them needs the sink to
    run. A migration that must lock it (a ``-- lock: sqlsink.markers`` line) is applied
    only when the lock is free at once; otherwise it and every later one are deferred
    to the next call, and the version returned is below ``latest_version()`` (the sink
    runs on the older version meanwhile: a batch's tasks and commit do not call this
    again, so every statement works at each version an upgrade may stop at, looking up
    what later versions add, e.g. ``run_registry.has_writer_tokens``,
    ``commit_log.has_decision_tables``; ``ensure_schema_version`` waits, bounded, for
    what an option needs).
    """
    try:
        if installed_version(conn) >= latest_version():
            return latest_version()
    except psycopg.errors.InsufficientPrivilege as exc:
        raise privilege_error(conn, exc) from None
    try:
        with conn.transaction():
            timeout = f"{int(MIGRATION_LOCK_TIMEOUT_S * 1000)}ms"
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
            take_schema_lock(conn)
            current = installed_version(conn)
            for version, path in migrations():
                if version <= current:
                    continue
                text = path.read_text(encoding="utf-8")
                if not _lock_at_once(conn, _LOCKS.findall(text)):
                    log.info(
                        "sqlsink: the commit log's upgrade to version %d waits until no "
                        "transaction holds sqlsink.markers (prepared partitions do until "
                        "they are finished); it is tried again at the next batch",
                        version,
                    )
                    break
                conn.execute(text.encode())
                current = version
    except psycopg.errors.LockNotAvailable:
        raise _blocked(conn, latest_version()) from None
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(
            "cannot create the sqlsink schema (the commit log): "
            f"{exc.diag.message_primary}. Run sql/setup_role.sql as a superuser or grant "
            "this role CREATE on the database (GRANT CREATE ON DATABASE <db> TO <role>)",
        ) from None
    return current


def _lock_at_once(conn: Connection, tables: list[str]) -> bool:
    """Take these tables' ACCESS EXCLUSIVE locks if nobody holds them; else take none."""
    if not tables:
        return True
    try:
        with conn.transaction():  # a savepoint: a refusal leaves the migration's transaction
            for table in tables:
                schema, name = table.split(".")
                conn.execute(
                    sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE NOWAIT").format(
                        sql.Identifier(schema, name)
                    )
                )
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def ensure_schema_version(
    conn: Connection, version: int, *, why: str, timeout_s: float = MIGRATION_LOCK_TIMEOUT_S
) -> None:
    """At least ``version`` installed, for a feature that needs it (``why`` names it):
    a deferred migration is tried again every 100 ms (never queued behind the holders,
    so that no partition waits on it) for at most ``timeout_s``, then refused naming
    who holds ``sqlsink.markers`` and the fix."""
    deadline = time.monotonic() + timeout_s
    while True:
        installed = ensure_schema(conn)
        if installed >= version:
            return
        if time.monotonic() >= deadline:
            holders = relation_lock_holders(conn, ["sqlsink.markers"])
            prepared = [h for h in holders if h.gid is not None]
            fix = (
                "finish the prepared transactions: sqlsink recover (a running query's "
                "own are finished by its next batch), then start again"
                if prepared
                else "start again when those transactions have finished"
            )
            raise ConfigError(
                f"{why} needs the commit log at version {version} (it is at {installed}): "
                "the upgrade adds a column to sqlsink.markers, which stayed in use for "
                f"{timeout_s:.0f} s by {describe_holders(holders) if holders else 'others'}. "
                f"Nothing was written. Fix: {fix}",
                version=version,
            )
        time.sleep(0.1)


def _blocked(conn: Connection, version: int) -> ConfigError:
    existing = [
        name
        for name in _COMMIT_LOG
        if (row := conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()) and row[0]
    ]
    holders = describe_holders(relation_lock_holders(conn, existing))
    return ConfigError(
        f"cannot upgrade the commit log (schema sqlsink) to version {version}: its tables "
        f"stayed locked for {MIGRATION_LOCK_TIMEOUT_S:.0f} s by {holders}. Nothing was "
        "changed. Let that transaction finish, or end it (SELECT pg_terminate_backend(pid)); "
        "prepared transactions of a sink are resolved by sqlsink recover. Then start again",
        version=version,
    )


def privilege_error(conn: Connection, exc: psycopg.errors.InsufficientPrivilege) -> ConfigError:
    """A missing privilege of the sink's role, with what to grant."""
    row = conn.execute("SELECT session_user, current_database()").fetchone()
    role, database = (str(row[0]), str(row[1])) if row else ("<role>", "<database>")
    return ConfigError(
        f"role {role} lacks a privilege the sink needs: {exc.diag.message_primary}. The sink's "
        "role must write the target table and own (or use) the sqlsink schema: run "
        f"sql/setup_role.sql for role {role} as a superuser of database {database}, or grant "
        "the missing privilege (e.g. GRANT USAGE ON SCHEMA sqlsink TO ...; GRANT SELECT, "
        "INSERT ON ALL TABLES IN SCHEMA sqlsink TO ...)",
        role=role,
    )
