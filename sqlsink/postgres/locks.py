"""The sink lock and the schema lock: advisory locks, in one place.

Committers, task resolutions and ``sqlsink recover`` of one sink take turns under
the sink's session advisory lock (per database: sinks of the same id in two
databases never meet). Migrations of the commit log take the schema lock, a
transaction-scoped one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
