"""The first-batch measure still runs (``benchmarks/first_batch.py``): a smoke run of the
sink, the foreachBatch writer and Spark's JDBC writer (the peer), each started as a fresh
driver, new and restarted, its rows checked visible. The floors (``noop``, ``drain``) go
through the same child as the others and are left to the benchmark's own runs (six fresh
drivers here instead of ten: the test command's budget). The figures are measured by
hand (benchmarks/README.md), never asserted here. Its own embedded PostgreSQL."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.programs import run_program

SINKS = ("jdbc", "sqlsink", "writer")


def test_the_first_batch_of_each_sink_is_measured_new_and_restarted(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    log = tmp_path / "bench.log"
    args = ("benchmarks/first_batch.py", "--rounds", "1", "--rows", "2000")
    run_program(*args, "--sinks", ",".join(SINKS), "--out", str(out), timeout=600, env=env, log=log)
    measured = json.loads(out.read_text())
    assert measured["errors"] == {}
    # the JDBC driver's jar is installed by make setup (scripts/ensure-jdbc.sh)
    assert measured["skipped"] == {}
    assert set(measured["sinks"]) == set(SINKS)
    for sink, stages in measured["sinks"].items():
        assert set(stages) == {"new", "restarted"}, sink
        for stage, figures in stages.items():
            assert figures["runs"] == 1, (sink, stage)
            run = figures["raw"][0]
            # the restart's first batch is the second file's: batch 1, after batch 0
            assert run["batch_id"] == (0 if stage == "new" else 1), (sink, stage, run)
            assert run["rows"] == measured["rows"], (sink, stage, run)
            assert "triggerExecution" in figures["duration_ms"], (sink, stage)
            assert figures["start_to_visible_ms"]["median"] > 0, (sink, stage)
