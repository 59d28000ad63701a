"""``benchmarks/compare.py`` still runs end to end: this tree against its own HEAD, one
round at run.py's tiny sizes. Numbers are never asserted, only that both sides ran, that
every measure has a figure per side, and that the noise-immune measures come first."""

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
    args = ("benchmarks/compare.py", "HEAD", "--quick", "--rounds", "1", "--rows", "2000")
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
    groups = [row["group"] for row in result["measures"]]
    assert groups == sorted(groups, key=("statements", "connections", "cpu", "time").index)
    assert groups[0] == "statements"
    names = {row["measure"] for row in result["measures"]}
    assert "statements/batch: driver commit, one batch" in names
    assert "rows/s: sqlsink exactly_once" in names
    assert "CPU s per run: postgres" in names
    for row in result["measures"]:
        for side in ("base", "current"):
            assert len(row[side]["values"]) == 1, row
    assert "statements/batch: driver commit, one batch" in done.stdout
    # the base's worktree is gone
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "sqlsink-compare-" not in listed
