"""The sink lock on MariaDB: a named lock (``GET_LOCK``), in one place.

Committers, task resolutions and ``sqlsink recover`` of one sink take turns under it,
as under PostgreSQL's session advisory lock (postgres/locks.py), whose contract this
mirrors: it stacks in its session (MariaDB's named locks are recursive), a take waits
at most its bound, and a holder that is provably a fenced run's session is ended
(``KILL CONNECTION``) and the lock waited for once more. Named locks are server-wide,
not per database: the commit log is too (one ``sqlsink`` database per server).

A lock name is at most 64 characters: ``sqlsink:<sink id>`` when it fits, else
``sqlsink#`` and a digest of the sink id ('#' is in no sink id, so the two never meet).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlsink.core.model import LockTake
from sqlsink.errors import TransientError
from sqlsink.mariadb.connection import Connection, errno, execute, rows

log = logging.getLogger("sqlsink")
_MAX_NAME = 64


def lock_name(sink_id: str | None) -> str:
    name = f"sqlsink:{sink_id or '*'}"
    if len(name) <= _MAX_NAME:
        return name
    return "sqlsink#" + hashlib.sha256(str(sink_id).encode()).hexdigest()[:48]


def _holder(conn: Connection, sink_id: str | None) -> int | None:
    found = rows(conn, "SELECT IS_USED_LOCK(%s)", (lock_name(sink_id),))
    return None if not found or found[0][0] is None else int(found[0][0])


def _take(conn: Connection, db: str, sink_id: str | None, timeout_s: float) -> bool:
    """GET_LOCK; a fresh take (not a stacked one) clears the stale records that name
    this connection as a run's lock holder (a record names a connection only while it
    holds the lock for that run)."""
    fresh = _holder(conn, sink_id) != _me(conn)
    got = rows(conn, "SELECT GET_LOCK(%s, %s)", (lock_name(sink_id), max(timeout_s, 0)))
    ok = bool(got and got[0][0] == 1)
    if ok and fresh and sink_id is not None:
        _clear_records(conn, db, sink_id)
    return ok


def uptime_s(conn: Connection) -> int:
    """Whole seconds since mariadbd started. A run's ``lock_conn`` recorded before then
    (its ``heartbeat_at``, set in the same statement, is older) names a connection of a
    server that is gone: connection ids count again from 1 after a restart, so it may
    name an innocent session now."""
    return int(str(rows(conn, "SHOW GLOBAL STATUS LIKE 'Uptime'")[0][1]))


# a runs row ``r`` whose lock_conn was recorded since the server started
RECORDED_SINCE_START = "r.heartbeat_at >= current_timestamp(6) - INTERVAL %(uptime)s SECOND"


def _me(conn: Connection) -> int:
    return int(rows(conn, "SELECT CONNECTION_ID()")[0][0])


def _clear_records(conn: Connection, db: str, sink_id: str) -> None:
    try:
        execute(
            conn,
            f"UPDATE `{db}`.runs SET lock_conn = NULL "
            "WHERE sink_id = %s AND lock_conn = CONNECTION_ID()",
            (sink_id,),
        )
    except Exception as exc:
        if errno(exc) not in (1146, 1049):  # no commit log yet: nothing recorded
            raise


def try_sink_lock(conn: Connection, db: str, sink_id: str | None) -> bool:
    return _take(conn, db, sink_id, 0)


def acquire_sink_lock(
    conn: Connection,
    db: str,
    sink_id: str | None,
    timeout_s: float,
    waiting: Callable[[], None] | None = None,
    *,
    end_fenced: bool = True,
) -> LockTake:
    """As postgres/locks.py's: free, at once; else ``waiting()`` is told and the lock
    waited for at most ``timeout_s``; a fenced run's holder is ended (not with
    ``end_fenced=False``) and the lock waited for once more."""
    if try_sink_lock(conn, db, sink_id):
        return LockTake(True)
    if waiting is not None:
        waiting()
    held = _take(conn, db, sink_id, timeout_s)
    ended: tuple[int, ...] = ()
    if not held and end_fenced:
        ended = tuple(end_fenced_holders(conn, db, sink_id))
        held = bool(ended) and _take(conn, db, sink_id, timeout_s)
    return LockTake(held, waited=True, ended=ended)


def unlock_sink(conn: Connection, db: str, sink_id: str | None) -> None:
    """Let the lock go once; when this connection holds it no more, clear its records."""
    if not conn.open:
        return
    rows(conn, "SELECT RELEASE_LOCK(%s)", (lock_name(sink_id),))
    if sink_id is not None and _holder(conn, sink_id) != _me(conn):
        _clear_records(conn, db, sink_id)


@contextmanager
def sink_lock(conn: Connection, db: str, sink_id: str | None, timeout_s: float) -> Iterator[None]:
    if not acquire_sink_lock(conn, db, sink_id, timeout_s).held:
        raise lock_wait_error(conn, sink_id, timeout_s)
    try:
        yield
    finally:
        unlock_sink(conn, db, sink_id)


def end_fenced_holders(conn: Connection, db: str, sink_id: str | None) -> list[int]:
    """End the connection holding the sink lock when a superseded run records it as its
    holder and no run that is not superseded does (a kept session may serve a newer run)."""
    if sink_id is None:
        return []
    holder = _holder(conn, sink_id)
    if holder is None or holder == _me(conn):
        return []
    found = rows(
        conn,
        f"SELECT run_id FROM `{db}`.runs r WHERE r.sink_id = %(sink)s "
        "AND r.superseded_at IS NOT NULL AND r.lock_conn = %(conn)s "
        f"AND {RECORDED_SINCE_START} "
        f"AND NOT EXISTS (SELECT 1 FROM `{db}`.runs o WHERE o.sink_id = r.sink_id "
        "                 AND o.superseded_at IS NULL AND o.lock_conn = %(conn)s)",
        {"sink": sink_id, "conn": holder, "uptime": uptime_s(conn)},
    )
    if not found:
        return []
    try:
        execute(conn, f"KILL CONNECTION {int(holder)}")
    except Exception as exc:
        if errno(exc) != 1094:  # no such thread: gone meanwhile
            raise
    log.warning(
        "sqlsink %s: ended connection %s of run %s, which was superseded by a newer run "
        "but still held the sink lock (a paused or cut-off driver)",
        sink_id,
        holder,
        found[0][0],
    )
    return [holder]


def lock_wait_error(conn: Connection, sink_id: str | None, timeout_s: float) -> TransientError:
    """The sink's own words (its option lockTimeout); the commands tell ``held_by`` with
    their own (their --lock-timeout: sqlsink.cli.output.lock_still_held)."""
    holder = _holder(conn, sink_id)
    who = f"connection {holder}" if holder is not None else "nobody any more"
    return TransientError(
        f"sink {sink_id}: waited {timeout_s:g} s for the sink lock (named lock "
        f"{lock_name(sink_id)!r}), held by {who}. Committers, task resolutions and sqlsink "
        "recover of one sink take turns under it; a holder this long is stuck (a paused "
        "driver, a half-open connection). If it is, end it: KILL CONNECTION id; or raise "
        "lockTimeout",
        sink_id=sink_id,
        holders=[] if holder is None else [holder],
        held_by=who,
    )
