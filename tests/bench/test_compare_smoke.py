"""``benchmarks/compare.py`` still runs end to end: this tree against its own HEAD, one
round at run.py's tiny sizes. Numbers are never asserted, only that both sides ran this
tree's measuring code against their own package (the base's from its temporary worktree,
in the driver and in Spark's Python workers), that every measure has a figure per side,
and that the noise-immune measures come first."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.programs import REPO, run_program


def test_compare_runs_both_sides_once(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    log = tmp_path / "compare.log"  # the whole output, to read after a failure
    args = ("benchmarks/compare.py", "HEAD", "--quick", "--rounds", "1", "--repeat", "1")
    done = run_program(*args, "--out", str(out), timeout=900, env=env, log=log)
    result = json.loads(out.read_text())
    assert result["command"].endswith(" ".join([*args, "--out", str(out)]))
    assert result["date"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert result["base"]["commit"] == head
    assert [(r["side"], r["round"], r["returncode"]) for r in result["runs"]] == [
        ("base", 1, 0),
        ("current", 1, 0),
    ]
    assert all(r["errors"] == {} for r in result["runs"]), result["runs"]
    assert all(r["wrong_tree"] == [] for r in result["runs"]), result["runs"]
    current, base = (next(r for r in result["runs"] if r["side"] == s) for s in ("current", "base"))
    assert set(current["imported"].values()) == {str(REPO / "sqlsink" / "__init__.py")}
    [base_file] = set(base["imported"].values())
    assert "sqlsink-compare-" in base_file and base_file.endswith("/base/sqlsink/__init__.py")
    assert set(base["imported"]) == {
        f"{m}: {w}" for m in ("guard_cost", "steady") for w in ("driver", "worker")
    }
    order = ("statements", "connections", "cpu", "write", "driver", "time")
    groups = [row["group"] for row in result["measures"]]
    assert groups == sorted(groups, key=order.index)
    assert set(groups) == set(order)
    names = {row["measure"] for row in result["measures"]}
    assert "statements/batch: driver commit, one batch" in names
    assert "statements/batch: every session" in names
    assert "CPU s per run: postgres" in names
    for name in (
        "cpu s/Mrow: jvm",
        "cpu s/Mrow: python_workers",
        "cpu s/Mrow: postgres",
        "partition write s/Mrow",
        "ms/batch: addBatch",
        "ms/batch: commit log commit_ms",
        "rows/s: server, first to last commit",
    ):
        assert f"steady sink: {name}" in names, name
    assert "steady ratio: sink (server) / COPY" in names
    for row in result["measures"]:
        for side in ("base", "current"):
            assert len(row[side]["values"]) == 1, row
    assert "statements/batch: driver commit, one batch" in done.stdout
    # the base's worktree is gone
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "sqlsink-compare-" not in listed
