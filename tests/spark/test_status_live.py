"""``sqlsink status`` is true at once (issue 30 item 1), for both entry points on real Spark.

A query stopped with ``query.stop()`` is STOPPED within 5 s; one failing on bad data is
FAILED with the error's first line (both recorded by the listener sqlsink installs on the
driver, spark/listener.py); a driver SIGKILLed mid-commit records nothing, and status then
says what is known (no session connected, the batch committed in part, when the run is
declared dead), never "all well", with the command that finishes the batch, which works.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer
from tests.spark.fb_windows import TwoTables, killed_at
from tests.spark.streams import SCHEMA, decided_batches, query_id, write_records, write_source
from tests.spark.test_crash import kill_driver_at

pytestmark = [pytest.mark.spark]
STOPPED_WITHIN_S = 5.0


def status(url: str, sink_id: str) -> tuple[int, dict[str, Any], str]:
    """(exit code, the sink's JSON, the human report) of ``sqlsink status --sink-id``."""
    code, doc, human = status_doc(url, sink_id)
    [sink] = doc["sinks"]
    return code, sink, human


def status_doc(url: str, sink_id: str) -> tuple[int, dict[str, Any], str]:
    args = [sys.executable, "-m", "sqlsink", "status", "--url", url, "--sink-id", sink_id]
    done = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=60)
    human = subprocess.run(args, capture_output=True, text=True, timeout=60).stdout
    return done.returncode, json.loads(done.stdout), human


def wait_for_state(url: str, sink_id: str, state: str, within_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        _, sink, _ = status(url, sink_id)
        if sink["state"] == state or time.monotonic() > deadline:
            assert sink["state"] == state, sink
            return sink
        time.sleep(0.2)


def stream(spark: Any, source: Path, checkpoint: Path) -> Any:
    """The source's files, one a batch, every half second, until stopped."""
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    return events.writeStream.option("checkpointLocation", str(checkpoint)).trigger(
        processingTime="500 milliseconds"
    )


def data_source(url: str, table: str, sink_id: str) -> Callable[[Any], Any]:
    def start(writer: Any) -> Any:
        options = {"url": url, "table": table, "sinkId": sink_id, "createTable": "true"}
        return writer.format("sqlsink").options(**options).start()

    return start


def foreach_batch(url: str, table: str, sink_id: str) -> Callable[[Any], Any]:
    def start(writer: Any) -> Any:
        import sqlsink

        sink = sqlsink.ForeachBatchWriter(url=url, sink_id=sink_id, createTable="true")
        return writer.foreachBatch(sink.to(table)).start()

    return start


ENTRY_POINTS = {"data_source": data_source, "foreach_batch": foreach_batch}


def wait_decided(url: str, sink_id: str, batch: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(psycopg.errors.UndefinedTable):  # no commit log yet
            if decided_batches(url, sink_id).get(batch) is True:
                return
        assert time.monotonic() < deadline, f"batch {batch} of {sink_id} not decided"
        time.sleep(0.2)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_stopped_query_is_stopped_at_once(
    spark: Any, tmp_path: Path, pg_url: str, table: str, entry: str
) -> None:
    sink_id = f"stop-{uuid.uuid4().hex[:8]}"
    write_source(tmp_path / "src", [range(0, 10)])
    query = ENTRY_POINTS[entry](pg_url, table, sink_id)(
        stream(spark, tmp_path / "src", tmp_path / "chk")
    )
    try:
        wait_decided(pg_url, sink_id, 0)
        _, sink, _ = status(pg_url, sink_id)
        assert sink["state"] == "live" and sink["ended"] is None
    finally:
        query.stop()
    sink = wait_for_state(pg_url, sink_id, "stopped", STOPPED_WITHIN_S)
    assert sink["ended"]["how"] == "stopped" and sink["ended"]["error"] is None
    assert sink["ended"]["run_id"] == str(query.runId)
    code, _, human = status(pg_url, sink_id)
    assert code == 0 and "STOPPED" in human, human


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_query_failing_on_bad_data_is_failed_with_its_error(
    spark: Any, tmp_path: Path, pg_url: str, table: str, entry: str
) -> None:
    sink_id = f"fail-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint, payload text, ts timestamptz, "
                "amount float8 CONSTRAINT amount_positive CHECK (amount >= 0))"
            ).format(sql.Identifier(table))
        )
    good = [{"id": 1, "payload": "a", "ts": "2026-01-01T00:00:00Z", "amount": 1.0}]
    bad = [{"id": 2, "payload": "b", "ts": "2026-01-01T00:00:00Z", "amount": -1.0}]
    write_records(tmp_path / "src", [good, bad])
    query = ENTRY_POINTS[entry](pg_url, table, sink_id)(
        stream(spark, tmp_path / "src", tmp_path / "chk")
    )
    with pytest.raises(Exception, match="amount_positive"):  # Spark raises the query's error
        query.awaitTermination(180)
    sink = wait_for_state(pg_url, sink_id, "failed", STOPPED_WITHIN_S)
    error = sink["ended"]["error"]
    assert "amount_positive" in error and "\n" not in error, error
    code, _, human = status(pg_url, sink_id)
    assert "FAILED at" in human and error in human, human
    assert code == 1 and "all well" not in human, human  # a failed query is not all well


def test_a_driver_killed_mid_commit_is_not_all_well_data_source(
    tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", [range(0, 30), range(30, 70), range(70, 100)])
    kill_driver_at("mid_commit", 1, tmp_path, pg_url, table)
    sink_id = query_id(tmp_path / "chk")
    finished_by_its_fix(pg_url, sink_id)


def test_a_driver_killed_mid_commit_is_not_all_well_foreach_batch(
    tmp_path: Path, pg_url: str, pg_server: PgServer
) -> None:
    tables = TwoTables.create(pg_url, pg_server.admin_url, uuid.uuid4().hex[:10], tmp_path)
    try:
        killed_at(tables, "mid_commit", sys.executable, tmp_path)
        finished_by_its_fix(pg_url, tables.sink_id)
    finally:
        tables.drop()


def finished_by_its_fix(url: str, sink_id: str) -> None:
    """At once after the kill: not "all well", batch 1 named committed in part, the run's
    last word and when it is declared dead; the warning's command finishes the batch."""
    code, sink, human = status(url, sink_id)
    assert code == 1, human
    assert "all well" not in human
    assert sink["state"] == "quiet" and sink["ended"] is None
    doubt = sink["in_doubt"]
    assert doubt is not None and doubt["partial_batches"] == [1] and doubt["sessions"] == 0
    assert doubt["dead_in_seconds"] > 0  # still live by its heartbeat: recover would wait
    assert "batch 1 (1 partition(s) still prepared)" in human and "declared dead at" in human
    _, doc, _ = status_doc(url, sink_id)
    [fix] = [w["fix"] for w in doc["warnings"] if "--force --run-id" in (w["fix"] or "")]
    assert f"--sink-id {sink_id} --force --run-id {doubt['run_id']}" in fix
    assert fix.split(" (finishes it now)")[0].split("gone: ")[1] in human, human
    command = shlex.split(fix.split("gone: ")[1].split(" (finishes it now)")[0])
    assert command[0] == "sqlsink"
    done = subprocess.run(
        [sys.executable, "-m", *command], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert decided_batches(url, sink_id)[1] is True
    code, sink, human = status(url, sink_id)
    assert code == 0 and sink["in_doubt"] is None, human
