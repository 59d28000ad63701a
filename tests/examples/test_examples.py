"""Every example of examples/ runs against the shared session and the test server.

Each example's ``run(spark, url, workdir)`` returns its verdict; these tests check it
to the row, so that an example that stopped showing what its text says fails here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from examples import (
    batch_load,
    cdc_upsert,
    demo,
    quickstart,
    recovery_walkthrough,
    windowed_counts,
)
from tests.fix_pg import PgServer
from tests.programs import REPO, run_program

pytestmark = pytest.mark.spark


def test_quickstart(spark: Any, pg_url: str, tmp_path: Path) -> None:
    verdict = quickstart.run(spark, pg_url, tmp_path)
    assert verdict == {
        "rows_after_run_1": 150,
        "batches_run_1": 3,
        "batches_run_2": 2,  # the second run read only the two new files
        "rows_expected": 250,
        "rows_found": 250,
        "duplicates": 0,
        "missing": 0,
        "prepared_left": 0,
        "ok": True,
    }


def test_cdc_upsert(spark: Any, pg_url: str, tmp_path: Path) -> None:
    verdict = cdc_upsert.run(spark, pg_url, tmp_path)
    assert cdc_upsert.apply_changes(cdc_upsert.BATCHES) == {
        1: ("green apple", 0),
        2: ("nashi", 4),
        4: ("plum", 2),
        6: ("lime", 9),
    }
    assert verdict == {
        "changes": 15,
        "rows_expected": 4,
        "rows_found": 4,
        "missing": [],
        "unexpected": [],
        "wrong": [],
        "replayed_batch": 2,
        "replayed_input_rows": 5,  # Spark did run batch 2 again...
        "table_unchanged_by_replay": True,  # ...and the sink wrote nothing
        "rows_rewritten_by_replay": [],
        "prepared_left": 0,
        "ok": True,
    }


def test_windowed_counts(spark: Any, pg_url: str, tmp_path: Path) -> None:
    verdict = windowed_counts.run(spark, pg_url, tmp_path)
    # the shared session runs no batch without data, so the last file's watermark
    # closes no window (examples/README.md); the example's own session does
    no_data = spark.conf.get("spark.sql.streaming.noDataMicroBatches.enabled") == "true"
    assert verdict == {
        "windows_final_after_run_1": 9 if no_data else 6,
        "windows_final": 18 if no_data else 15,
        "windows_found": 18 if no_data else 15,
        "windows_still_open": 5 if no_data else 8,
        "late_events_dropped": 3,
        "wrong_counts": [],
        "unexpected": [],
        "prepared_left": 0,
        "ok": True,
    }


def test_batch_load(spark: Any, pg_url: str, tmp_path: Path) -> None:
    verdict = batch_load.run(spark, pg_url, tmp_path)
    assert verdict == {
        "failed_load_raised": True,
        "rows_after_failed_load": 0,  # three partitions had prepared: none is visible
        "rows_after_load": 400,
        "rows_after_named_load": 500,
        "rows_after_named_load_again": 500,
        "rows_expected": 500,
        "duplicates": 0,
        "missing": 0,
        "prepared_left": 0,
        "ok": True,
    }


@pytest.mark.crash
def test_recovery_walkthrough(spark: Any, pg_url: str, tmp_path: Path) -> None:
    verdict = recovery_walkthrough.run(spark, pg_url, tmp_path)
    assert verdict == {
        "driver": "signal SIGKILL",
        "rows_after_crash": 30,  # batch 0; batch 1 prepared, decided, not committed
        "prepared_after_crash": 2,
        "status_exit": 1,  # warns: batch 1 decided, not complete, nothing of its run connected
        "dry_run_exit": 1,  # something to do: two commits
        "recover_exit": 0,
        "rows_after_recover": 70,  # batch 1 rolled forward
        "prepared_after_recover": 0,
        "rows_expected": 100,
        "rows_found": 100,
        "duplicates": 0,
        "missing": 0,
        "prepared_left": 0,
        "ok": True,
    }


def test_demo_runs_and_ends_exactly_once() -> None:
    """The README's first command, as a user runs it (its own embedded PostgreSQL)."""
    demo = run_program("examples/demo.py", timeout=600)
    assert "driver died with signal SIGKILL" in demo.stdout
    assert "prepared transaction(s) left for recovery" in demo.stdout
    for line in (
        "duplicates                  0",
        "missing                     0",
        "prepared transactions left  0",
        "EXACTLY ONCE",
    ):
        assert line in demo.stdout


def processes_of(path: Path) -> list[str]:
    """The command lines of the running processes that name ``path`` (the demo's
    mariadbd names its data directory; its driver, the demo's work directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in line:
            found.append(f"{proc.name}: {line}")
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.crash
def test_the_mariadb_demo_starts_and_stops_its_own_server() -> None:
    """``make demo ARGS="--backend mariadb"``: the same crash on a mariadbd the demo
    starts itself (not the machine's :3306), told in XA's words, and no mariadbd of its
    left running afterwards."""
    done = run_program("examples/demo.py", "--backend", "mariadb", timeout=600)
    out = done.stdout
    started = re.search(r"mariadbd on 127\.0\.0\.1:(\d+)", out)
    pid = re.search(r"mariadbd \(pid (\d+)\) is up", out)
    assert started and pid, out
    assert int(started.group(1)) != 3306
    assert "driver died with signal SIGKILL" in out
    # batch 3's two branches: one XA COMMITted before the kill, one left prepared
    assert "XA RECOVER lists 1 prepared branch(es) of the sink (batch 3 partition 1)" in out
    assert "3 DECIDED, not completed" in out
    visible = re.search(r"after the crash: (\d+) rows visible", out)
    assert visible and 15_000 < int(visible.group(1)) < 20_000, out  # batch 3 part-visible
    for line in (
        "rows in demo_events        30000",
        "duplicates                  0",
        "missing                     0",
        "XA branches left prepared   0",
        "batches committed           6",
        "EXACTLY ONCE",
        "stopping the MariaDB server the demo started",
    ):
        assert line in out, out
    assert not alive(int(pid.group(1)))
    assert processes_of(demo.WORK / "mariadb") == []


def test_the_mariadb_demo_interrupted_leaves_no_server_and_no_driver() -> None:
    """A Ctrl-C (SIGINT to the demo, as the terminal sends it) while its driver runs:
    the demo kills the driver's session, stops its mariadbd and exits 130; nothing it
    started is left running."""
    proc = subprocess.Popen(
        [sys.executable, "examples/demo.py", "--backend", "mariadb"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    try:
        for line in proc.stdout:
            seen.append(line)
            if "run 1: streaming" in line or time.monotonic() > deadline:
                break
        assert "run 1: streaming" in seen[-1], "".join(seen)
        time.sleep(3)  # the driver's Python and JVM are starting
        assert processes_of(demo.WORK / "checkpoint"), "no driver running"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = "".join(seen) + rest
    assert proc.returncode == 130, out
    assert "interrupted" in out and "stopping the MariaDB server the demo started" in out
    pid = re.search(r"mariadbd \(pid (\d+)\) is up", out)
    assert pid and not alive(int(pid.group(1)))
    assert processes_of(demo.WORK) == []


def test_the_mariadb_demo_killed_takes_its_server_along() -> None:
    """The demo SIGKILLed (no finally runs) as soon as its mariadbd is up: the server's
    parent-death signal (sqlsink.mariadb.embedded) kills it with the demo."""
    proc = subprocess.Popen(
        [sys.executable, "examples/demo.py", "--backend", "mariadb"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "is up" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
        pid = re.search(r"mariadbd \(pid (\d+)\) is up", line)
        assert pid, line
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    gone_by = time.monotonic() + 10
    while alive(int(pid.group(1))) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not alive(int(pid.group(1)))
    assert processes_of(demo.WORK) == []


def test_an_example_as_a_program_with_url(pg_server: PgServer) -> None:
    """``python examples/batch_load.py --url …``: its own session, the given server."""
    with pg_server.database("example") as url:
        done = run_program("examples/batch_load.py", "--url", url, timeout=300)
        lines = done.stdout.split()
        assert lines[-2:] == ["ok", "True"] and "rows_after_named_load_again" in lines
        with psycopg.connect(url) as conn:
            row = conn.execute(f"SELECT count(*) FROM {batch_load.TABLE}").fetchone()
        assert row is not None and row[0] == 500
