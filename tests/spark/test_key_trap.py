"""The key-order trap (issue 16): repartition(n) hands each partition its rows in random
key order, which costs PostgreSQL 2-3x the CPU to insert (benchmarks/trap.py). The
foreachBatch writer sorts each partition by the key by default; both entry points warn
once, with the fix, when a batch's partitions wrote their keys out of order."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import sqlsink
from tests.programs import run_program
from tests.spark.streams import keyed_table, run_foreach_batch, table_ids, write_source

pytestmark = pytest.mark.spark
ADVICE = "partition(s) wrote their rows in random order of the key 'id'"


def order_by_transaction(url: str, table: str) -> list[list[list[int]]]:
    """Each transaction's ids in the order they were inserted, page by page. Within a heap
    page, line pointers follow insertion order; across pages they need not: two sessions
    inserting at once extend the table and take each other's spare pages through the free
    space map, so one transaction's later rows can land on a lower page (seen in a
    clean-clone run: ctid order alone is not insertion order)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT xmin::text, (ctid::text::point)[0]::bigint, id FROM {} ORDER BY ctid"
            ).format(sql.Identifier(table))
        ).fetchall()
    by_xid: dict[str, dict[int, list[int]]] = {}
    for xid, page, key in rows:
        by_xid.setdefault(str(xid), {}).setdefault(int(page), []).append(int(key))
    return [list(pages.values()) for pages in by_xid.values()]


@pytest.mark.parametrize("ordered", [True, False])
def test_the_foreach_batch_writer_sorts_by_the_key_or_warns_once(
    spark: Any,
    tmp_path: Path,
    pg_url: str,
    table: str,
    ordered: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Round-robin partitions (the stream's repartition(2)) come in random key order; by
    default the writer sorts each partition by the primary key, so each transaction
    inserts its ids in ascending order and nothing is said; order_by_key=False writes
    them as they come: out of order, and the warning, once for two batches."""
    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}", order_by_key=ordered)
    write_source(tmp_path / "src", [range(0, 3000), range(3000, 6000)])
    caplog.set_level(logging.WARNING, logger="sqlsink")
    run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", writer.to(table), partitions=2)
    assert table_ids(pg_url, table) == list(range(6000))
    transactions = order_by_transaction(pg_url, table)
    assert len(transactions) == 4
    assert sum(len(ids) for pages in transactions for ids in pages) == 6000
    # 1,500 rows a transaction, up to about 60 a page; 10 random keys come sorted once in
    # 3.6 million, so a page of 10 or more tells (one of fewer, at a page's end, does not)
    in_order = [ids == sorted(ids) for pages in transactions for ids in pages if len(ids) >= 10]
    assert len(in_order) >= 20
    assert all(in_order) if ordered else not any(in_order)
    said = [r.getMessage() for r in caplog.records if ADVICE in r.getMessage()]
    if ordered:
        assert said == []
    else:
        (message,) = said
        assert message.startswith(f"sqlsink fb-{table[2:]}: batch 0: 2 {ADVICE} (")
        assert message.endswith(
            "of consecutive rows go down), so PostgreSQL inserts each at a random place of "
            "the key's index, which costs it 2-3x the CPU of rows in key order. Fix: "
            "df.sortWithinPartitions('id') before the sink (no shuffle), or "
            "df.repartitionByRange(n, 'id') (the foreachBatch writer sorts by the key by "
            "default). Shown once per driver"
        )


def test_the_data_source_warns_once_per_driver(tmp_path: Path, pg_url: str) -> None:
    """format("sqlsink") cannot repartition its input: its commit says it, once per driver
    (three batches, one warning), in the driver's own output."""
    table = f"t_{uuid.uuid4().hex[:10]}"
    keyed_table(pg_url, table)
    write_source(tmp_path / "src", [range(0, 3000), range(3000, 6000), range(6000, 9000)])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("SQLSINK_FAULTS_FILE", None)
    args = [str(tmp_path / "src"), str(tmp_path / "chk"), pg_url, table]
    try:
        run = run_program("-m", "tests.spark.crash_driver", *args, timeout=420, env=env)
        assert table_ids(pg_url, table) == list(range(9000))
        said = [line for line in run.stderr.splitlines() if ADVICE in line]
        assert len(said) == 1, run.stderr[-4000:]
        assert "Fix: df.sortWithinPartitions('id') before the sink (no shuffle)" in said[0]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
