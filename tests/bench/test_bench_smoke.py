"""The benchmark still runs end to end (``benchmarks/run.py --quick``): a smoke run.

Numbers are measured by ``make bench``, never asserted here; this only proves that every
measure runs, checks its rows, and writes its JSON and plot, so the benchmark the README
quotes cannot rot unnoticed. Its own Spark session and embedded PostgreSQL (about half a
minute on 2 cores).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.programs import run_program

THROUGHPUT = {
    "ceiling: binary COPY, 1 process",
    "sqlsink none",
    "sqlsink at_least_once",
    "sqlsink exactly_once",
    "Spark floor: noop sink",
    "sqlsink exactly_once, upsert",
}


def test_quick_benchmark_runs_every_measure(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    run_program("benchmarks/run.py", "--quick", "--out", str(out), timeout=480, env=env)
    results = json.loads(out.read_text())
    assert results["errors"] == {}
    assert set(results["measures"]) == {"memory", "throughput", "overhead", "latency"}
    names = {m["method"] for m in results["measures"]["throughput"]}
    assert names >= THROUGHPUT, names  # the JDBC writer runs when its jar is installed
    for method in results["measures"]["throughput"]:
        assert method["rows_per_s"] > 0, method
        # the embedded server's postmaster is watched: PostgreSQL has a CPU figure
        assert "postgres" in method["cpu_s_of_median_run"], method
    assert results["ratios"]["exactly_once_vs_ceiling"] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000
