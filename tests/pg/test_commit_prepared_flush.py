"""COMMIT PREPARED flushes its commit record to the local WAL whatever
``synchronous_commit`` says (docs/DESIGN.md section 5). Issue 16 asked whether the
sink's commits could skip that flush once the batch's decision is durable (a commit a
crash lost would still be prepared, and recovery would commit it again): PostgreSQL
does not offer it, shown here on a real server, so the sink leaves the setting alone."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql

from tests.fix_pg import PgServer
from tests.pg.protocol import ids_of, make_table

Conn = psycopg.Connection[tuple[Any, ...]]


def _behind(conn: Conn) -> bool:
    """Whether WAL was inserted that is not flushed yet (right after a commit: its own)."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()").fetchone()
    return bool(row and row[0])


def _prepare(url: str, table: str, key: int) -> str:
    gid = f"flush-test-{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute(
            sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table)), (key,)
        )
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    return gid


def _still_prepared(url: str, gids: list[str]) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid = ANY(%s)", (gids,))
        return sorted(str(r[0]) for r in rows)


def test_commit_prepared_flushes_with_synchronous_commit_off(pg_url: str, table: str) -> None:
    """One session with synchronous_commit = off: after each of 20 plain commits the WAL
    flush lags behind its commit record (the WAL writer flushes every 200 ms); after each
    of 20 COMMIT PREPAREDs it does not (a background record landing in between may make
    one or two look behind)."""
    make_table(pg_url, table)
    plain = prepared = 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        for key in range(20):
            insert = sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table))
            conn.execute(insert, (1000 + key,))
            plain += _behind(conn)
            gid = _prepare(pg_url, table, key)  # PREPARE flushes: nothing behind after it
            conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
            prepared += _behind(conn)
    assert plain >= 10, f"only {plain} of 20 plain commits left the flush behind"
    assert prepared <= 2, f"{prepared} of 20 COMMIT PREPAREDs left the flush behind"


def test_commit_prepared_with_synchronous_commit_off_survives_a_crash_at_once(
    own_server: PgServer,
) -> None:
    """Ten prepared transactions committed with synchronous_commit = off, the server
    crashed (stopped -m immediate: WAL buffers not written are lost) right after: each is
    committed after the restart, none is left prepared. Had a commit not been flushed, its
    transaction would be prepared again after the crash (the same ten rows as plain
    INSERTs with synchronous_commit = off, crashed the same way, were lost in each of
    three tries while this test was written)."""
    url, table = own_server.url, f"t_{uuid.uuid4().hex[:10]}"
    make_table(url, table)
    gids = [_prepare(url, table, key) for key in range(10)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        for gid in gids:
            conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
    own_server.crash_and_restart()
    assert _still_prepared(url, gids) == []
    assert ids_of(url, table) == list(range(10))
