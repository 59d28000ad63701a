"""``sqlsink status`` attacked (issue 30 item 1): never "all well" while a batch is
committed in part and nothing of its run is connected.

status reads the database's sqlsink sessions once, before it surveys the sinks one by
one; a sink's decisions are read later. A committer connected when the sessions were
read, killed mid-commit before its sink's decisions are read, leaves a batch committed
in part with nothing connected: the sessions that clear a run of doubt must be read
after its decisions (``status_state.verdict``), not before.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from sqlsink.cli.output import Output
from sqlsink.cli.status import StatusScan
from sqlsink.cli.status_json import sort_prepared
from sqlsink.postgres import appnames, run_registry
from sqlsink.postgres.admin import PostgresAdmin
from sqlsink.postgres.survey import decisions as pg_decisions
from sqlsink.postgres.survey import prepared as pg_prepared
from sqlsink.postgres.survey import sessions as pg_sessions
from tests.fix_pg import PgServer, forget_sink, rollback_all_prepared
from tests.pg.protocol import Writer, make_table, new_sink


def committed_in_part(writer: Writer, batch: int, faults: Path) -> None:
    """Batch ``batch`` decided, one of its two partitions committed, the other prepared."""
    outcomes = [
        writer.write(batch, range(10 * batch + 3 * p, 10 * batch + 3 * p + 3), p) for p in (0, 1)
    ]
    faults.write_text(json.dumps([{"point": "mid_commit", "batch": batch, "action": "raise"}]))
    os.environ["SQLSINK_FAULTS_FILE"] = str(faults)
    try:
        with pytest.raises(RuntimeError):
            writer.commit(batch, outcomes)  # type: ignore[arg-type]
    finally:
        del os.environ["SQLSINK_FAULTS_FILE"]


def test_a_committer_gone_after_the_sessions_were_read_leaves_the_run_in_doubt(
    pg_url: str, pg_server: PgServer, table: str, tmp_path: Path
) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    writer = Writer(pg_url, table, sink, str(uuid.uuid4()))
    try:
        writer.batch(0, range(3))
        committed_in_part(writer, 1, tmp_path / "faults.json")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # the run's committer is connected while status reads the sessions ...
            committer = psycopg.connect(
                pg_url, autocommit=True, application_name=appnames.committer(sink)
            )
            sessions = pg_sessions.sqlsink_sessions(conn)
            assert pg_sessions.sink_sessions(sessions, sink)
            committer.close()  # ... and its driver is killed before the sink is surveyed
            out = Output(False, pg_url, io.StringIO(), io.StringIO())
            now = pg_prepared.server_now(conn)
            admin = PostgresAdmin(conn)
            scan = StatusScan(admin, admin.two_phase(), out, now, 3600.0, 5, sessions)
            database = str(conn.execute("SELECT current_database()").fetchone()[0])  # type: ignore[index]
            ours, _ = sort_prepared(pg_prepared.all_prepared(conn), database, sink)
            status = scan.sink(sink, pg_decisions.sinks(conn).get(sink), ours.get(sink, []))
        assert status.doc["incomplete_batches"] == [1]
        assert status.doc["in_doubt"] is not None, status.doc["state"]
        assert status.doc["in_doubt"]["partial_batches"] == [1]
        assert any(w.level == "warning" and "batch 1" in w.message for w in scan.warnings)
    finally:
        rollback_all_prepared(pg_server)
        forget_sink(pg_url, sink)


def status_of(url: str, sink: str) -> tuple[int, str]:
    """(exit code, the human report) of ``sqlsink status --sink-id`` (one sink: the shared
    database holds other tests' sinks, whose warnings would set the exit code too)."""
    done = subprocess.run(
        [sys.executable, "-m", "sqlsink", "status", "--url", url, "--sink-id", sink],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout


def test_a_failed_query_is_not_all_well(pg_url: str, table: str) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    writer = Writer(pg_url, table, sink, str(uuid.uuid4()))
    try:
        writer.batch(0, range(3))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            run_registry.record_end(conn, sink, writer.run, "failed", "ValueError: bad row")
        code, human = status_of(pg_url, sink)
        assert "FAILED" in human
        assert code != 0 and "all well" not in human, human
    finally:
        forget_sink(pg_url, sink)


def test_a_stopped_runs_prepared_leftover_is_not_all_well(
    pg_url: str, pg_server: PgServer, table: str
) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    writer = Writer(pg_url, table, sink, str(uuid.uuid4()))
    try:
        writer.batch(0, range(3))
        writer.write(1, range(3, 6))  # prepared, no decision: the query stopped mid-batch
        with psycopg.connect(pg_url, autocommit=True) as conn:
            run_registry.record_end(conn, sink, writer.run, "stopped", None)
        code, human = status_of(pg_url, sink)
        assert "STOPPED" in human
        assert code != 0 and "all well" not in human, human
        assert f"run {writer.run} of sink {sink} left batch 1 (1 partition(s)) prepared" in human
        assert f"--force --run-id {writer.run}" in human, human
        # the runs table calls it stopped, not LIVE (the registry's state, in the JSON)
        assert "stopped at" in human and "live to recover until its timeout" in human, human
        # what the warning says to run does it: nothing of the run is left prepared
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "sqlsink",
                "recover",
                "--url",
                pg_url,
                "--sink-id",
                sink,
                "--force",
                "--run-id",
                writer.run,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        code, human = status_of(pg_url, sink)
        assert code == 0 and "prepared and undecided" not in human, human
    finally:
        rollback_all_prepared(pg_server)
        forget_sink(pg_url, sink)


def test_a_stopped_run_in_doubt_is_not_called_killed(
    pg_url: str, pg_server: PgServer, table: str, tmp_path: Path
) -> None:
    """A run whose driver recorded that its query stopped, leaving a batch committed in
    part: the warning says so, and that the query's restart or recover finishes the batch,
    not that its driver may have been killed (which would contradict the recorded end)."""
    make_table(pg_url, table)
    sink = new_sink()
    writer = Writer(pg_url, table, sink, str(uuid.uuid4()))
    try:
        writer.batch(0, range(3))
        committed_in_part(writer, 1, tmp_path / "faults.json")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            run_registry.record_end(conn, sink, writer.run, "stopped", None)
        done = subprocess.run(
            [sys.executable, "-m", "sqlsink", "status", "--url", pg_url, "--sink-id", sink],
            capture_output=True,
            text=True,
            timeout=60,
        )
        code, human = done.returncode, done.stdout + done.stderr
        assert code == 1 and "all well" not in human, human
        assert "recorded that its query stopped" in human, human
        assert "killed" not in human and "the query is not running:" in human, human
    finally:
        rollback_all_prepared(pg_server)
        forget_sink(pg_url, sink)
