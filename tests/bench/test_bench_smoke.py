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
    "Spark JDBC, defaults",  # the JDBC driver's jar: make setup (scripts/ensure-jdbc.sh)
    "Spark JDBC, reWriteBatchedInserts",
}


def test_quick_benchmark_runs_every_measure(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    only = "memory,throughput,overhead,latency"
    run_program(
        "benchmarks/run.py", "--quick", "--only", only, "--out", str(out), timeout=480, env=env
    )
    results = json.loads(out.read_text())
    assert results["errors"] == {}
    assert set(results["measures"]) == {"memory", "throughput", "overhead", "latency"}
    names = {m["method"] for m in results["measures"]["throughput"]}
    assert names >= THROUGHPUT, names
    assert results["skipped"] == {}
    for method in results["measures"]["throughput"]:
        assert method["rows_per_s"] > 0, method
        # the embedded server's postmaster is watched: PostgreSQL has a CPU figure
        assert "postgres" in method["cpu_s_of_median_run"], method
    assert results["ratios"]["exactly_once_vs_ceiling"] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000


ISSUE16 = ("trap", "scaling", "peers", "batch_cost")


def test_quick_issue16_measures_run_and_have_their_fields(tmp_path: Path) -> None:
    """The trap, scaling, peers and per-batch cost measures (issue 16) in --quick mode: each
    runs without error and its JSON has the fields the README's tables are made of."""
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    only = ",".join(ISSUE16)
    log = tmp_path / "bench.log"  # the whole output, to read after a failure
    args = ("benchmarks/run.py", "--quick", "--only", only, "--out", str(out))
    run_program(*args, timeout=480, env=env, log=log)
    results = json.loads(out.read_text())
    assert results["errors"] == {}
    assert set(results["measures"]) == set(ISSUE16)
    measures = results["measures"]
    for name in ISSUE16:
        assert len(results["load_average_after"][name]) == 3, name

    trap = measures["trap"]
    levels = {v["level"] for v in trap["variants"]}
    assert levels == {"spark", "server"}
    for variant in trap["variants"]:
        assert variant["rows_per_s"] > 0, variant["name"]
        assert (
            variant["seconds"]["min"] <= variant["seconds"]["median"] <= variant["seconds"]["max"]
        )
        if "noop" not in variant["name"]:
            assert variant["waits"]["samples"] > 0, variant["name"]
            assert variant["postgres_cpu_s_per_m_rows"]["median"] > 0, variant["name"]
    assert any("(the trap)" in key for key in trap["ratios"])

    scaling = measures["scaling"]
    methods = {(p["method"], p["partitions"]) for p in scaling["points"]}
    scaled = ("plain COPY", "sqlsink exactly_once", "sqlsink exactly_once, foreachBatch writer")
    assert methods == {(m, p) for m in scaled for p in (1, 2)}
    assert all(p["postgres_cpu_s_per_m_rows"]["median"] > 0 for p in scaling["points"])
    assert "server CPU, sqlsink / COPY at 2" in scaling["ratios"]
    assert "server CPU, sqlsink exactly_once, foreachBatch writer / COPY at 2" in scaling["ratios"]

    peers = {m["method"] for m in measures["peers"]["methods"]}
    assert {
        "hand-written upsert, executemany",
        "sqlsink exactly_once, upsert",
        "sqlsink exactly_once, append",
        "Spark noop sink (Spark's own floor)",
        "Spark JDBC via foreachBatch, reWriteBatchedInserts",
    } <= peers
    assert results["skipped"] == {}  # the JDBC driver's jar: make setup
    assert measures["peers"]["ratios"]
    for method in measures["peers"]["methods"]:  # where the machine's CPU went
        split = method["cpu_s_per_m_rows"]
        assert split["machine_total"] > 0 and split["jvm"] > 0, method["method"]
        if method["method"].startswith("sqlsink"):
            assert split["python_workers"] > 0 and split["postgres"] > 0
    assert (
        "sqlsink exactly_once, upsert / hand-written upsert, executemany, machine CPU"
        in (measures["peers"]["ratios"])
    )

    cost = measures["batch_cost"]
    assert cost["sinks"]["exactly_once"]["trigger_to_visible_ms"]["n"] > 0
    assert cost["sinks"]["exactly_once"]["commit_ms"]["median"] > 0
    assert cost["sinks"]["fb_exactly_once"]["trigger_to_visible_ms"]["n"] > 0  # the writer
    assert cost["sinks"]["fb_exactly_once"]["commit_ms"]["median"] > 0
    assert cost["sinks"]["noop"]["trigger_ms"]["n"] > 0
    assert cost["statements"]["statements_per_batch"]["driver commit"] > 0
    handoff = cost["statements"]["last_prepare_to_commit_ms"]  # Spark's, from the server log
    assert handoff is not None and handoff["n"] > 0 and handoff["median"] > 0
    new_measures_s = sum(results["timings"][name] for name in ISSUE16)
    print(f"issue 16's measures in --quick mode: {new_measures_s:.0f} s")
    assert out.with_suffix(".png").stat().st_size > 10_000  # the plot of these measures
