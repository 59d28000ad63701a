"""The foreachBatch writer's ordering by the key (order_by_key), on and off (issue 14).

    python benchmarks/range_partition.py [--rows 1000000] [--rounds 3] [--partitions 2]

The batch DataFrame comes from Parquet files through ``repartition(n)`` (round robin,
as users set parallelism), into the benchmark's table with a bigint primary key, in
four batches, by ``ForeachBatchWriter(...).to(table)`` with ``order_by_key`` True
(the default: ``sortWithinPartitions("id")`` before the write) and False (the
round-robin partitions as given). Runs of the two alternate; the table is emptied and
checkpointed before each. Also the same DataFrames into Spark's ``noop`` sink (what
Spark itself costs) and a single-process binary COPY of the rows (the server's floor).
Writes ``benchmarks/results/range_partition.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from report import machine_facts  # noqa: E402
from server import TABLE, check_rows, postgres, recreate_table, reset_table  # noqa: E402
from workload import ensure_dataset, make_rows  # noqa: E402

BATCHES = 4


def spark_session(partitions: int) -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{max(partitions, 2)}]")
        .appName("sqlsink-range-partition-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def batches(spark: Any, data: Path, partitions: int) -> list[Any]:
    """Four batch DataFrames (files of the data set), each repartitioned round robin."""
    files = sorted(str(p) for p in data.glob("*.parquet"))
    per = max(len(files) // BATCHES, 1)
    groups = [files[i * per : (i + 1) * per] for i in range(BATCHES)]
    return [spark.read.parquet(*g).repartition(partitions) for g in groups if g]


def run_writer(url: str, frames: list[Any], ranged: bool) -> float:
    import sqlsink

    reset_table(url)
    writer = sqlsink.ForeachBatchWriter(
        url=url,
        sink_id=f"bench-{uuid.uuid4().hex[:12]}",
        query_id=str(uuid.uuid4()),
        order_by_key=ranged,
    )
    function = writer.to(TABLE)
    started = time.perf_counter()
    for batch_id, frame in enumerate(frames):
        function(frame, batch_id)
    return time.perf_counter() - started


def run_noop(frames: list[Any]) -> float:
    started = time.perf_counter()
    for frame in frames:
        frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def run_copy(url: str, first: int, rows: int) -> float:
    import psycopg

    table = make_rows(first, rows)
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    reset_table(url)
    started = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        statement = f"COPY {TABLE} (id, ts, n, x, s) FROM STDIN (FORMAT BINARY)"
        with cur.copy(statement) as copy:
            copy.set_types(["int8", "timestamptz", "int4", "float8", "text"])
            for row in zip(*columns, strict=True):
                copy.write_row(row)
    return time.perf_counter() - started


def summary(seconds: list[float], rows: int) -> dict[str, Any]:
    median = statistics.median(seconds)
    return {
        "median_s": median,
        "min_s": min(seconds),
        "max_s": max(seconds),
        "rows_per_s": rows / median,
        "runs_s": seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--url", default=None, help="a server to use (default: embedded)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "range_partition.json")
    args = parser.parse_args()
    work = HERE / "work"
    work.mkdir(exist_ok=True)
    data = ensure_dataset(work / "data", f"range-{args.rows}", 0, args.rows, BATCHES * 4)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=work) as tmp, postgres(args.url, Path(tmp)) as url:
        recreate_table(url)
        spark = spark_session(args.partitions)
        frames = batches(spark, data.path, args.partitions)
        runs: dict[str, list[float]] = {"ranged": [], "round_robin": [], "noop": [], "copy": []}
        run_writer(url, frames, True)  # warm-up: JIT, worker start, the commit log
        for _ in range(args.rounds):
            for ranged in (True, False):
                seconds = run_writer(url, frames, ranged)
                check_rows(url, args.rows, "range partition bench")
                runs["ranged" if ranged else "round_robin"].append(seconds)
            runs["noop"].append(run_noop(frames))
            runs["copy"].append(run_copy(url, 0, args.rows))
        spark.stop()
    results = {name: summary(seconds, args.rows) for name, seconds in runs.items()}
    document = {
        "config": vars(args) | {"out": str(args.out), "batches": BATCHES},
        "machine": machine_facts() | {"load_average_at_start": load},
        "results": results,
        "ratio_round_robin_over_ranged": results["round_robin"]["median_s"]
        / results["ranged"]["median_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    for name, figure in results.items():
        print(
            f"{name:12s} median {figure['median_s']:6.2f} s  ({figure['rows_per_s']:>9,.0f} rows/s)"
            f"  min {figure['min_s']:.2f}  max {figure['max_s']:.2f}"
        )
    print(f"round robin / ranged: {document['ratio_round_robin_over_ranged']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
