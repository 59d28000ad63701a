"""The per-step profile of a batch still runs (``benchmarks/commit_phases.py`` at a tiny
size): a smoke run. Numbers are measured by hand (README, Benchmarks), never asserted;
this proves that it runs in both configurations (it fails by itself when a step of its
list was never timed: a wrapped function the code no longer calls), and that the JSON
and the plot are written. Its own Spark session and embedded PostgreSQL."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.programs import run_program


def test_every_step_of_a_batch_is_timed_with_and_without_a_view(tmp_path: Path) -> None:
    out = tmp_path / "commit_phases.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    log = tmp_path / "phases.log"
    run_program(
        "benchmarks/commit_phases.py", "--batches", "4", "--warmup", "2", "--out", str(out),
        timeout=480, env=env, log=log,
    )  # fmt: skip
    results = json.loads(out.read_text())
    # the benchmark itself fails when a step of its list was never timed
    assert set(results["configs"]) == {"table", "table + view"}
    assert "consistent view kept" in results["configs"]["table + view"]
    assert "consistent view kept" not in results["configs"]["table"]
    for config, figures in results["configs"].items():
        assert len(figures) >= 18, (config, sorted(figures))
        for step, figure in figures.items():
            assert figure["batches"] == 4, (config, step)
            assert figure["median_ms"] >= 0, (config, step)
    assert out.with_suffix(".png").stat().st_size > 10_000
