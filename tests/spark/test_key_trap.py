"""The interleaved-key trap (issue 16): partitions that append interleaved ranges of an
increasing key queue on one index page. The foreachBatch writer range-partitions by the
key by default; both entry points warn once, with the fix, when a batch fell into it."""

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
from tests.spark.streams import SCHEMA, table_ids, write_source

pytestmark = pytest.mark.spark
ADVICE = "partitions appended interleaved ranges of the key 'id' above the table's highest key"


def keyed_table(url: str, table: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, payload text, ts timestamptz, "
                "amount float8)"
            ).format(sql.Identifier(table))
        )


def ranges_by_transaction(url: str, table: str) -> list[tuple[int, int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT min(id), max(id), count(*) FROM {} GROUP BY xmin::text ORDER BY 1"
            ).format(sql.Identifier(table))
        ).fetchall()
    return [(int(a), int(b), int(c)) for a, b, c in rows]


@pytest.mark.parametrize("ranged", [True, False])
def test_the_foreach_batch_writer_ranges_by_the_key_or_warns_once(
    spark: Any,
    tmp_path: Path,
    pg_url: str,
    table: str,
    ranged: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Round-robin partitions (the stream's repartition(2)) interleave the keys; by default
    the writer range-partitions by the primary key first, so each partition's transaction
    writes one range (no two overlap) and nothing is said; range_partition=False keeps
    the round-robin partitions, whose ranges overlap: the warning, once for two batches."""
    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", range_partition=ranged
    )
    write_source(tmp_path / "src", [range(0, 400), range(400, 800)])
    events = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "src"))
    )
    caplog.set_level(logging.WARNING, logger="sqlsink")
    query = (
        events.repartition(2)
        .writeStream.foreachBatch(writer.to(table))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    assert table_ids(pg_url, table) == list(range(800))
    ranges = ranges_by_transaction(pg_url, table)
    assert len(ranges) == 4 and sum(n for _, _, n in ranges) == 800
    first, second = sorted(ranges)[:2]  # batch 0's two partitions
    assert (first[1] < second[0]) is ranged
    said = [r.getMessage() for r in caplog.records if ADVICE in r.getMessage()]
    if ranged:
        assert said == []
    else:
        assert said == [
            f"sqlsink fb-{table[2:]}: batch 0: 2 {ADVICE}, so their inserts all go to the "
            "same index page and queue on its lock (PostgreSQL inserts 2-3x slower). Fix: "
            "partition by range before the sink, df.repartitionByRange(n, 'id') instead of "
            "df.repartition(n) (the foreachBatch writer range-partitions by the key by "
            "default). Shown once per driver"
        ]


def test_the_data_source_warns_once_per_driver(tmp_path: Path, pg_url: str) -> None:
    """format("sqlsink") cannot repartition its input: its commit says it, once per driver
    (three batches, one warning), in the driver's own output."""
    table = f"t_{uuid.uuid4().hex[:10]}"
    keyed_table(pg_url, table)
    write_source(tmp_path / "src", [range(0, 300), range(300, 600), range(600, 900)])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("SQLSINK_FAULTS_FILE", None)
    args = [str(tmp_path / "src"), str(tmp_path / "chk"), pg_url, table]
    try:
        run = run_program("-m", "tests.spark.crash_driver", *args, timeout=420, env=env)
        assert table_ids(pg_url, table) == list(range(900))
        said = [line for line in run.stderr.splitlines() if ADVICE in line]
        assert len(said) == 1, run.stderr[-4000:]
        assert "df.repartitionByRange(n, 'id') instead of df.repartition(n)" in said[0]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
