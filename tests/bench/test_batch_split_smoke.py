"""The time split of a micro-batch still runs (``benchmarks/batch_split.py --quick``): a smoke
run. Numbers are measured by hand (benchmarks/README.md), never asserted; this proves that
every method ran, that the sink's partitions were timed (every phase, every row) through
``SQLSINK_TIMING_DIR``, and that the JSON is written. Its own Spark session and embedded
PostgreSQL."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.programs import run_program

PHASES = ("arrow_wait", "session", "encode", "send", "copy_end", "marker", "prepare", "total")


def test_every_part_of_a_batch_is_timed(tmp_path: Path) -> None:
    out = tmp_path / "batch_split.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    run_program(
        "benchmarks/batch_split.py", "--quick", "--out", str(out),
        timeout=600, env=env, log=tmp_path / "split.log",
    )  # fmt: skip
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert {"noop", "drain", "sqlsink", "copy", "copy_encoded"} <= set(summary)
    run = report["runs"]["sqlsink"][0]
    assert run["timed_rows"] == report["rows"]  # every partition of every batch was timed
    assert len(run["batches"]) == 4
    for phase in PHASES:
        assert summary["sqlsink"]["split"][phase] > 0, phase
    for name in ("noop", "drain", "sqlsink"):
        assert summary[name]["cpu_s_per_million"]["jvm"] > 0, name
    assert summary["sqlsink"]["cpu_s_per_million"]["postgres"] > 0
    assert summary["drain"]["split"]["total"] > 0  # the Python floor's partitions too
