"""The ``sqlsink`` schema: versioned DDL from ``sql/``, applied in order, once."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.locks import take_schema_lock

_MIGRATION = re.compile(r"(\d{3})_[a-z0-9_]+\.sql")


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


def ensure_schema(conn: Connection) -> int:
    """Install or migrate the schema; return its version. Cheap when up to date."""
    try:
        if installed_version(conn) >= latest_version():
            return latest_version()
    except psycopg.errors.InsufficientPrivilege as exc:
        raise privilege_error(conn, exc) from None
    try:
        with conn.transaction():
            take_schema_lock(conn)
            current = installed_version(conn)
            for version, path in migrations():
                if version > current:
                    conn.execute(path.read_text(encoding="utf-8").encode())
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(
            "cannot create the sqlsink schema (the commit log): "
            f"{exc.diag.message_primary}. Run sql/setup_role.sql as a superuser or grant "
            "this role CREATE on the database (GRANT CREATE ON DATABASE <db> TO <role>)",
        ) from None
    return latest_version()


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
