"""The streaming sink end to end, in the shared SparkSession against a real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.gid import Gid
from tests.fix_pg import PgServer, prepared_transactions, rollback_all_prepared
from tests.spark.streams import (
    decided_batches,
    query_id,
    run_query,
    start_query,
    table_ids,
    write_source,
)

pytestmark = pytest.mark.spark


def options(pg_url: str, table: str, **extra: str) -> dict[str, str]:
    return {"url": pg_url, "table": table, "createTable": "true", **extra}


def test_exactly_once_streaming_append(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", [range(0, 40), range(40, 90), range(90, 100)])
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    assert table_ids(pg_url, table) == list(range(100))
    sink_id = query_id(tmp_path / "chk")  # the default sink id
    assert decided_batches(pg_url, sink_id) == {0: True, 1: True, 2: True}
    assert prepared_transactions(pg_server.admin_url) == []
    # a metrics row per batch, and status shows throughput and lag from it
    with psycopg.connect(pg_url) as conn:
        metrics = conn.execute(
            "SELECT batch_id, rows, partitions, first_write_at <= decided_at, commit_ms >= 0, "
            "orphans FROM sqlsink.decisions WHERE sink_id = %s ORDER BY batch_id",
            (sink_id,),
        ).fetchall()
    assert metrics == [
        (0, 40, 2, True, True, 0),
        (1, 50, 2, True, True, 0),
        (2, 10, 2, True, True, 0),
    ]
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqlsink",
            "status",
            "--url",
            pg_url,
            "--sink-id",
            sink_id,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    recent = json.loads(status.stdout)["sinks"][0]["recent_batches"]
    assert all(b["rows_per_second"] > 0 and b["lag_seconds"] > 0 for b in recent)


def test_replay_of_a_committed_batch_writes_nothing(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    write_source(tmp_path / "src", [range(0, 30), range(30, 60)])
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    for name in ("1", ".1.crc"):  # Spark will re-run batch 1
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    assert (tmp_path / "chk" / "commits" / "1").exists()
    assert table_ids(pg_url, table) == list(range(60))


def test_more_data_after_restart_continues_once(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    write_source(tmp_path / "src", [range(0, 10)])
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    write_source(tmp_path / "src", [range(0, 10), range(10, 25)])  # file 0 again: same name
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    assert table_ids(pg_url, table) == list(range(25))


def test_task_that_prepared_then_failed_is_swept(
    spark: Any, tmp_path: Path, pg_url: str, table: str, faults: Any, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", [range(0, 20), range(20, 40)])
    faults(
        [{"point": "after_prepare", "batch": 1, "partition": 0, "attempt": 0, "action": "raise"}]
    )
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    assert [(f["batch"], f["partition"]) for f in faults.fired()] == [(1, 0)]
    assert table_ids(pg_url, table) == list(range(40))
    assert prepared_transactions(pg_server.admin_url) == []


def test_a_failed_batch_whose_tasks_all_failed_or_still_ran_leaves_nothing_prepared(
    spark: Any, tmp_path: Path, pg_url: str, table: str, faults: Any, pg_server: PgServer
) -> None:
    """Partition 1 of batch 1 fails on every attempt; partition 0 has prepared and is
    still running when the job fails, so Spark's abort gets no message from any task.
    The abort did nothing then ("its run is unknown"): partition 0's transaction stayed
    prepared, its run live, for runTimeout (found by tests/spark/test_secrets.py under
    load). The abort now finds its run by the driver token its tasks registered with
    (sqlsink/spark/driver_token.py), marks the batch aborted and rolls it back."""
    write_source(tmp_path / "src", [range(0, 20), range(20, 40)])
    faults(
        [
            {"point": "after_prepare", "batch": 1, "partition": 0, "action": "sleep",
             "seconds": 6},
            {"point": "mid_copy", "batch": 1, "partition": 1, "action": "raise"},
        ]
    )  # fmt: skip
    query = start_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    with pytest.raises(Exception, match="injected fault at mid_copy"):
        query.awaitTermination()
    sink_id = query_id(tmp_path / "chk")
    assert (1, 0) in [(f["batch"], f["partition"]) for f in faults.fired()]
    assert table_ids(pg_url, table) == list(range(20))
    assert prepared_transactions(pg_server.admin_url) == []
    with psycopg.connect(pg_url) as conn:
        aborted = conn.execute(
            "SELECT aborted_batch, writer_token IS NOT NULL FROM sqlsink.runs WHERE sink_id = %s",
            (sink_id,),
        ).fetchall()
    assert aborted == [(1, True)]  # the run is over: recover and status need not wait


@pytest.mark.parametrize("semantic", ["at_least_once", "none"])
def test_weaker_semantics_write_directly(
    spark: Any, tmp_path: Path, pg_url: str, table: str, semantic: str, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", [range(0, 15), range(15, 30)])
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table, semantic=semantic))
    assert table_ids(pg_url, table) == list(range(30))
    assert prepared_transactions(pg_server.admin_url) == []


def test_new_query_reusing_a_bound_sink_id_is_refused(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    write_source(tmp_path / "src", [range(0, 10)])
    opts = options(pg_url, table, sinkId=f"shared-{table[2:]}")
    run_query(spark, tmp_path / "src", tmp_path / "chk-a", opts)
    with pytest.raises(Exception, match="is bound to streaming query") as err:
        run_query(spark, tmp_path / "src", tmp_path / "chk-b", opts)
    assert "sinkId" in str(err.value)
    assert table_ids(pg_url, table) == list(range(10))


def test_unknown_option_is_refused_before_anything_runs(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    write_source(tmp_path / "src", [range(0, 5)])
    with pytest.raises(Exception, match=r"unknown option 'tabel'.*known options"):
        run_query(
            spark,
            tmp_path / "src",
            tmp_path / "chk",
            {"url": pg_url, "table": table, "tabel": "x", "createTable": "true"},
        )


def test_leftovers_of_a_dead_run_are_resolved_before_writing_and_foreign_gids_survive(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", [range(0, 20), range(20, 40)])
    run_query(spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table))
    sink_id = query_id(tmp_path / "chk")
    for name in ("1", ".1.crc"):  # batch 1 will be re-run ...
        (tmp_path / "chk" / "commits" / name).unlink()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # ... and pretend a dead run left batch 2 prepared, undecided, holding ids 40..44
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(sql.Identifier(table)))
    dead = str(Gid(sink_id, 2, 0, "dead-run", 1))
    foreign = ["app_tx_7", f"sqlsink_{sink_id}_2_0", str(Gid("other-sink", 2, 0, "dead-run", 1))]
    for gid, ids in [(dead, range(40, 45)), *((g, range(0)) for g in foreign)]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("BEGIN")
            for i in ids:
                conn.execute(
                    sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table)), (i,)
                )
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    try:
        write_source(tmp_path / "src", [range(0, 20), range(20, 40), range(40, 60)])
        run_query(
            spark, tmp_path / "src", tmp_path / "chk", options(pg_url, table, lockTimeout="20s")
        )
        assert table_ids(pg_url, table) == list(range(60))
        left = sorted(g for g, _ in prepared_transactions(pg_server.admin_url))
        assert left == sorted(foreign)
    finally:
        rollback_all_prepared(pg_server)


def test_password_never_appears_in_errors_or_plans(
    spark: Any, tmp_path: Path, pg_server: PgServer, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cret-PW-in-url"
    url = pg_server.url.replace("postgres@", f"postgres:{secret}@")  # trust auth ignores it
    write_source(tmp_path / "src", [range(0, 5)])
    # a table that does not exist (no createTable): the query fails at planning
    with pytest.raises(Exception) as err:
        run_query(spark, tmp_path / "src", tmp_path / "chk", {"url": url, "table": table})
    assert "does not exist" in str(err.value)
    assert secret not in str(err.value)
    # a query that runs: nothing of the password in progress, plans or logs either
    query = start_query(
        spark,
        tmp_path / "src",
        tmp_path / "chk2",
        {"url": url, "table": table, "createTable": "true", "password": secret},
    )
    query.awaitTermination()
    assert query.exception() is None
    assert secret not in json.dumps(query.recentProgress, default=str)
    assert secret not in caplog.text


def test_prepared_transactions_disabled_fails_before_writing(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sqlsink.embedded import EmbeddedPostgres

    with EmbeddedPostgres(settings={"max_prepared_transactions": 0}) as server:
        write_source(tmp_path / "src", [range(0, 5)])
        options = {"url": server.url(), "table": "events", "createTable": "true"}
        with pytest.raises(Exception, match="prepared transactions are disabled on this server"):
            run_query(spark, tmp_path / "src", tmp_path / "chk", options)
        with psycopg.connect(server.url()) as conn:
            assert conn.execute("SELECT to_regclass('public.events')").fetchone() == (None,)
