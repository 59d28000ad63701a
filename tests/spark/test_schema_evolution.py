"""Option schemaEvolution end to end (issue 29 item 1): a stream that gains columns
between runs and across a driver kill, with a consistent view; a killed run's prepared
transactions named by the lock wait, then resolved by ``sqlsink recover``; a refusal as
the user reads it; the foreachBatch writer's ``schema_evolution=``. The planning rules
themselves: tests/pg/test_schema_evolution.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import sqlsink
from sqlsink.core.gid import Gid
from tests.fix_pg import PgServer
from tests.spark.streams import (
    SCHEMA,
    add_source_file,
    query_id,
    run_foreach_batch,
    run_query,
    start_query,
    write_source,
)
from tests.spark.test_first_errors import first_line

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]
V1 = "id BIGINT, payload STRING"  # the stream before: the source's files have more fields
V2 = SCHEMA  # and after: id, payload, ts, amount


@pytest.fixture
def view(pg_url: str) -> Iterator[str]:
    name = f"v_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:  # before the table fixture drops
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier("public", name)))


def kill_driver_at(
    point: str, batch: int, tmp_path: Path, schema: str, options: dict[str, str]
) -> None:
    """The stream in a driver process of its own (tests/spark/crash_driver.py), SIGKILLed
    by the fault at ``point`` of ``batch``."""
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": point, "batch": batch, "action": "kill"}]))
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYSPARK_PYTHON": sys.executable}
    args = [str(tmp_path / "src"), str(tmp_path / "chk"), options["url"], options["table"]]
    driver = subprocess.run(
        [sys.executable, "-m", "tests.spark.crash_driver", "--schema", schema, *args]
        + [f"{k}={v}" for k, v in options.items()],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # the fault kills this group, never the test runner
    )
    assert driver.returncode == -signal.SIGKILL, (
        f"the driver was not killed at {point} (exit {driver.returncode}):\n"
        f"{driver.stdout[-2000:]}\n{driver.stderr[-4000:]}"
    )


def rows_of(url: str, relation: str) -> list[tuple[Any, ...]]:
    """(id, payload, amount, ts is null) of every row, by id."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            sql.SQL("SELECT id, payload, amount, ts IS NULL FROM {} ORDER BY id").format(
                sql.Identifier(relation)
            )
        ).fetchall()


def expected(ids: range, *, new_columns: bool) -> list[tuple[Any, ...]]:
    """The rows write_source's records give: the new columns NULL where written before."""
    return [(i, f"record {i} ✓", i / 4 if new_columns else None, not new_columns) for i in ids]


def columns_of(url: str, relation: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f"public.{relation}",),
        ).fetchall()
    return [str(r[0]) for r in rows]


def prepared_count(server: PgServer) -> int:
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
    return int(str(row[0])) if row else -1


def test_a_stream_gains_columns_between_runs_and_across_a_driver_kill(
    spark: Any, tmp_path: Path, pg_url: str, table: str, view: str, pg_server: PgServer
) -> None:
    """Run 1 writes two batches with (id, payload); run 2 reads two more columns, adds
    them at planning, prepares batch 2 and is killed before its decision; run 3 finds the
    columns (no second ALTER, which would wait on run 2's prepared transactions), and its
    tasks roll run 2's batch back and write it again. Every row once; the first run's
    rows NULL in the new columns; the view shows them (replaced by run 2's commit, which
    keeps the view before its decision); nothing prepared."""
    options = {
        "url": pg_url,
        "table": table,
        "createTable": "true",
        "consistentView": view,
        "schemaEvolution": "addColumns",
    }
    write_source(tmp_path / "src", [range(0, 30), range(30, 70)])
    run_query(spark, tmp_path / "src", tmp_path / "chk", options, schema=V1)
    assert columns_of(pg_url, table) == ["id", "payload"]
    assert columns_of(pg_url, view) == ["id", "payload"]

    add_source_file(tmp_path / "src", 2, range(70, 100))
    add_source_file(tmp_path / "src", 3, range(100, 110))
    kill_driver_at("before_decision", 2, tmp_path, V2, options)
    assert columns_of(pg_url, table) == ["id", "payload", "ts", "amount"]  # added by run 2
    assert prepared_count(pg_server) > 0  # its batch 2, undecided
    # replaced by run 2's commit before its decision; batch 2 is not shown (prepared)
    assert columns_of(pg_url, view) == ["id", "payload", "ts", "amount"]
    assert rows_of(pg_url, view) == expected(range(0, 70), new_columns=False)

    run_query(spark, tmp_path / "src", tmp_path / "chk", options, schema=V2)
    rows = expected(range(0, 70), new_columns=False) + expected(range(70, 110), new_columns=True)
    assert rows_of(pg_url, table) == rows
    assert rows_of(pg_url, view) == rows
    assert prepared_count(pg_server) == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        left = "SELECT count(*) FROM sqlsink.markers WHERE sink_id = %s"
        assert conn.execute(left, (query_id(tmp_path / "chk"),)).fetchone() == (0,)


def test_a_killed_runs_prepared_batch_is_named_then_recover_lets_the_column_in(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """Run 1 (id, payload) is killed with batch 1 prepared: its transactions hold the
    table, so run 2's ALTER for a new column gives up after lockTimeout and says which
    transactions and what resolves them, nothing written; after ``sqlsink recover`` the
    restart adds the columns and writes batch 1 again: every row once."""
    options = {"url": pg_url, "table": table, "schemaEvolution": "addColumns"}
    write_source(tmp_path / "src", [range(0, 30), range(30, 70)])
    kill_driver_at("before_decision", 1, tmp_path, V1, options)
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        left = [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts ORDER BY 1")]
    assert left

    query = start_query(
        spark, tmp_path / "src", tmp_path / "chk", {**options, "lockTimeout": "2s"}, schema=V2
    )
    with pytest.raises(Exception) as failed:
        query.awaitTermination()
    line = first_line(failed.value)
    assert line.startswith(
        f"sqlsink.errors.TransientError: schema evolution of table public.{table} (added "
        "column 'ts' (timestamp with time zone); added column 'amount' (double precision)) "
        "waited 2 s for the table's lock, held by prepared transaction "
    ), line
    assert all(gid in line for gid in left), line
    dead = Gid.parse(left[0])
    assert dead is not None
    recover_args = ["--sink-id", dead.sink_id, "--force", "--run-id", dead.run_id]
    assert line.endswith(
        "Nothing was changed or written. Fix: a prepared transaction holds it: sqlsink "
        "recover resolves those a stopped run left once the run is no longer live "
        f"(runTimeout), or at once with sqlsink recover {' '.join(recover_args)} when you "
        f"know run {dead.run_id} is dead (a running query's own are finished by its "
        "commit); then start again"
    ), line
    assert columns_of(pg_url, table) == ["id", "payload"]

    recover = subprocess.run(
        [sys.executable, "-m", "sqlsink", "recover", "--url", pg_url, *recover_args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert recover.returncode == 0, recover.stdout + recover.stderr
    assert prepared_count(pg_server) == 0
    run_query(spark, tmp_path / "src", tmp_path / "chk", options, schema=V2)
    rows = expected(range(0, 30), new_columns=False) + expected(range(30, 70), new_columns=True)
    assert rows_of(pg_url, table) == rows
    assert prepared_count(pg_server) == 0


def test_a_refusal_is_the_first_line_and_nothing_is_written(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint, code text NOT NULL)").format(sql.Identifier(table))
        )
    options = {"url": pg_url, "table": table, "schemaEvolution": "addColumns"}
    write_source(tmp_path / "src", [range(0, 5)])
    query = start_query(spark, tmp_path / "src", tmp_path / "chk", options, schema=V1)
    with pytest.raises(Exception) as failed:
        query.awaitTermination()
    t = f"public.{table}"
    assert first_line(failed.value) == (
        f"sqlsink.errors.ConfigError: the DataFrame does not fit table {t}: column 'code' of "
        f"table {t} is NOT NULL without a default, and the DataFrame has no such column. "
        f'Fix: ALTER TABLE "public"."{table}" ALTER COLUMN "code" DROP NOT NULL (its rows '
        "are then written NULL), or give it a value"
    )
    assert columns_of(pg_url, table) == ["id", "code"]  # payload not added: refused first
    with psycopg.connect(pg_url, autocommit=True) as conn:
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        assert count.fetchone() == (0,)


def test_the_foreach_batch_writer_adds_the_columns_a_later_run_gives(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    sink_id = f"evolve-{uuid.uuid4().hex[:8]}"
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=sink_id, schema_evolution="addColumns", createTable="true"
    )
    to_table = writer.to(table)

    def narrow(batch_df: Any, batch_id: int) -> None:
        to_table(batch_df.select("id", "payload"), batch_id)

    write_source(tmp_path / "src", [range(0, 20), range(20, 50)])
    run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", narrow)
    add_source_file(tmp_path / "src", 2, range(50, 80))
    run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", to_table)
    assert columns_of(pg_url, table) == ["id", "payload", "ts", "amount"]
    rows = expected(range(0, 50), new_columns=False) + expected(range(50, 80), new_columns=True)
    assert rows_of(pg_url, table) == rows
    assert prepared_count(pg_server) == 0
