"""Commit against commit: this tree's package and an earlier commit's, alternately, on one server.

    flock /tmp/sqlsink-spark.lock .venv/bin/python benchmarks/compare.py b5cc5c7
    .venv/bin/python benchmarks/compare.py HEAD~3 --rounds 3 --rows 200000 --out /tmp/ab.json
    .venv/bin/python benchmarks/compare.py main --quick --rounds 1      # smoke, tiny sizes

The named commit is checked out in a temporary git worktree (made and removed here). Both
sides run THIS tree's measuring code (``benchmarks/run.py --only guard_cost,steady`` by
default, ``--only`` to choose) against their own package: ``PYTHONPATH`` is the side's tree,
which Spark's Python workers inherit; every run records which ``sqlsink`` its driver and a
task's Python worker imported, and a run that imported another tree's fails. So an older
commit without a measure can still be measured (the measuring code only uses what every
version has: the options, the commit log's ``commit_ms``, the server's log). One embedded
PostgreSQL (``shared_buffers = 1GB``) serves every run; each run gets a fresh database (a
commit log another version migrated is never handed to the other side). Each round runs
both sides in alternating order (A B, then B A, ...), so a drift of the machine over the
run falls on both sides alike.

The measures: ``guard_cost`` is the per-batch cost cut to a guard's size (``exactly_once``
only, one query of 10-row batches, then the statements and connections per batch from the
server's log); ``steady`` is issue 27's steady-state append (``benchmarks/steady.py``: CPU
seconds per million rows of each process group, the per-partition write time, the driver's
time per batch, the rate beside a COPY and ``noop``), one run per side per round.

Per measure: the values of each side, their median, min, max and relative spread
((max - min) / median), and the ratio of the medians (this tree / the earlier commit). The
measures that noise does not move come first: statements and connections per batch by
session kind, then CPU seconds, then the partitions' write time, then the driver's time per
batch, then the rates and wall times. Writes the JSON (with the command and the date) and
prints a table.
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
from steady import SERVER_OVERRIDES

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
CURRENT, BASE = "current", "base"
# the groups the measures come in, the noise-immune ones first
ORDER = ("statements", "connections", "cpu", "write", "driver", "time")
ONLY = "guard_cost,steady"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=5, help="runs per side (5)")
    parser.add_argument("--rows", type=int, help="rows of the steady-state append (2,000,000)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="steady's measured rounds per run, median (3)"
    )
    parser.add_argument("--only", default=ONLY, help=f"run.py's measures ({ONLY})")
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
    """A detached worktree of ``commit`` (its package is imported from there); removed after."""
    path = scratch / "base"
    git("worktree", "add", "--detach", str(path), commit)
    try:
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
    """One run of this tree's benchmark against ``tree``'s package; (its results, what this
    script measured)."""
    command = [
        sys.executable,
        str(HERE / "run.py"),
        "--only",
        args.only,
        "--repeat",
        str(args.repeat),
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
        # cwd = the side's tree: Spark starts its Python workers with ``python -m``, which
        # puts the working directory before PYTHONPATH on their sys.path
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
    own["imported"], own["wrong_tree"] = check_imports(results, tree)
    return results, own


def check_imports(results: dict[str, Any], tree: Path) -> tuple[dict[str, str], list[str]]:
    """Which sqlsink each measure's driver and Python worker imported, and every one that is
    not ``tree``'s (or missing: a run that cannot say which package it measured)."""
    imported: dict[str, str] = {}
    wrong = []
    root = tree.resolve() / "sqlsink"
    for name, measure in (results.get("measures") or {}).items():
        found = (measure or {}).get("sqlsink_imported") if isinstance(measure, dict) else None
        for where in ("driver", "worker"):
            path = (found or {}).get(where)
            imported[f"{name}: {where}"] = path or "?"
            if path is None or not Path(path).resolve().is_relative_to(root):
                wrong.append(f"{name}: {where} imported {path or 'an unknown sqlsink'}")
    if not imported:
        wrong.append("no measure recorded which sqlsink it imported")
    return imported, wrong


def group_of_steady(name: str) -> str:
    if name.startswith("cpu s/Mrow"):
        return "cpu"
    if name.startswith("partition write") or name.startswith("COPY statement"):
        return "write"
    if name.startswith(("ms/batch", "first batch ms")):
        return "driver"
    return "time"


def measures_of(results: dict[str, Any], own: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(group, name) -> value, from one run."""
    found: dict[tuple[str, str], float] = {}
    measures = results.get("measures", {})
    cost = measures.get("guard_cost") or measures.get("batch_cost") or {}
    counted = cost.get("statements") or {}
    per_kind = counted.get("statements_per_batch") or {}
    for kind, value in per_kind.items():
        found["statements", f"statements/batch: {kind}"] = value
    if per_kind:
        found["statements", "statements/batch: every session"] = sum(per_kind.values())
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
    for kind, figures in ((measures.get("steady") or {}).get("summary") or {}).items():
        for name, figure in figures.items():
            found[group_of_steady(name), f"steady {kind}: {name}"] = figure["median"]
    return found


def spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"values": [], "median": None, "min": None, "max": None, "spread": None}
    median = statistics.median(values)
    return {
        "values": values,
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread": (max(values) - min(values)) / median if median else None,
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
    share = "" if side["spread"] is None else f" {side['spread']:.0%}"
    return f"{side['median']:.4g} ({side['min']:.4g}-{side['max']:.4g}){share}"


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['command']}  ({result['date']})")
    print(f"current {result['current']['commit'][:10]} vs base {result['base']['commit'][:10]}")
    print(f"{'measure':<58} {'base: median (min-max) spread':>32} {'current':>32} {'ratio':>7}")
    for row in result["measures"]:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['measure'][:58]:<58} {fmt(row[BASE]):>32} {fmt(row[CURRENT]):>32} {ratio:>7}")
    for run in result["runs"]:
        if run["wrong_tree"] or run["returncode"] != 0 or run["errors"]:
            print(f"!! {run['side']} round {run['round']}: exit {run['returncode']}, ", end="")
            print(f"{run['errors'] or ''} {'; '.join(run['wrong_tree'])}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "rounds": args.rounds,
        "repeat": args.repeat,
        "rows": args.rows,
        "quick": args.quick,
        "only": args.only,
        "current": {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--short"))},
        "base": {"revision": args.commit, "commit": git("rev-parse", args.commit)},
    }
    runs: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="sqlsink-compare-"))
    try:
        with (
            base_tree(args.commit, scratch) as base,
            postgres(None, scratch / "pg", SERVER_OVERRIDES) as admin,
        ):
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
                    for wrong in own["wrong_tree"]:
                        say(f"round {number}: {side}: WRONG PACKAGE: {wrong}")
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
    ok = all(run["returncode"] == 0 and not run["wrong_tree"] for run in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
