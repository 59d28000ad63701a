"""Who is connected: sqlsink's sessions, a sink's, and those holding its lock."""

from __future__ import annotations

from collections.abc import Collection

from sqlsink.core.admin import Session
from sqlsink.postgres import appnames
from sqlsink.postgres.commit_log import like_prefix
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.locks import lock_ids

_SESSION_COLUMNS = (
    "a.pid, a.application_name, a.usename::text, host(a.client_addr), a.state, "
    "a.backend_start, a.xact_start"
)


def _session(row: tuple[object, ...]) -> Session:
    pid, app, user, client, state, started, xact = row
    return Session(
        int(str(pid)),
        str(app or ""),
        None if user is None else str(user),
        None if client is None else str(client),
        None if state is None else str(state),
        started,  # type: ignore[arg-type]
        xact,  # type: ignore[arg-type]
    )


def sqlsink_sessions(conn: Connection) -> list[Session]:
    """Other sessions of this database whose application_name is one of sqlsink's."""
    rows = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM pg_stat_activity a "
        "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
        "AND a.application_name LIKE %s ORDER BY a.pid",
        (like_prefix(appnames.PREFIX),),
    ).fetchall()
    return [_session(r) for r in rows]


def sink_sessions(sessions: Collection[Session], sink_id: str) -> list[Session]:
    """The sink's connected partition tasks and committer: evidence that it runs, never
    proof that it does not (between a batch's PREPAREs and its commit nothing of it may
    be connected; liveness is the runs registry's)."""
    return [s for s in sessions if appnames.of_sink(s.application_name, sink_id)]


def lock_holders(conn: Connection, sink_id: str) -> list[Session]:
    """Other sessions holding the sink's advisory lock (the committer while it commits)."""
    classid, objid = lock_ids(conn, sink_id)
    rows = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.pid <> pg_backend_pid() "
        "ORDER BY a.pid",
        (classid, objid),
    ).fetchall()
    return [_session(r) for r in rows]
