"""Where a 500,000-row micro-batch of ``format("sqlsink")`` spends its time.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/batch_split.py            # 2,000,000 rows, 3 rounds
    PYTHONPATH=$PWD .venv/bin/python benchmarks/batch_split.py --quick    # 200,000 rows, 1 round

The issue-27 shape: 8 Parquet files, ``maxFilesPerTrigger=2`` (4 batches, 2 partitions each,
no shuffle), ``exactly_once`` append into a table with a bigint primary key, PostgreSQL with
``shared_buffers = 1GB``. Each round runs, alternated on one server and one SparkSession:

* ``noop``: Spark's ``noop`` sink (Spark's floor: no Python at all);
* ``drain``: a Python data source whose tasks read every Arrow batch and write nothing (the
  floor of any Python sink: the JVM's Arrow hand-off and the Python worker);
* ``sqlsink``: the sink, its partitions timed by ``SQLSINK_TIMING_DIR``
  (``sqlsink/postgres/timing.py``: Arrow wait, session, encode, send, COPY's end, marker,
  PREPARE, the participant's check after it);
* ``copy``: one binary COPY of the same rows from one process (psycopg ``write_row`` of
  Python tuples prepared beforehand, as ``throughput.py``'s ceiling), and ``copy_encoded``:
  the same COPY fed the sink's encoded buffers (encoded beforehand: the server's own cost).

Every run has the CPU seconds of each process group (``cpu.CpuMeter``). The split is per
batch: the trigger's wall (Spark's progress), the partitions' phases (the mean of a batch's
partitions, which run at once on the 2 cores), Spark before the first partition starts and
after the last one ends (planning, the task launch, the driver's commit, the offsets).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import server
from cpu import CpuMeter
from workload import ensure_dataset, load_tuples

from sqlsink.postgres.timing import ENV as TIMING_ENV

WORK = Path(__file__).resolve().parent / "work"
PHASES = (
    "arrow_wait",
    "session",
    "begin",
    "encode",
    "send",
    "copy_end",
    "marker",
    "prepare",
    "after_prepare",
)


def drain_source() -> type:
    """A Python streaming data source that reads its input and writes nothing."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )

    class DrainWriter(DataSourceStreamArrowWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            from pyspark import TaskContext

            started_at, started = time.time(), time.perf_counter()
            rows = sum(batch.num_rows for batch in iterator)
            directory = os.environ.get(TIMING_ENV)
            ctx = TaskContext.get()
            if directory and ctx is not None:  # the same record as the sink's partitions
                record = {
                    "batch": int(ctx.getLocalProperty("streaming.sql.batchId") or -1),
                    "partition": ctx.partitionId(),
                    "rows": rows,
                    "started_at": started_at,
                    "wall": {"total": time.perf_counter() - started},
                    "cpu": {},
                }
                with open(os.path.join(directory, f"drain-{os.getpid()}.jsonl"), "a") as out:
                    out.write(json.dumps(record) + "\n")
            return WriterCommitMessage()

        def commit(self, messages: list[Any], batchId: int) -> None:
            pass

        def abort(self, messages: list[Any], batchId: int) -> None:
            pass

    class DrainSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_drain"

        def streamWriter(self, schema: Any, overwrite: bool) -> DrainWriter:
            return DrainWriter()

    return DrainSource


def run_stream(spark: Any, source: Path, fmt: str, options: dict[str, str], work: Path) -> Any:
    checkpoint = work / f"ckpt-{fmt}-{time.time_ns()}"
    frame = (
        spark.readStream.schema("id BIGINT, ts TIMESTAMP, n INT, x DOUBLE, s STRING")
        .option("maxFilesPerTrigger", 2)
        .parquet(str(source))
    )
    writer = frame.writeStream.format(fmt).option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{fmt}: {query.exception()}")
    return seconds, list(query.recentProgress)


def triggers(progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch with rows: its start (epoch s), wall and Spark's own durations."""
    out = []
    for p in progress:
        if not p.get("numInputRows"):
            continue
        start = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        durations = p["durationMs"]
        out.append(
            {
                "batch": p["batchId"],
                "rows": p["numInputRows"],
                "start": start,
                "wall": durations.get("triggerExecution", 0) / 1000,
                "add_batch": durations.get("addBatch", 0) / 1000,
            }
        )
    return out


def take_parts(directory: Path) -> list[dict[str, Any]]:
    """The partitions' records written since the last call (then removed)."""
    parts = []
    for path in directory.glob("*.jsonl"):
        parts += [json.loads(line) for line in path.read_text().splitlines() if line]
        path.unlink()
    return parts


def split_batches(batches: list[dict[str, Any]], parts: list[dict[str, Any]]) -> dict[str, float]:
    """The mean over batches of each part's seconds per batch."""
    by_batch: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for part in parts:
        by_batch[part["batch"]].append(part)
    rows: list[dict[str, float]] = []
    for batch in batches:
        mine = by_batch.get(batch["batch"], [])
        if not mine:
            continue
        row = {"wall": batch["wall"]}
        for phase in (*PHASES, "total"):
            row[phase] = statistics.fmean(p["wall"].get(phase, 0.0) for p in mine)
        for phase in ("encode", "send", "arrow_wait", "total"):
            row[phase + "_cpu"] = statistics.fmean(p["cpu"].get(phase, 0.0) for p in mine)
        row["other"] = row["total"] - sum(row[phase] for phase in PHASES)
        first_start = min(p["started_at"] for p in mine)
        last_end = max(p["started_at"] + p["wall"]["total"] for p in mine)
        row["spark_before"] = first_start - batch["start"]
        row["spark_after"] = batch["start"] + batch["wall"] - last_end
        row["partition_span"] = last_end - first_start
        rows.append(row)
    if not rows:
        return {}
    return {key: round(statistics.fmean(r[key] for r in rows), 4) for key in rows[0]}


def copy_encoded(url: str, dataset: Any) -> float:
    from copyload import Layout, encode_sessions, load_at_once, read_sorted

    sessions = encode_sessions(read_sorted(dataset), Layout(1, rows_per_write=10_000))
    return load_at_once(url, server.TABLE, sessions)


def measure(name: str, work: Any) -> dict[str, Any]:
    with CpuMeter() as cpu:
        started = time.perf_counter()
        extra = work()
    result = {"seconds": round(time.perf_counter() - started, 3), "cpu": cpu.split}
    if isinstance(extra, dict):
        result.update(extra)
    print(f"  {name:13s} {result['seconds']:7.2f} s  cpu {cpu.split}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 1 round")
    parser.add_argument("--only", default="noop,drain,sqlsink,copy,copy_encoded")
    parser.add_argument("--max-records-per-batch", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 200_000, 1
    methods = args.only.split(",")
    server.SERVER_SETTINGS["shared_buffers"] = "'1GB'"
    work = Path(tempfile.mkdtemp(prefix="batch-split-"))
    timing_dir = work / "timing"
    timing_dir.mkdir()
    os.environ[TIMING_ENV] = str(timing_dir)  # the Python workers inherit it
    dataset = ensure_dataset(WORK / "data", "split", 50_000_000, args.rows, args.files)
    tuples = load_tuples(dataset) if "copy" in methods else []
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    try:
        with server.postgres(None, work / "pg") as url:
            server.recreate_table(url)
            from streaming import start_session

            spark = start_session()
            if args.max_records_per_batch:
                spark.conf.set(
                    "spark.sql.execution.arrow.maxRecordsPerBatch", args.max_records_per_batch
                )
            spark.dataSource.register(drain_source())
            sink = {"url": url, "table": server.TABLE, "semantic": "exactly_once"}
            for name in ("noop", "sqlsink"):  # warm the workers and the JIT (not counted)
                server.reset_table(url)
                run_stream(spark, dataset.path, name, sink if name == "sqlsink" else {}, work)
            take_parts(timing_dir)
            for number in range(args.rounds):
                print(f"round {number + 1}/{args.rounds}", flush=True)
                for name in methods:
                    server.reset_table(url)
                    results[name].append(run_one(name, spark, url, dataset, tuples, sink, work))
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(results, args.rows)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "rows": args.rows,
        "load_average": os.getloadavg(),
        "runs": results,
        "summary": summary,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def run_one(
    name: str, spark: Any, url: str, dataset: Any, tuples: Any, sink: dict[str, str], work: Path
) -> dict[str, Any]:
    timing_dir = Path(os.environ[TIMING_ENV])

    def stream(fmt: str, options: dict[str, str]) -> dict[str, Any]:
        seconds, progress = run_stream(spark, dataset.path, fmt, options, work)
        return {"stream_seconds": seconds, "batches": triggers(progress)}

    if name == "copy":
        from throughput import copy_tuples

        out = measure(name, lambda: copy_tuples(url, tuples))
    elif name == "copy_encoded":
        out = measure(name, lambda: {"load_seconds": copy_encoded(url, dataset)})
    elif name in ("sqlsink", "drain"):
        take_parts(timing_dir)
        out = measure(name, lambda: stream("bench_drain" if name == "drain" else name, sink))
        parts = take_parts(timing_dir)
        out["timed_rows"] = sum(p["rows"] for p in parts)
        out["split"] = split_batches(out["batches"], parts)
    else:
        out = measure(name, lambda: stream(name, {}))
    if name != "noop" and name != "drain":
        server.check_rows(url, dataset.rows, name)
    return out


def summarise(results: dict[str, list[dict[str, Any]]], rows: int) -> dict[str, Any]:
    """Medians over rounds: seconds per 500,000-row batch, CPU s per million rows."""
    per_batch = 500_000 / rows
    summary: dict[str, Any] = {}
    for name, runs in results.items():
        entry: dict[str, Any] = {
            "seconds": statistics.median(r["seconds"] for r in runs),
            "seconds_all": [r["seconds"] for r in runs],
            "s_per_500k": round(statistics.median(r["seconds"] for r in runs) * per_batch, 3),
        }
        if runs[0].get("batches"):
            walls = [statistics.median(b["wall"] for b in r["batches"]) for r in runs]
            entry["trigger_wall_median"] = round(statistics.median(walls), 3)
            entry["span_all"] = [round(span(r["batches"]), 3) for r in runs]
        if runs[0].get("load_seconds"):
            entry["load_seconds_all"] = [r["load_seconds"] for r in runs]
        groups = sorted({g for r in runs for g in r["cpu"]})
        entry["cpu_s_per_million"] = {
            g: round(statistics.median(r["cpu"].get(g, 0.0) for r in runs) * 1e6 / rows, 3)
            for g in groups
        }
        if runs[0].get("split"):
            keys = runs[0]["split"].keys()
            entry["split"] = {
                k: round(statistics.median(r["split"][k] for r in runs), 4) for k in keys
            }
        summary[name] = entry
    if "copy" in summary:
        for name in ("sqlsink", "drain", "noop"):
            if name not in results:
                continue
            # the sink's rate from its first batch's start to its last batch's end (the
            # query's start and stop left out), against the COPY of the same rows, per round
            ratios = [
                c["seconds"] / span(s["batches"])
                for c, s in zip(results["copy"], results[name], strict=True)
            ]
            summary[f"ratio_to_copy_{name}"] = {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
                "all": [round(r, 3) for r in ratios],
            }
    return summary


def span(batches: list[dict[str, Any]]) -> float:
    """From the first batch's start to the last one's end."""
    return float(max(b["start"] + b["wall"] for b in batches) - min(b["start"] for b in batches))


if __name__ == "__main__":
    raise SystemExit(main())
