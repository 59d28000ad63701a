"""Prepared transactions: the cluster's, those still prepared, those lost."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlsink.core.model import PreparedTransaction
from sqlsink.postgres.commit_log import visible_markers
from sqlsink.postgres.connection import Connection


def server_now(conn: Connection) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def all_prepared(conn: Connection) -> list[PreparedTransaction]:
    """Every prepared transaction of the cluster (all databases, every application)."""
    rows = conn.execute(
        "SELECT gid, database, owner, prepared FROM pg_prepared_xacts ORDER BY prepared, gid"
    ).fetchall()
    return [PreparedTransaction(str(g), str(d), str(o), p) for g, d, o, p in rows]


def still_prepared(conn: Connection, gids: Collection[str]) -> set[str]:
    if not gids:
        return set()
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE gid = ANY(%s) AND database = current_database()",
        (list(gids),),
    ).fetchall()
    return {str(r[0]) for r in rows}


def confirm_lost(conn: Connection, candidates: Collection[str]) -> set[str]:
    """Of decided gids seen neither prepared nor with a marker, those still so now.

    Without the sink lock a gid can be prepared and decided between two reads; read
    again, prepared first and markers second: a gid committed in between shows its
    marker, so what remains was rolled back.
    """
    if not candidates:
        return set()
    prepared = still_prepared(conn, candidates)
    rest = set(candidates) - prepared
    rest -= visible_markers(conn, rest)
    if not rest:
        return set()
    # a batch completed meanwhile has had its markers pruned: its gids were committed
    rows = conn.execute(
        "SELECT g FROM sqlsink.decisions d, unnest(d.gids) AS g "
        "WHERE g = ANY(%s) AND d.completed_at IS NOT NULL",
        (list(rest),),
    ).fetchall()
    return rest - {str(r[0]) for r in rows}
