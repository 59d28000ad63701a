"""The sink lock and the schema lock: advisory locks, in one place.

Committers, task resolutions and ``sqlsink recover`` of one sink take turns under
the sink's session advisory lock (per database: sinks of the same id in two
databases never meet). Migrations of the commit log take the schema lock, a
transaction-scoped one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import psycopg

from sqlsink.postgres.connection import Connection

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


@contextmanager
def sink_lock(conn: Connection, sink_id: str | None) -> Iterator[None]:
    """Hold the sink's session lock for the block."""
    key = lock_key(sink_id)
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
    try:
        yield
    finally:
        unlock_sink(conn, sink_id)


def try_sink_lock(conn: Connection, sink_id: str | None) -> bool:
    """Take the sink's session lock if it is free (it stacks with ``sink_lock``)."""
    row = conn.execute(
        "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (lock_key(sink_id),)
    ).fetchone()
    return bool(row and row[0])


def wait_sink_lock(conn: Connection, sink_id: str | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the sink's session lock; False if still held by another."""
    conn.execute(
        "SELECT set_config('lock_timeout', %s, false)", (f"{max(int(timeout_s * 1000), 1)}ms",)
    )
    try:
        conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (lock_key(sink_id),))
        return True
    except psycopg.errors.LockNotAvailable:
        return False
    finally:
        conn.execute("SELECT set_config('lock_timeout', '0', false)")


def unlock_sink(conn: Connection, sink_id: str | None) -> None:
    if not conn.closed:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (lock_key(sink_id),))


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
        "LEFT JOIN pg_prepared_xacts p ON l.pid IS NULL "
        "     AND l.virtualtransaction = '-1/' || p.transaction::text "
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
