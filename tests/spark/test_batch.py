"""Batch (non-streaming) writes: all partitions or none, and idempotent named loads."""

from __future__ import annotations

import os
import sys
from datetime import timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import PgServer, prepared_transactions
from tests.programs import run_program
from tests.spark.streams import table_ids

pytestmark = pytest.mark.spark


def frame(spark: Any, ids: range, partitions: int = 4) -> Any:
    return spark.range(ids.start, ids.stop, 1, partitions).selectExpr(
        "id", "concat('row ', id) AS payload"
    )


def save(df: Any, url: str, table: str, mode: str = "append", **options: str) -> None:
    writer = df.write.format("sqlsink").mode(mode).option("url", url).option("table", table)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_batch_append_and_one_off_log_is_removed(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    def one_off_loads() -> Any:
        with psycopg.connect(pg_url) as conn:  # a failed load elsewhere may leave its own
            ensure_schema(conn)  # type: ignore[arg-type]  # when this test runs first
            return conn.execute(
                "SELECT count(*) FROM sqlsink.sinks WHERE sink_id LIKE 'load-%'"
            ).fetchone()

    before = one_off_loads()
    save(frame(spark, range(0, 1000)), pg_url, table, createTable="true")
    assert table_ids(pg_url, table) == list(range(1000))
    assert prepared_transactions(pg_server.admin_url) == []
    assert one_off_loads() == before


def test_batch_write_is_all_or_nothing(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint CHECK (id <> 777), payload text)").format(
                sql.Identifier(table)
            )
        )
    with pytest.raises(Exception, match=r"batch 0, partition \d: writing to table .* failed"):
        save(frame(spark, range(0, 1000)), pg_url, table)
    assert table_ids(pg_url, table) == []  # the three good partitions are not visible either
    assert prepared_transactions(pg_server.admin_url) == []


def test_named_load_runs_once(spark: Any, pg_url: str, table: str) -> None:
    load = f"load-{table[2:]}"
    save(frame(spark, range(0, 300)), pg_url, table, createTable="true", sinkId=load)
    save(frame(spark, range(0, 300)), pg_url, table, createTable="true", sinkId=load)
    assert table_ids(pg_url, table) == list(range(300))


def test_overwrite_is_refused(spark: Any, pg_url: str, table: str) -> None:
    with pytest.raises(Exception, match="sqlsink does not overwrite"):
        save(frame(spark, range(0, 10)), pg_url, table, mode="overwrite", createTable="true")


def test_a_named_load_run_again_is_never_silent(
    tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """A named load run again writes nothing (exactly once: a re-run after a crash must
    not write twice), and says so: with the same input it warns in the driver's own
    output; with other input (new data under the old sink id, or the same load over an
    input that grew or changed since) it is refused, loudly, naming both fixes."""
    sink = f"load-{table[2:]}"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("SQLSINK_FAULTS_FILE", None)
    args = [pg_url, table, sink, "0:300", "0:300", "300:700", "0:200"]
    run = run_program("-m", "tests.spark.load_driver", *args, timeout=420, env=env)
    done = run.stdout.splitlines()
    assert [line.split(": ")[:2] for line in done] == [
        ["load 0:300", "ok"],
        ["load 0:300", "ok"],
        ["load 300:700", "failed"],
        ["load 0:200", "failed"],
    ], run.stdout[-4000:] + run.stderr[-4000:]
    assert table_ids(pg_url, table) == list(range(300))
    assert prepared_transactions(pg_server.admin_url) == []
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT decided_at, run_id FROM sqlsink.decisions WHERE sink_id = %s", (sink,)
        ).fetchone()
    assert row is not None
    when = f"{row[0].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    said = [  # the driver's log line (sqlsink/driver_log.py: Spark's layout), its message
        line.split(" WARN sqlsink: ", 1)[-1]
        for line in run.stderr.splitlines()
        if "this load wrote nothing" in line
    ]
    assert said == [
        f"sqlsink {sink}: this load wrote nothing: sink id {sink} decided its batch 0 at "
        f"{when} (300 rows in 4 partitions, run {row[1]}), and a named load is written "
        "once; this load's input has the same 300 rows, so it was taken for a re-run of "
        "that load (after a crash, or a job retried) and skipped. If it is new data, "
        "write it under a new sinkId"
    ], run.stderr[-4000:]
    refused = (
        f"sqlsink {sink}: refused, nothing of this load is written: sink id {sink} decided "
        f"its batch 0 at {when} (300 rows in 4 partitions, run {row[1]}), and a named "
        "load is written once; this load's input has 400 rows, so it is not a re-run of "
        "that load as it was. Fix: if this is new data, write it under a new sinkId; if it "
        "is that same load over an input that has grown since, its decided rows are "
        f"already in (300 rows at {when}): write only the rows added since, under a new "
        "sinkId, never the whole input again"
    )
    assert refused in done[2], done[2]
    shrunk = (
        f"sqlsink {sink}: refused, nothing of this load is written: sink id {sink} decided "
        f"its batch 0 at {when} (300 rows in 4 partitions, run {row[1]}), and a named "
        "load is written once; this load's input has 200 rows, so it is not a re-run of "
        "that load as it was. Fix: if this is new data, write it under a new sinkId; if it "
        "is that same load over an input that has changed since, its decided rows are "
        f"already in (300 rows at {when}): write only the rows that are not among them, "
        "under a new sinkId, never the whole input again"
    )
    assert shrunk in done[3], done[3]
