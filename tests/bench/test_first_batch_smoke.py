"""The first-batch measure still runs (``benchmarks/run.py --only first_batch --quick``): a
smoke run. Every sink is started as a fresh driver, new and restarted, and its rows are
checked visible; the figures are measured by hand (benchmarks/README.md), never asserted
here. Its own embedded PostgreSQL; about two minutes on 2 cores."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.programs import run_program


def test_the_first_batch_of_every_sink_is_measured_new_and_restarted(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    log = tmp_path / "bench.log"
    args = ("benchmarks/run.py", "--quick", "--only", "first_batch", "--out", str(out))
    run_program(*args, "--no-plot", timeout=600, env=env, log=log)
    results = json.loads(out.read_text())
    assert results["errors"] == {}
    measured = results["measures"]["first_batch"]
    sinks = set(measured["sinks"])
    # the JDBC driver's jar is installed by make setup (scripts/ensure-jdbc.sh)
    assert measured["skipped"] == {}
    assert sinks == {"noop", "drain", "jdbc", "sqlsink", "writer"}
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
