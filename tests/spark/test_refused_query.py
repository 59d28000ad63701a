"""A second query on a sink another query owns, started in the same Spark driver (a
notebook; every client of one Spark Connect server): it is refused, and its abort
leaves the owner's in-flight batch alone (docs/DESIGN.md invariant 10, aborts)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.gid import Gid
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import (
    add_source_file,
    decided_batches,
    keyed_table,
    run_query,
    start_query,
    table_ids,
    write_source,
)

pytestmark = pytest.mark.spark


def prepared_batches(url: str, sink_id: str) -> list[int]:
    """The batch of each prepared transaction of the sink."""
    with psycopg.connect(url, autocommit=True) as conn:
        gids = [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts")]
    return sorted(g.batch_id for g in map(Gid.parse, gids) if g and g.sink_id == sink_id)


def aborted_batches(url: str, sink_id: str) -> list[int | None]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT aborted_batch FROM sqlsink.runs WHERE sink_id = %s ORDER BY first_seen",
            (sink_id,),
        ).fetchall()
    return [None if r[0] is None else int(r[0]) for r in rows]


def waiting_sink_sessions(url: str) -> int:
    """Sessions of the sink waiting for a lock (a task's COPY behind a row lock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND application_name LIKE 'sqlsink%%'"
        ).fetchone()
    return int(row[0]) if row else 0


def wait_for(what: str, check: Any, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_refused_query_in_the_same_driver_leaves_the_owners_batch_alone(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """Query A owns sink S and has batch 1 in flight: one partition prepared, the other
    still writing (its COPY waits for a row this test holds). Query B, another
    checkpoint with the same sinkId, starts in the same driver at its batch 2: its
    tasks are refused, and Spark aborts B's batch with no message at all. The abort
    found "its" run by the driver token, which every query of one driver shared: A's.
    It marked A's run aborted at batch 2 and rolled back A's prepared partition, so A
    failed. Now the token names the driver and the query, and the abort reads its
    query id from its checkpoint: B has no run, so it touches nothing."""
    sink_id = f"owned-{table[2:]}"
    other = f"{table}_b"
    opts = {"url": pg_url, "createTable": "true"}
    # B's history: two batches into a sink of its own, so that its next batch is 2
    src_b, chk_b = tmp_path / "src-b", tmp_path / "chk-b"
    write_source(src_b, [range(1000, 1005), range(1005, 1010)])
    run_query(spark, src_b, chk_b, {**opts, "table": other, "sinkId": f"{sink_id}-b"})
    keyed_table(pg_url, table)
    owner = None
    holder = psycopg.connect(pg_url)  # holds row 20 of A's batch 1, uncommitted
    try:
        holder.execute(sql.SQL("INSERT INTO {} (id) VALUES (20)").format(sql.Identifier(table)))
        src_a, chk_a = tmp_path / "src-a", tmp_path / "chk-a"
        write_source(src_a, [range(0, 20), range(20, 40)])
        owner = start_query(spark, src_a, chk_a, {**opts, "table": table, "sinkId": sink_id})
        wait_for(
            "A's batch 1: one partition prepared, one waiting",
            lambda: prepared_batches(pg_url, sink_id) == [1] and waiting_sink_sessions(pg_url),
        )
        assert decided_batches(pg_url, sink_id) == {0: True}
        # B on A's sink id, same driver: refused; Spark aborts its batch 2
        add_source_file(src_b, 2, range(1010, 1015))
        refused = start_query(spark, src_b, chk_b, {**opts, "table": table, "sinkId": sink_id})
        with pytest.raises(Exception, match="is bound to streaming query") as error:
            refused.awaitTermination()
        assert "give this one its own sinkId" in str(error.value)
        # A's batch 1 as it was: a partition prepared, undecided, its run not over
        assert waiting_sink_sessions(pg_url) == 1
        assert prepared_batches(pg_url, sink_id) == [1]
        assert decided_batches(pg_url, sink_id) == {0: True}
        assert aborted_batches(pg_url, sink_id) == [None]
        holder.rollback()  # A's other partition goes on: batch 1 commits
        owner.awaitTermination()
        assert owner.exception() is None
        assert table_ids(pg_url, table) == list(range(40))
        assert decided_batches(pg_url, sink_id) == {0: True, 1: True}
        assert aborted_batches(pg_url, sink_id) == [None]
        assert prepared_transactions(pg_server.admin_url) == []
    finally:
        holder.close()
        if owner is not None and owner.isActive:
            owner.stop()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(other)))
