"""Each crash window of DESIGN.md section 3, made to happen for real.

A driver process (with its JVM and workers) is SIGKILLed at a protocol step; in
two of the windows PostgreSQL is then crashed too (-m immediate) while
transactions are prepared. The query is restarted from its checkpoint (in the
shared session) and must end with every record exactly once and nothing of the
sink left prepared.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import decided_batches, query_id, run_query, table_ids, write_source

pytestmark = [pytest.mark.spark, pytest.mark.crash]
REPO = Path(__file__).resolve().parents[2]
BATCHES = [range(0, 30), range(30, 70), range(70, 100)]


def kill_driver_at(point: str, batch: int, tmp_path: Path, url: str, table: str) -> None:
    """Run the driver in its own process group until the fault kills it."""
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": point, "batch": batch, "action": "kill"}]))
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYSPARK_PYTHON": sys.executable}
    driver = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.spark.crash_driver",
            str(tmp_path / "src"),
            str(tmp_path / "chk"),
            url,
            table,
        ],
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


def sink_prepared(server: PgServer) -> list[str]:
    return [gid for gid, _ in prepared_transactions(server.admin_url)]


def finish_and_check(spark: Any, tmp_path: Path, url: str, table: str, server: PgServer) -> None:
    run_query(spark, tmp_path / "src", tmp_path / "chk", {"url": url, "table": table})
    assert table_ids(url, table) == list(range(100))
    assert sink_prepared(server) == []
    sink_id = query_id(tmp_path / "chk")
    assert decided_batches(url, sink_id) == {0: True, 1: True, 2: True}


def test_driver_killed_before_the_decision_then_postgres_crash(
    spark: Any, tmp_path: Path, table: str, own_server: PgServer
) -> None:
    pg_server, pg_url = own_server, own_server.url  # a server this run may crash
    write_source(tmp_path / "src", BATCHES)
    kill_driver_at("before_decision", 1, tmp_path, pg_url, table)
    left = sink_prepared(pg_server)
    assert left, "batch 1 should be left prepared, undecided"
    assert table_ids(pg_url, table) == list(range(30))  # nothing of batch 1 visible
    pg_server.crash_and_restart()
    assert sink_prepared(pg_server) == left  # prepared transactions survive a crash
    finish_and_check(spark, tmp_path, pg_url, table, pg_server)


def test_driver_killed_mid_commit_then_postgres_crash(
    spark: Any, tmp_path: Path, table: str, own_server: PgServer
) -> None:
    pg_server, pg_url = own_server, own_server.url  # a server this run may crash
    write_source(tmp_path / "src", BATCHES)
    kill_driver_at("mid_commit", 1, tmp_path, pg_url, table)
    sink_id = query_id(tmp_path / "chk")
    assert decided_batches(pg_url, sink_id) == {0: True, 1: False}
    assert len(sink_prepared(pg_server)) == 1  # one of two partitions committed
    pg_server.crash_and_restart()
    finish_and_check(spark, tmp_path, pg_url, table, pg_server)


def test_on_call_recovers_a_killed_driver_with_the_cli(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", BATCHES)
    kill_driver_at("after_decision", 1, tmp_path, pg_url, table)
    sink_id = query_id(tmp_path / "chk")
    left = sink_prepared(pg_server)
    assert len(left) == 2
    status = cli("status", "--url", pg_url, "--sink-id", sink_id, "--max-age", "0s")
    assert status.returncode == 1 and all(g in status.stdout for g in left)
    plan = cli("recover", "--url", pg_url, "--checkpoint", str(tmp_path / "chk"), "--dry-run")
    assert plan.returncode == 1, plan.stdout + plan.stderr
    assert "Spark will" in plan.stdout  # how the two logs relate
    assert sink_prepared(pg_server) == left  # a dry run changes nothing
    done = cli("recover", "--url", pg_url, "--sink-id", sink_id, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    actions = {a["gid"]: a["action"] for a in json.loads(done.stdout)["actions"]}
    assert actions == dict.fromkeys(left, "commit")  # batch 1 was decided: rolled forward
    assert table_ids(pg_url, table) == list(range(70))
    finish_and_check(spark, tmp_path, pg_url, table, pg_server)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqlsink", *args], capture_output=True, text=True, timeout=120
    )


def test_driver_killed_after_commit_before_spark_commit_log(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", BATCHES)
    kill_driver_at("after_commit", 1, tmp_path, pg_url, table)
    assert table_ids(pg_url, table) == list(range(70))
    assert not (tmp_path / "chk" / "commits" / "1").exists()  # Spark will re-run batch 1
    finish_and_check(spark, tmp_path, pg_url, table, pg_server)


def test_session_terminated_mid_copy_the_task_is_retried(
    spark: Any, tmp_path: Path, pg_url: str, table: str, faults: Any, pg_server: PgServer
) -> None:
    """pg_terminate_backend of a partition's session while its COPY is under way."""
    write_source(tmp_path / "src", BATCHES)
    cut = {"point": "mid_copy", "batch": 1, "partition": 0, "attempt": 0}
    faults([{**cut, "action": "terminate", "url": pg_server.admin_url}])
    run_query(spark, tmp_path / "src", tmp_path / "chk", opts(pg_url, table))
    assert [(f["point"], f["batch"], f["partition"]) for f in faults.fired()] == [
        ("mid_copy", 1, 0)
    ]
    assert table_ids(pg_url, table) == list(range(100))
    assert sink_prepared(pg_server) == []
    assert decided_batches(pg_url, query_id(tmp_path / "chk")) == {0: True, 1: True, 2: True}


def test_session_terminated_mid_commit_the_restart_completes_the_batch(
    spark: Any, tmp_path: Path, pg_url: str, table: str, faults: Any, pg_server: PgServer
) -> None:
    """pg_terminate_backend of the committer's session between two COMMIT PREPAREDs."""
    write_source(tmp_path / "src", BATCHES)
    cut = {"point": "mid_commit", "batch": 1, "once": True}
    faults([{**cut, "action": "terminate", "url": pg_server.admin_url}])
    with pytest.raises(Exception, match="terminating connection"):
        run_query(spark, tmp_path / "src", tmp_path / "chk", opts(pg_url, table))
    assert [f["point"] for f in faults.fired()] == ["mid_commit"]
    # batch 1 was decided before the cut: Spark's abort() rolled it forward, in full
    assert decided_batches(pg_url, query_id(tmp_path / "chk")) == {0: True, 1: True}
    assert sink_prepared(pg_server) == []
    assert table_ids(pg_url, table) == list(range(70))
    assert not (tmp_path / "chk" / "commits" / "1").exists()  # Spark runs batch 1 again
    faults([])
    finish_and_check(spark, tmp_path, pg_url, table, pg_server)


def opts(url: str, table: str) -> dict[str, str]:
    return {"url": url, "table": table, "createTable": "true"}
