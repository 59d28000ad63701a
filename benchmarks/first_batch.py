"""Measure: the first micro-batch of a freshly started driver, sink against sink.

Each run is a fresh driver process (this file run as ``child``: its own JVM and
SparkSession, as a user's job starts) streaming the same small Parquet source with
``trigger(availableNow=True)`` (one file: one batch) into one of

* ``noop``: Spark's own floor;
* ``drain``: a Python data source that reads its rows and writes nothing
  (``batch_split.drain_source``): the floor of any Python data source sink, whose
  planning, tasks and commit Spark runs in Python workers it starts for them;
* ``jdbc``: Spark's JDBC writer called from ``foreachBatch`` (``peers.jdbc_each_batch``;
  PostgreSQL's JDBC driver on the class path: scripts/ensure-jdbc.sh, run by make setup);
* ``sqlsink``: ``format("sqlsink")``, ``exactly_once``, append;
* ``writer``: ``sqlsink.ForeachBatchWriter(...).to(table)``, append;

each twice: **new** (a fresh checkpoint and a fresh table; the database's commit log is
installed once before the rounds, so no round pays for it) and **restarted** (a second
file added to the source, the same checkpoint, a second driver). Per run: the first
batch's ``durationMs`` (Spark's progress), the wall time from ``start()`` to the batch's
rows being visible in the table (polled every 5 ms by a session opened before
``start()``; for ``noop`` and ``drain`` the query's end), and the child's session start.
The sinks go round-robin, rotated each round; medians with min and max.

    .venv/bin/python benchmarks/first_batch.py --rounds 5 --out /tmp/first.json
    .venv/bin/python benchmarks/run.py --only first_batch --quick

The machine's other load moves every wall time: read the figures beside ``noop``'s of
the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from streaming import JDBC_JAR  # noqa: E402
from workload import SPARK_SCHEMA, TABLE_DDL, ensure_dataset  # noqa: E402

SINKS = ("noop", "drain", "jdbc", "sqlsink", "writer")
NO_TABLE = ("noop", "drain")  # sinks with no table: their time is the query's end
STAGES = ("new", "restarted")
TABLE = "first_rows"
CHILD_TIMEOUT_S = 300


# ---------------------------------------------------------------- the child: one driver


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh driver: start Spark, run the query, time its first batch."""
    began = time.perf_counter()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import psycopg
    from pyspark.sql import SparkSession

    sink, url = spec["sink"], spec["url"]
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"sqlsink-first-batch-{sink}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if sink == "jdbc":
        builder = builder.config("spark.jars", spec["jar"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - began
    frame = spark.readStream.schema(SPARK_SCHEMA).parquet(spec["source"])
    stream = frame.writeStream.option("checkpointLocation", spec["checkpoint"])
    if sink == "noop":
        stream = stream.format("noop")
    elif sink == "drain":
        from batch_split import drain_source

        spark.dataSource.register(drain_source())
        stream = stream.format("bench_drain")
    elif sink == "sqlsink":
        import sqlsink

        sqlsink.register(spark)
        stream = (
            stream.format("sqlsink")
            .option("url", url)
            .option("table", spec["table"])
            .option("semantic", "exactly_once")
        )
    elif sink == "writer":
        import sqlsink

        writer = sqlsink.ForeachBatchWriter(
            url=url, sink_id=spec["sink_id"], checkpoint_location=spec["checkpoint"]
        )
        stream = stream.foreachBatch(writer.to(spec["table"]))
    elif sink == "jdbc":
        from peers import jdbc_each_batch

        stream = stream.foreachBatch(jdbc_each_batch(url, spec["table"]))
    else:
        raise ValueError(sink)
    visible: list[float] = []
    poller = None
    if sink not in NO_TABLE:
        conn = psycopg.connect(url, autocommit=True)
        poller = threading.Thread(
            target=poll_rows, args=(conn, spec["table"], spec["expect"], visible), daemon=True
        )
    started = time.perf_counter()
    query = stream.trigger(availableNow=True).start()
    if poller is not None:
        poller.start()
    query.awaitTermination(CHILD_TIMEOUT_S)
    ended = time.perf_counter()
    if query.isActive:
        query.stop()
        raise RuntimeError(f"{sink}: the query did not end within {CHILD_TIMEOUT_S} s")
    if query.exception() is not None:
        raise RuntimeError(f"{sink}: the query failed: {query.exception()}")
    if poller is not None:
        poller.join(30)
        if not visible:
            raise RuntimeError(f"{sink}: {spec['expect']} rows never became visible")
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    if not progress:
        raise RuntimeError(f"{sink}: no batch with rows in the query's progress")
    first = progress[0]
    result = {
        "session_s": session_s,
        "start_to_end_s": ended - started,
        "start_to_visible_s": (visible[0] if visible else ended) - started,
        "batch_id": first["batchId"],
        "rows": first["numInputRows"],
        "duration_ms": dict(first["durationMs"]),
    }
    spark.stop()
    return result


def poll_rows(conn: Any, table: str, expect: int, visible: list[float]) -> None:
    """Every 5 ms until the table holds ``expect`` rows (at most CHILD_TIMEOUT_S)."""
    deadline = time.perf_counter() + CHILD_TIMEOUT_S
    while time.perf_counter() < deadline:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        if row is not None and row[0] >= expect:
            visible.append(time.perf_counter())
            return
        time.sleep(0.005)


# ---------------------------------------------------------------- the parent


def run_child(spec: dict[str, Any], log: Path) -> dict[str, Any]:
    out = log.with_suffix(".json")
    tree = spec.get("tree") or str(HERE.parent)  # whose sqlsink the driver and workers run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, str(HERE)])}
    with log.open("w") as sink_log:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "child", json.dumps(spec), str(out)],
            stdout=sink_log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=CHILD_TIMEOUT_S + 120,
            check=False,
        )
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"first batch into {spec['sink']} failed ({log}):\n{tail}")
    return dict(json.loads(out.read_text()))


def fresh_table(url: str, table: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(TABLE_DDL.format(table=table))


def install_commit_log(url: str) -> None:
    import psycopg

    from sqlsink.postgres.schema import ensure_schema

    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)


def measure_first_batch(
    url: str,
    work: Path,
    rounds: int,
    rows: int,
    attempt: Callable[[str, Callable[[], Any]], Any],
    sinks: tuple[str, ...] = SINKS,
    tree: str | None = None,
    rotate: int = 0,
) -> dict[str, Any]:
    """``rounds`` rounds over ``sinks`` (rotated each round), each new then restarted;
    ``tree``: the source tree whose sqlsink the drivers import (default: this one)."""
    data = ensure_dataset(work / "data", "first", 6_000_000_000, 2 * rows, 2)
    files = sorted(data.path.glob("*.parquet"))
    skipped = {}
    if "jdbc" in sinks and not JDBC_JAR.is_file():
        skipped["jdbc"] = f"{JDBC_JAR} missing: run scripts/ensure-jdbc.sh (make setup)"
        sinks = tuple(s for s in sinks if s != "jdbc")
    install_commit_log(url)  # a new sink, not a new database: every round alike
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {stage: [] for stage in STAGES} for s in sinks
    }
    for number in range(rounds):
        turn = (number + rotate) % len(sinks)
        order = sinks[turn:] + sinks[:turn]
        for sink in order:
            name = f"{sink}-{number}-{uuid.uuid4().hex[:8]}"
            source, checkpoint = work / "first" / name / "source", work / "first" / name / "chk"
            source.mkdir(parents=True)
            fresh_table(url, TABLE)
            spec = {
                "sink": sink,
                "url": url,
                "table": TABLE,
                "source": str(source),
                "checkpoint": str(checkpoint),
                "sink_id": f"first-{name}",
                "jar": str(JDBC_JAR),
                "tree": tree,
            }
            for stage, file in zip(STAGES, files, strict=True):
                shutil.copy(file, source / file.name)
                spec["expect"] = rows if stage == "new" else 2 * rows
                log = work / "first" / name / f"{stage}.log"
                got = attempt(
                    f"first batch: {sink} {stage} (round {number + 1}/{rounds})",
                    lambda spec=spec, log=log: run_child(dict(spec), log),  # type: ignore[misc]
                )
                if got is None:
                    break  # no restart of a sink whose first start failed
                runs[sink][stage].append(got)
    return {"rows": rows, "rounds": rounds, "skipped": skipped, "sinks": summarize(runs)}


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sink, stages in runs.items():
        out[sink] = {}
        for stage, found in stages.items():
            keys = sorted({k for r in found for k in r["duration_ms"]})
            out[sink][stage] = {
                "runs": len(found),
                "start_to_visible_ms": spread([r["start_to_visible_s"] * 1e3 for r in found]),
                "session_ms": spread([r["session_s"] * 1e3 for r in found]),
                "duration_ms": {
                    k: spread([float(r["duration_ms"].get(k, 0)) for r in found]) for k in keys
                },
                "raw": found,
            }
    return out


def print_table(result: dict[str, Any]) -> None:
    print(
        f"first batch of {result['rows']:,} rows, {result['rounds']} rounds; "
        "median (min-max) ms; machine shared"
    )
    print(
        "| sink | start | start() to rows visible | triggerExecution | addBatch "
        "| queryPlanning | driver start |"
    )
    print("|---|---|---|---|---|---|---|")

    def cell(s: dict[str, float] | None) -> str:
        return "-" if s is None else f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"

    for sink, stages in result["sinks"].items():
        for stage, figures in stages.items():
            d = figures["duration_ms"]
            print(
                f"| {sink} | {stage} | {cell(figures['start_to_visible_ms'])} "
                f"| {cell(d.get('triggerExecution'))} | {cell(d.get('addBatch'))} "
                f"| {cell(d.get('queryPlanning'))} | {cell(figures['session_ms'])} |"
            )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "child":
        result = child(json.loads(args[1]))
        Path(args[2]).write_text(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--sinks", default=",".join(SINKS))
    parser.add_argument("--url", help="an existing PostgreSQL (else an embedded one)")
    parser.add_argument(
        "--trees",
        help="LABEL=PATH,...: source trees of sqlsink (e.g. a worktree of an earlier commit) "
        "run alternately, one round each in turn, on the same server",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "first_batch.json")
    parsed = parser.parse_args(args)
    from server import postgres

    work = HERE / "work"
    shutil.rmtree(work / "first", ignore_errors=True)
    errors: dict[str, str] = {}

    def attempt(name: str, measure: Callable[[], Any]) -> Any:
        print(f"[first {time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        try:
            return measure()
        except Exception as exc:
            errors[name] = str(exc)[-2000:]
            print(errors[name], flush=True)
            return None

    sinks = tuple(parsed.sinks.split(","))
    trees = dict(t.split("=", 1) for t in parsed.trees.split(",")) if parsed.trees else {}
    with postgres(parsed.url, work / "pg-first") as url:
        if not trees:
            result = measure_first_batch(url, work, parsed.rounds, parsed.rows, attempt, sinks)
        else:
            per_tree: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
            for number in range(parsed.rounds):
                for label, path in trees.items():
                    got = measure_first_batch(
                        url, work, 1, parsed.rows, attempt, sinks, path, rotate=number
                    )
                    per_tree[label].append(got)
            result = {"trees": {k: merge(v) for k, v in per_tree.items()}}
    result["errors"] = errors
    result["load_average_at_end"] = list(os.getloadavg())
    parsed.out.parent.mkdir(parents=True, exist_ok=True)
    parsed.out.write_text(json.dumps(result, indent=1))
    for label, found in result.get("trees", {"": result}).items():
        print(f"== {label} ({trees.get(label, HERE.parent)})" if label else "")
        print_table(found)
    return 1 if errors else 0


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One-round results of one tree, as if measured in one call."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for result in results:
        for sink, stages in result["sinks"].items():
            for stage, figures in stages.items():
                runs.setdefault(sink, {}).setdefault(stage, []).extend(figures["raw"])
    return {
        "rows": results[0]["rows"],
        "rounds": len(results),
        "skipped": results[0]["skipped"],
        "sinks": summarize(runs),
    }


if __name__ == "__main__":
    sys.exit(main())
