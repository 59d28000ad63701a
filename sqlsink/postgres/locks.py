"""The sink lock and the schema lock: advisory locks, in one place.

Committers, task resolutions and ``sqlsink recover`` of one sink take turns under
the sink's session advisory lock (per database: sinks of the same id in two
databases never meet). Migrations of the commit log take the schema lock, a
transaction-scoped one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import psycopg

from sqlsink.core.model import LockTake
from sqlsink.errors import TransientError
from sqlsink.postgres import appnames
from sqlsink.postgres.connection import Connection

log = logging.getLogger("sqlsink")

_SCHEMA_KEY = "sqlsink:schema"


def lock_key(sink_id: str | None) -> str:
    """The text the sink's advisory lock is keyed by (``None``: every sink, for recovery)."""
    return f"sqlsink:sink:{sink_id or '*'}"


def lock_ids(conn: Connection, sink_id: str | None) -> tuple[int, int]:
    """(classid, objid) under which ``pg_locks`` lists the sink's advisory lock."""
    row = conn.execute("SELECT hashtextextended(%s, 0)", (lock_key(sink_id),)).fetchone()
    assert row is not None
    key = int(str(row[0])) & 0xFFFFFFFFFFFFFFFF
    return key >> 32, key & 0xFFFFFFFF


def acquire_sink_lock(
    conn: Connection,
    sink_id: str | None,
    timeout_s: float,
    waiting: Callable[[], None] | None = None,
    *,
    end_fenced: bool = True,
) -> LockTake:
    """The one way the sink's session lock is taken: free, at once (one round trip);
    else ``waiting()`` is told, and the lock waited for at most ``timeout_s``. A holder
    that is provably a fenced run's session (docs/DESIGN.md invariant 10: the pid and
    start time it recorded when it took the lock) is ended, and the lock waited for
    once more; not with ``end_fenced=False`` (a dry run ends nobody). Not held at the
    end: the caller refuses (``sink_lock`` raises)."""
    if try_sink_lock(conn, sink_id):
        return LockTake(True)
    if waiting is not None:
        waiting()
    held = _wait(conn, sink_id, timeout_s)
    ended: tuple[int, ...] = ()
    if not held and end_fenced:
        ended = tuple(end_fenced_holders(conn, sink_id))
        held = bool(ended) and _wait(conn, sink_id, timeout_s)
    return LockTake(held, waited=True, ended=ended)


@contextmanager
def sink_lock(conn: Connection, sink_id: str | None, timeout_s: float) -> Iterator[None]:
    """Hold the sink's session lock for the block (``acquire_sink_lock``); a holder that
    is not provably a fenced run's gets a TransientError that names it and the fix."""
    if not acquire_sink_lock(conn, sink_id, timeout_s).held:
        raise lock_wait_error(conn, sink_id, timeout_s)
    try:
        yield
    finally:
        unlock_sink(conn, sink_id)


def try_sink_lock(conn: Connection, sink_id: str | None) -> bool:
    """Take the sink's session lock if it is free (it stacks with ``sink_lock``); a
    fresh take clears the stale records of this session (``_take``)."""
    return _take(conn, sink_id, wait=False)


def _wait(conn: Connection, sink_id: str | None, timeout_s: float) -> bool:
    """The bounded wait for a held lock: three round trips (its own ``lock_timeout``,
    set and restored)."""
    row = conn.execute(
        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, false)",
        (f"{max(int(timeout_s * 1000), 1)}ms",),
    ).fetchone()
    before = str(row[0]) if row else "0"
    try:
        return _take(conn, sink_id, wait=True)
    except psycopg.errors.LockNotAvailable:
        return False
    finally:
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (before,))


# One statement: the take of the sink lock, and, when this session did not hold it already
# (a fresh take, not a stacked one), the clearing of the runs' records that name this
# session as its holder. Such a record is stale: a record names a session only while it
# holds the lock for that run, and this one let the lock go since, without its unlock
# (PgBouncer's DISCARD ALL after its client died: the server session stays in the pool,
# same pid and backend start, its lock gone, the record kept; docs/DESIGN.md invariant
# 10). ``before`` (a CTE with volatile functions: evaluated once, before its reader)
# reads the records, and pg_locks only when one names this session; the take reads its
# key from ``before``'s row, so it runs after that check; the records are locked only
# after the take (a LATERAL subquery of ``taken``'s row), so no row lock is held while
# the take waits. As in the unlock: ``set_config(..., true)`` lasts to the end of the
# statement's own implicit transaction, whose commit (one only when a record was
# cleared) then does not wait for its WAL flush, and a runs row another transaction
# holds at that moment is skipped, never waited for (a lock_timeout error after the take
# would leave the lock held by a statement that failed).
_TAKE_AND_CLEAR = """WITH before AS MATERIALIZED (
    SELECT hashtextextended(%(key)s, 0) AS key,
           set_config('synchronous_commit', 'off', true) AS sync,
           CASE WHEN EXISTS (SELECT FROM sqlsink.runs
                             WHERE sink_id = %(sink)s AND lock_pid = pg_backend_pid())
                THEN NOT EXISTS (
                    SELECT FROM pg_locks l
                    WHERE l.pid = pg_backend_pid() AND l.granted
                      AND l.locktype = 'advisory' AND l.objsubid = 1
                      AND l.database = (SELECT oid FROM pg_database
                                        WHERE datname = current_database())
                      AND (l.classid::bigint << 32) | l.objid::bigint
                          = hashtextextended(%(key)s, 0))
                ELSE false END AS stale
), taken AS MATERIALIZED (
    SELECT b.stale, {ok} AS ok FROM before b, LATERAL {take}(b.key) AS t(r)
), cleared AS (
    UPDATE sqlsink.runs r SET lock_pid = NULL, lock_backend_start = NULL
    FROM taken t,
         LATERAL (SELECT sink_id, run_id FROM sqlsink.runs
                  WHERE t.ok AND t.stale AND sink_id = %(sink)s
                    AND lock_pid = pg_backend_pid()
                  FOR NO KEY UPDATE SKIP LOCKED) AS mine
    WHERE r.sink_id = mine.sink_id AND r.run_id = mine.run_id
    RETURNING 1
)
SELECT ok FROM taken
"""
_TRY_AND_CLEAR = _TAKE_AND_CLEAR.format(take="pg_try_advisory_lock", ok="t.r")
_WAIT_AND_CLEAR = _TAKE_AND_CLEAR.format(take="pg_advisory_lock", ok="true")


def _take(conn: Connection, sink_id: str | None, *, wait: bool) -> bool:
    """The sink lock, in one statement that also clears the stale records of this session
    as its holder (``_TAKE_AND_CLEAR``); ``wait``: under the session's lock_timeout."""
    key = lock_key(sink_id)
    if sink_id is not None:
        try:
            row = conn.execute(
                _WAIT_AND_CLEAR if wait else _TRY_AND_CLEAR, {"sink": sink_id, "key": key}
            ).fetchone()
            return bool(row and row[0])
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
            # no commit log, or one older than version 3, records no holder: the
            # statement failed in parse analysis, before any of it ran
            pass
    if wait:
        conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
        return True
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()
    return bool(row and row[0])


_HOLDERS = (
    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.pid <> pg_backend_pid()"
)


def end_fenced_holders(conn: Connection, sink_id: str | None) -> list[int]:
    """End the sessions holding the sink lock that provably belong to fenced runs now.

    A run records the session that holds the sink lock for it (pid and start time,
    ``register_run`` under the lock), and the record is cleared when that session lets
    the lock go (``unlock_sink``): so a session a superseded run still records has held
    the lock since it took it for that run. Sessions are kept between uses
    (postgres/sessions.py), and the new run's commit may hold the lock on the very
    session the fenced run used; a session that a run not superseded records is that
    run's, whatever a superseded one recorded (a record the unlock could not clear). A
    fresh take of the lock clears the records of the taking session too (a session
    PgBouncer reset and kept, its lock gone without the unlock: ``_TAKE_AND_CLEAR``);
    a record either step skipped still never gets a session of the CLI ended (its name,
    ``appnames.cli``): no command of it registers a run, so no run's record of one is
    current. Neither pg_locks nor pg_stat_activity tells when a hold began, so a record
    cannot be checked against the hold itself."""
    if sink_id is None:
        return []
    classid, objid = lock_ids(conn, sink_id)
    rows = conn.execute(
        "SELECT a.pid, r.run_id, pg_terminate_backend(a.pid, 5000) "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "JOIN sqlsink.runs r ON r.sink_id = %s AND r.superseded_at IS NOT NULL "
        "     AND r.lock_pid = a.pid AND r.lock_backend_start = a.backend_start "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.pid <> pg_backend_pid() "
        "AND a.application_name NOT LIKE %s "
        "AND NOT EXISTS (SELECT FROM sqlsink.runs o WHERE o.sink_id = r.sink_id "
        "                AND o.superseded_at IS NULL AND o.lock_pid = a.pid "
        "                AND o.lock_backend_start = a.backend_start)",
        (sink_id, classid, objid, appnames.cli("%")),
    ).fetchall()
    for pid, run_id, _ in rows:
        log.warning(
            "sqlsink %s: ended session pid %s of run %s, which was superseded by a newer run "
            "but still held the sink lock (a paused or cut-off driver)",
            sink_id,
            pid,
            run_id,
        )
    return [int(pid) for pid, _, _ in rows]


def sink_lock_holders(conn: Connection, sink_id: str | None) -> list[Holder]:
    classid, objid = lock_ids(conn, sink_id)
    rows = conn.execute(
        f"SELECT a.pid, a.application_name, a.state, a.state_change {_HOLDERS} ORDER BY a.pid",
        (classid, objid),
    ).fetchall()
    return [
        Holder(f"the sink lock ({state or 'unknown state'})", "advisory", pid, None, app, since)
        for pid, app, state, since in rows
    ]


def lock_wait_error(conn: Connection, sink_id: str | None, timeout_s: float) -> TransientError:
    """The sink's own words (its option lockTimeout); the commands tell ``held_by`` with
    their own (their --lock-timeout: sqlsink.cli.output.lock_still_held)."""
    holders = sink_lock_holders(conn, sink_id)
    held_by = describe_holders(holders)
    return TransientError(
        f"sink {sink_id}: waited {timeout_s:g} s for the sink lock, held by "
        f"{held_by}. Committers, task resolutions and sqlsink recover of "
        "one sink take turns under it; a holder this long is stuck (a paused driver, a "
        "half-open connection). If it is, end it: SELECT pg_terminate_backend(pid); or "
        "raise lockTimeout",
        sink_id=sink_id,
        holders=[h.pid for h in holders],
        held_by=held_by,
    )


# One statement: the unlock, then the clearing of the runs' records of this session as the
# sink lock's holder, unless it still holds the lock (taken twice: ``try_sink_lock``
# stacks). The order is a data dependency: ``released`` (a CTE with a volatile function,
# so never folded into its readers: evaluated once) is read by the statement's own
# SELECT, so the unlock runs once even when no record names this session; the pg_locks
# check is a subquery correlated to released's row (a SubPlan in held's target list,
# never turned into a join), so it cannot run before that row, the unlock's result,
# exists. ``set_config(..., true)`` is SET LOCAL: it lasts to the end of the statement's
# own implicit transaction, whose commit (one only when a record was cleared: no row
# written, no transaction id, nothing to flush) then does not wait for its WAL flush.
# Rows another transaction has locked (a registration, at that very moment) are skipped,
# never waited for; the record is a hint for ``end_fenced_holders``, which does not rely
# on it alone.
_UNLOCK_AND_CLEAR = """WITH released AS (
    SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0)) AS ok,
           set_config('synchronous_commit', 'off', true) AS sync
), held AS (
    SELECT EXISTS (SELECT FROM pg_locks l
                   WHERE u.ok IS NOT NULL AND l.pid = pg_backend_pid() AND l.granted
                     AND l.locktype = 'advisory' AND l.objsubid = 1
                     AND l.database = (SELECT oid FROM pg_database
                                       WHERE datname = current_database())
                     AND (l.classid::bigint << 32) | l.objid::bigint
                         = hashtextextended(%(key)s, 0)) AS still
    FROM released u
), cleared AS (
    UPDATE sqlsink.runs r SET lock_pid = NULL, lock_backend_start = NULL
    FROM (SELECT sink_id, run_id FROM sqlsink.runs
          WHERE sink_id = %(sink)s AND lock_pid = pg_backend_pid()
          FOR NO KEY UPDATE SKIP LOCKED) AS mine, held h
    WHERE r.sink_id = mine.sink_id AND r.run_id = mine.run_id AND NOT h.still
    RETURNING 1
)
SELECT ok FROM released
"""


def unlock_sink(conn: Connection, sink_id: str | None) -> None:
    """Let the sink lock go (once), and clear the records that name this session as its
    holder: a kept session (postgres/sessions.py) is used by another run next, and only a
    session that holds the lock for a fenced run may be ended as that run's
    (``end_fenced_holders``). One statement (``_UNLOCK_AND_CLEAR``); the clearing does
    not wait for its WAL flush (a crash ends every session, and a record of a gone
    session matches none)."""
    if conn.closed:
        return
    key = lock_key(sink_id)
    if sink_id is not None:
        try:
            conn.execute(_UNLOCK_AND_CLEAR, {"sink": sink_id, "key": key})
            return
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
            # a commit log older than version 3 records no holder: the statement failed
            # in parse analysis, before any of it ran, so the lock is still held once more
            pass
    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def take_schema_lock(conn: Connection) -> None:
    """Inside a transaction: migrations of the commit log run one at a time."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_SCHEMA_KEY,))


@dataclass(frozen=True)
class Holder:
    """A session or a prepared transaction holding a lock on a relation."""

    relation: str
    mode: str
    pid: int | None  # None: a prepared transaction (``gid``)
    gid: str | None
    application_name: str | None
    since: datetime | None  # the session's transaction start, or the PREPARE time

    def describe(self) -> str:
        if self.gid is not None:
            return f"prepared transaction {self.gid} ({self.mode} on {self.relation})"
        name = f" {self.application_name!r}" if self.application_name else ""
        since = f", in a transaction since {self.since:%Y-%m-%d %H:%M:%S%z}" if self.since else ""
        return f"session pid {self.pid}{name} ({self.mode} on {self.relation}{since})"


def relation_lock_holders(conn: Connection, relations: Collection[str]) -> list[Holder]:
    """Who holds granted locks on these relations (by regclass text), besides us."""
    rows = conn.execute(
        "SELECT l.relation::regclass::text, l.mode, l.pid, p.gid, a.application_name, "
        "       coalesce(a.xact_start, p.prepared) "
        "FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
        # a prepared transaction has no pid; its own transactionid lock, under the same
        # virtualtransaction, names its xid
        "LEFT JOIN pg_locks x ON l.pid IS NULL AND x.locktype = 'transactionid' "
        "     AND x.virtualtransaction = l.virtualtransaction "
        "LEFT JOIN pg_prepared_xacts p ON p.transaction = x.transactionid "
        "WHERE l.granted AND l.locktype = 'relation' "
        "  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "  AND l.relation = ANY(%s::regclass[]) AND l.pid IS DISTINCT FROM pg_backend_pid() "
        "ORDER BY 1, l.pid NULLS LAST, p.gid",
        (list(relations),),
    ).fetchall()
    return [Holder(str(r), str(m), pid, gid, app, since) for r, m, pid, gid, app, since in rows]


def describe_holders(holders: Sequence[Holder], limit: int = 5) -> str:
    shown = "; ".join(h.describe() for h in holders[:limit])
    more = f" and {len(holders) - limit} more" if len(holders) > limit else ""
    return (shown + more) or "nobody any more (the lock was released meanwhile)"
