"""The consistent view's cost benchmark still runs (``benchmarks/view_cost.py`` at a tiny
size): a smoke run, as ``test_bench_smoke.py`` is for ``run.py``. Numbers are measured by
hand (README, Benchmarks) and never asserted; this proves that every state and query
runs, that the view hides exactly the in-flight rows (the benchmark checks it), and that
the JSON and the plot are written. Its own embedded PostgreSQL, no Spark (about 15 s)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.programs import run_program


def test_view_cost_benchmark_runs_every_state_and_query(tmp_path: Path) -> None:
    out = tmp_path / "view_cost.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    run_program(
        "benchmarks/view_cost.py", "--rows", "20000", "--runs", "3", "--out", str(out),
        timeout=300, env=env,
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert set(results["states"]) == {
        "nothing in flight",
        "in flight, 2 hidden",
        "in flight, 100 hidden",
    }
    for state in results["states"].values():
        assert state["table_rows"] - state["view_rows"] == state["hidden_rows"]
        assert set(state["queries"]) == {"count(*)", "key lookup", "key lookup, prepared"}
        for query in state["queries"].values():
            assert query["table"]["runs"] == query["view"]["runs"] == 3
            assert query["ratio_of_medians"] > 0
        view_plan = state["plans"]["count(*) on the view"]
        assert any("Filter: ((NOT $0) OR (xmin <> ALL ($1)))" in line for line in view_plan)
        assert not any("Append" in line for line in view_plan)
    references = results["states"]["nothing in flight"]["queries"]["count(*)"]["references"]
    assert set(references) == {"bare view", "gate only", "any gate"}
    assert all(r["runs"] == 3 for r in references.values())
    assert out.with_suffix(".png").stat().st_size > 10_000
