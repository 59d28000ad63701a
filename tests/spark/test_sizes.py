"""Edge sizes: empty micro-batches, one row, millions of rows in one partition, and a
partition that arrives as many small Arrow batches or as one big one."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer, prepared_in_test_db
from tests.spark.streams import (
    COMPLETE,
    SCHEMA,
    commit_log,
    query_id,
    table_ids,
    write_records,
)

pytestmark = pytest.mark.spark

BIG_ROWS = 3_000_000


def record(i: int) -> dict[str, Any]:
    return {"id": i, "payload": f"record {i}", "ts": "2026-01-01T00:00:00Z", "amount": i / 4}


def save(df: Any, url: str, table: str, **options: str) -> None:
    writer = df.write.format("sqlsink").mode("append").option("url", url).option("table", table)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def decisions(url: str, sink_id: str) -> dict[int, tuple[Any, ...]]:
    """batch -> (rows, partitions, complete), from the commit log."""
    return commit_log(url, sink_id, "rows", "partitions", COMPLETE)


def markers(url: str, sink_id: str) -> dict[int, int]:
    """batch -> rows of its marker rows (what prepared transactions recorded; a complete
    batch's markers are deleted with its completion)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT batch_id, sum(rows) FROM sqlsink.markers WHERE sink_id = %s GROUP BY batch_id",
            (sink_id,),
        ).fetchall()
    return {int(b): int(r) for b, r in rows}


@contextlib.contextmanager
def spark_conf(spark: Any, key: str, value: str) -> Iterator[None]:
    """A session setting for the duration of a block (the session is shared)."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def test_empty_micro_batches_commit_cleanly_and_the_next_batch_works(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    write_records(
        tmp_path / "src",
        [
            [record(i) for i in range(0, 10)],
            [],  # a zero-byte file: a micro-batch without a single partition
            [record(i) for i in range(1000, 1005)],  # all filtered out: a partition, no row
            [record(10)],  # exactly one row
            [record(i) for i in range(11, 20)],
        ],
    )
    events = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "src"))
        .where("id < 1000")
    )
    query = (
        events.writeStream.format("sqlsink")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .option("url", pg_url)
        .option("table", table)
        .option("createTable", "true")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    assert [p["batchId"] for p in query.recentProgress] == [0, 1, 2, 3, 4]
    assert [p["sink"]["numOutputRows"] for p in query.recentProgress] == [10, 0, 0, 1, 9]
    assert table_ids(pg_url, table) == list(range(20))
    sink_id = query_id(tmp_path / "chk")
    # the empty batches are decided and complete like any other, with nothing to commit
    # (partitions: those that wrote rows)
    assert decisions(pg_url, sink_id) == {
        0: (10, 1, True),
        1: (0, 0, True),
        2: (0, 0, True),
        3: (1, 1, True),
        4: (9, 1, True),
    }
    assert markers(pg_url, sink_id) == {}  # complete: pruned
    assert prepared_in_test_db(pg_server) == []


@pytest.mark.parametrize(
    ("frame", "spark_partitions"),
    [
        pytest.param("spark.range(0, 10, 1, 2).where('id < 0')", 2, id="two-empty-partitions"),
        pytest.param("spark.range(0, 0, 1, 2)", 0, id="no-partition"),
        pytest.param("spark.range(0, 1, 1, 2)", 2, id="one-row-and-an-empty-partition"),
    ],
)
def test_empty_and_one_row_batch_writes(
    spark: Any, pg_url: str, table: str, pg_server: PgServer, frame: str, spark_partitions: int
) -> None:
    df = eval(frame, {"spark": spark}).selectExpr("id", "CAST(id AS INT) AS v")
    assert df._jdf.queryExecution().toRdd().getNumPartitions() == spark_partitions
    sink_id = f"load-{table[2:]}"
    save(df, pg_url, table, createTable="true", sinkId=sink_id)
    save(df, pg_url, table, createTable="true", sinkId=sink_id)  # named: idempotent
    expected = list(range(df.count()))
    assert table_ids(pg_url, table) == expected
    assert decisions(pg_url, sink_id) == {0: (len(expected), len(expected), True)}
    assert markers(pg_url, sink_id) == {}
    assert prepared_in_test_db(pg_server) == []


@pytest.mark.timeout(120)  # 3-6 s on two busy cores: a minute more is a regression
def test_millions_of_rows_in_one_partition(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    n = BIG_ROWS
    df = spark.range(0, n, 1, 1).selectExpr("id", "CAST(id % 1000 AS INT) AS v")
    sink_id = f"big-{table[2:]}"
    started = time.monotonic()
    save(df, pg_url, table, createTable="true", sinkId=sink_id)
    seconds = time.monotonic() - started
    with psycopg.connect(pg_url) as conn:
        totals = conn.execute(
            sql.SQL(
                "SELECT count(*), min(id), max(id), sum(id), sum(id::numeric * id), sum(v) FROM {}"
            ).format(sql.Identifier(table))
        ).fetchone()
    squares = (n - 1) * n * (2 * n - 1) // 6
    v_sum = (n // 1000) * sum(range(1000)) + sum(range(n % 1000))
    assert totals == (n, 0, n - 1, n * (n - 1) // 2, squares, v_sum)
    assert decisions(pg_url, sink_id) == {0: (n, 1, True)}
    assert markers(pg_url, sink_id) == {}
    assert prepared_in_test_db(pg_server) == []
    print(f"\n{n:,} rows in one partition: {seconds:.1f} s ({n / seconds:,.0f} rows/s)")


@pytest.mark.parametrize(
    ("records_per_batch", "rows"),
    [pytest.param(7, 20_000, id="many-small-arrow-batches"), pytest.param(0, 200_000, id="one")],
)
def test_a_partition_of_many_small_arrow_batches_or_one_big_one(
    spark: Any, pg_url: str, table: str, pg_server: PgServer, records_per_batch: int, rows: int
) -> None:
    df = spark.range(0, rows, 1, 1).selectExpr(
        "id",
        "CAST(id % 7 AS INT) AS v",
        "IF(id % 5 = 0, NULL, concat('p', id)) AS payload",  # nulls across batch boundaries
    )

    def batch_sizes(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            yield pa.record_batch([pa.array([batch.num_rows], pa.int64())], names=["n"])

    # the sink's write() is fed through mapInArrow: the same setting cuts its batches
    with spark_conf(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", str(records_per_batch)):
        sizes = [r.n for r in df.mapInArrow(batch_sizes, "n long").collect()]
        save(df, pg_url, table, createTable="true")
    if records_per_batch:
        assert len(sizes) == -(-rows // records_per_batch) and max(sizes) == records_per_batch
    else:
        assert sizes == [rows]
    with psycopg.connect(pg_url) as conn:
        check = conn.execute(
            sql.SQL(
                "SELECT count(*), count(DISTINCT id), sum(id), sum(v), count(payload), "
                "count(*) FILTER (WHERE (payload IS NULL) <> (id % 5 = 0) "
                "                    OR payload <> 'p' || id) FROM {}"
            ).format(sql.Identifier(table))
        ).fetchone()
    v_sum = sum(i % 7 for i in range(rows))
    assert check == (rows, rows, rows * (rows - 1) // 2, v_sum, rows - -(-rows // 5), 0)
    assert prepared_in_test_db(pg_server) == []
