"""The liveness benchmarks still run (``benchmarks/heartbeat_exit.py`` and
``benchmarks/runs_sql.py`` at a tiny size): smoke runs, as ``test_bench_smoke.py`` is for
``run.py``. Numbers are measured by hand (``benchmarks/README.md``) and never asserted.
Their own embedded PostgreSQL, no Spark (about 15 s)."""

from __future__ import annotations

import os

from tests.programs import run_program

ENV = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}


def test_the_heartbeat_benchmark_runs_its_two_cases() -> None:
    out = run_program("benchmarks/heartbeat_exit.py", "--batches", "3", timeout=300, env=ENV).stdout
    assert "one part, 3 batches: heartbeat registrations" in out
    assert "two parts, part 1's registration in progress: block exit waited" in out


def test_the_runs_benchmark_judges_each_size() -> None:
    out = run_program(
        "benchmarks/runs_sql.py", "--rows", "20,200", "--decisions", "100", "--repeat", "1",
        timeout=300, env=ENV,
    ).stdout  # fmt: skip
    assert "['run-000020']" in out and "['run-000200']" in out  # the newest run is live
