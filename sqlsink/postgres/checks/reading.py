"""Reading the settings: effective values, where they come from, what is stored."""

from __future__ import annotations

import psycopg

from sqlsink.postgres.checks.model import SETTINGS, ServerSettings, Setting
from sqlsink.postgres.connection import Connection

# pg_db_role_setting (setdatabase, setrole) != 0 -> the pg_settings.source it produces
_DB_ROLE_SOURCES = {
    (True, True): "database user",
    (False, True): "user",
    (True, False): "database",
    (False, False): "global",
}


def read_settings(conn: Connection) -> ServerSettings:
    """The effective settings of this session's role and database, with their sources
    (and the two names as SQL, quoted by the server for the fixes)."""
    row = conn.execute(
        "SELECT session_user::text, current_database()::text, current_setting('server_version'), "
        "current_setting('server_version_num')::int, "
        "(SELECT oid FROM pg_roles WHERE rolname = session_user), "
        "(SELECT oid FROM pg_database WHERE datname = current_database()), "
        "(SELECT count(*) FROM pg_prepared_xacts), "
        "(SELECT CASE WHEN count(*) FILTER (WHERE sync_state IS NULL) > 0 THEN NULL "
        "             ELSE count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) END "
        "   FROM pg_stat_replication), "
        "quote_ident(session_user::text), quote_ident(current_database()::text), "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
    ).fetchone()
    assert row is not None
    role, database, version, version_num, role_oid, db_oid, in_use, sync_standbys = row[:8]
    role_ident, database_ident, connections = row[8:]
    rows = conn.execute(
        "SELECT name, current_setting(name), setting, unit, source, sourcefile "
        "FROM pg_settings WHERE name = ANY(%s)",
        (list(SETTINGS),),
    ).fetchall()
    found = {
        str(n): Setting(str(n), str(v), str(s), _opt(u), str(src), _opt(f))
        for n, v, s, u, src, f in rows
    }
    stored: dict[tuple[str, str], str] = {}
    try:
        overrides = conn.execute(
            "SELECT setdatabase <> 0, setrole <> 0, unnest(setconfig) FROM pg_db_role_setting "
            "WHERE setdatabase IN (0, %s) AND setrole IN (0, %s)",
            (db_oid, role_oid),
        ).fetchall()
    except psycopg.errors.InsufficientPrivilege:  # readable by everyone by default
        overrides = []
    for has_db, has_role, item in overrides:
        name, _, value = str(item).partition("=")
        if name in SETTINGS:
            stored[(name, _DB_ROLE_SOURCES[(bool(has_db), bool(has_role))])] = value
    return ServerSettings(
        role=str(role),
        database=str(database),
        server_version_num=int(version_num),
        settings=found,
        stored=stored,
        prepared_in_use=int(in_use),
        connections_in_use=int(connections),
        server_version=str(version),
        sync_standbys=None if sync_standbys is None else int(sync_standbys),
        role_ident=str(role_ident),
        database_ident=str(database_ident),
    )


def _opt(value: object) -> str | None:
    return None if value is None else str(value)
