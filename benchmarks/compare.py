"""Commit against commit: this tree and an earlier commit, alternately, on one server.

    flock /tmp/sqlsink-spark.lock .venv/bin/python benchmarks/compare.py 89cb7f8
    .venv/bin/python benchmarks/compare.py HEAD~3 --rounds 3 --rows 200000 --out /tmp/ab.json
    .venv/bin/python benchmarks/compare.py main --quick --rounds 1      # smoke, tiny sizes

The named commit is checked out in a temporary git worktree (made and removed here); its
``benchmarks/work`` is this tree's, so both sides read the same generated data. One
embedded PostgreSQL serves every run; each run gets a fresh database (a commit log another
version migrated is never handed to the other side). Each round runs both sides' own
``benchmarks/run.py --only batch_cost,throughput`` (the per-batch cost and a steady-state
append of ``--rows`` rows), in alternating order (A B, then B A, ...), so a drift of the
machine over the run falls on both sides alike.

Per measure: the values of each side, their median and spread (min-max), and the ratio
of the medians (this tree / the earlier commit). The measures that noise does not move
come first: statements and connections per batch by session kind (the server's log), then
CPU seconds (per process group of the throughput runs; the server's and the run's own per
run), then the times. Writes the JSON (with the command and the date) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from cpu import postgres_s, settled_postgres_s
from psycopg import sql
from server import postgres

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
CURRENT, BASE = "current", "base"
# the groups the noise-immune measures come in, first to last
ORDER = ("statements", "connections", "cpu", "time")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=5, help="runs per side (5)")
    parser.add_argument("--rows", type=int, help="rows of the steady-state append")
    parser.add_argument("--quick", action="store_true", help="run.py's tiny sizes: a smoke run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compare.json"))
    parser.add_argument("--keep", action="store_true", help="keep each run's result files")
    return parser.parse_args(argv)


def say(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", flush=True)


def git(*args: str, cwd: Path = TREE) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@contextlib.contextmanager
def base_tree(commit: str, scratch: Path) -> Iterator[Path]:
    """A detached worktree of ``commit`` sharing this tree's generated data; removed after."""
    path = scratch / "base"
    git("worktree", "add", "--detach", str(path), commit)
    try:
        work = HERE / "work"
        work.mkdir(exist_ok=True)
        target = path / "benchmarks" / "work"
        if target.exists():
            shutil.rmtree(target)
        target.symlink_to(work, target_is_directory=True)
        yield path
    finally:
        git("worktree", "remove", "--force", str(path))


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    name = f"compare_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def run_side(
    tree: Path, admin_url: str, args: argparse.Namespace, out: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One run of ``tree``'s own benchmark; (its results, what this script measured)."""
    command = [
        sys.executable,
        str(tree / "benchmarks" / "run.py"),
        "--only",
        "batch_cost,throughput",
        "--repeat",
        "1",
        "--no-plot",
        "--out",
        str(out),
    ]
    if args.rows:
        command += ["--rows", str(args.rows)]
    if args.quick:
        command.append("--quick")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with fresh_database(admin_url) as url:
        pg_before = settled_postgres_s()
        started = time.perf_counter()
        process = subprocess.Popen([*command, "--url", url], cwd=tree, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        pg_after = settled_postgres_s()
    process.returncode = os.waitstatus_to_exitcode(status)
    own = {
        "returncode": process.returncode,
        "wall_s": round(seconds, 2),
        # run.py and every descendant it waited for (its Spark JVM and workers, when
        # reaped); the server's backends are "postgres"
        "run_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "postgres_cpu_s": None
        if pg_before is None or pg_after is None
        else round(pg_after - pg_before, 2),
    }
    results: dict[str, Any] = {}
    if out.is_file():
        results = json.loads(out.read_text())
    return results, own


def measures_of(results: dict[str, Any], own: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(group, name) -> value, from one run."""
    found: dict[tuple[str, str], float] = {}
    cost = results.get("measures", {}).get("batch_cost", {})
    counted = cost.get("statements") or {}
    for kind, value in (counted.get("statements_per_batch") or {}).items():
        found["statements", f"statements/batch: {kind}"] = value
    burst = counted.get("driver_commit_statements") or {}
    if burst.get("median") is not None:
        found["statements", "statements/batch: driver commit, one batch"] = burst["median"]
    for kind, value in (counted.get("connections_per_batch") or {}).items():
        found["connections", f"connections/batch: {kind}"] = value
    for row in results.get("measures", {}).get("throughput", []) or []:
        for group, value in (row.get("cpu_s_of_median_run") or {}).items():
            found["cpu", f"CPU s: {row['method']}: {group}"] = value
    for key in ("postgres_cpu_s", "run_cpu_s"):
        if own.get(key) is not None:
            found["cpu", f"CPU s per run: {key.removesuffix('_cpu_s')}"] = own[key]
    for row in results.get("measures", {}).get("throughput", []) or []:
        found["time", f"rows/s: {row['method']}"] = row["rows_per_s"]
    for sink, figures in (cost.get("sinks") or {}).items():
        for key, figure in (figures or {}).items():
            if figure and figure.get("median") is not None:
                found["time", f"batch cost ms: {sink}: {key}"] = figure["median"]
    if (counted.get("commit_ms") or {}).get("median") is not None:
        found["time", "batch cost ms: counted query: commit_ms"] = counted["commit_ms"]["median"]
    return found


def spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"values": [], "median": None, "min": None, "max": None}
    return {
        "values": values,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measure, both sides. A session kind a run's log has no statement or connection
    of counts 0 in it (when its statements were counted at all); a CPU group that is 0 in
    every run of both sides is left out."""
    keys = {key for run in runs for key in run["measures"]}
    per: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in runs:
        counted = any(group == "statements" for group, _ in run["measures"])
        for key in keys:
            value = run["measures"].get(key)
            if value is None and counted and key[0] in ("statements", "connections"):
                value = 0.0
            if value is not None:
                per.setdefault(key, {CURRENT: [], BASE: []})[run["side"]].append(value)
    per = {
        key: sides
        for key, sides in per.items()
        if key[0] != "cpu" or any(sides[CURRENT] + sides[BASE])
    }
    rows = []
    for (group, name), sides in sorted(per.items(), key=lambda i: (ORDER.index(i[0][0]), i[0][1])):
        current, base = spread(sides[CURRENT]), spread(sides[BASE])
        ratio = None
        if current["median"] is not None and base["median"]:
            ratio = current["median"] / base["median"]
        rows.append({"group": group, "measure": name, CURRENT: current, BASE: base, "ratio": ratio})
    return rows


def fmt(side: dict[str, Any]) -> str:
    if side["median"] is None:
        return "-"
    return f"{side['median']:.4g} ({side['min']:.4g}-{side['max']:.4g})"


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['command']}  ({result['date']})")
    print(f"current {result['current']['commit'][:10]} vs base {result['base']['commit'][:10]}")
    print(f"{'measure':<58} {'base: median (min-max)':>26} {'current':>26} {'ratio':>7}")
    for row in result["measures"]:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['measure'][:58]:<58} {fmt(row[BASE]):>26} {fmt(row[CURRENT]):>26} {ratio:>7}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "rounds": args.rounds,
        "rows": args.rows,
        "quick": args.quick,
        "current": {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--short"))},
        "base": {"revision": args.commit, "commit": git("rev-parse", args.commit)},
    }
    runs: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="sqlsink-compare-"))
    try:
        with base_tree(args.commit, scratch) as base, postgres(None, scratch / "pg") as admin:
            trees = {CURRENT: TREE, BASE: base}
            for number in range(1, args.rounds + 1):
                order = (BASE, CURRENT) if number % 2 else (CURRENT, BASE)
                for side in order:
                    say(f"round {number}/{args.rounds}: {side}")
                    out = scratch / f"{side}-{number}.json"
                    results, own = run_side(trees[side], admin, args, out)
                    runs.append(
                        {
                            "side": side,
                            "round": number,
                            **own,
                            "errors": results.get("errors", {}),
                            "measures": measures_of(results, own),
                        }
                    )
                    say(f"round {number}: {side}: exit {own['returncode']}, {own['wall_s']} s")
        result["postgres_cpu_watched"] = postgres_s() is not None
    finally:
        if args.keep:
            say(f"kept the runs' files in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    result["measures"] = summarize(runs)
    result["runs"] = [
        {**run, "measures": {f"{g}: {n}": v for (g, n), v in run["measures"].items()}}
        for run in runs
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    say(f"wrote {args.out}")
    print_table(result)
    return 0 if all(run["returncode"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
