"""sqlsink benchmark: throughput, per-batch overhead, worker memory, latency, and issue 16's
interleaved-key trap, scaling, peers and per-batch cost.

    make bench                                   # = .venv/bin/python benchmarks/run.py
    .venv/bin/python benchmarks/run.py --rows 100000 --repeat 1
    .venv/bin/python benchmarks/run.py --quick --no-plot --out /tmp/x.json   # smoke, < 2 min
    .venv/bin/python benchmarks/run.py --only throughput,latency
    .venv/bin/python benchmarks/run.py --only trap,scaling,peers,batch_cost --quick   # < 1 min
    .venv/bin/python benchmarks/run.py --only first_batch --quick   # fresh drivers, ~2 min
    .venv/bin/python benchmarks/run.py --url postgresql://user@host/db       # an existing server
    .venv/bin/python benchmarks/run.py --only steady --repeat 5 --no-plot --out /tmp/s.json

Starts an embedded PostgreSQL (unless --url) and one local[2] SparkSession, generates the rows
once as Parquet under benchmarks/work/data (not timed), runs the measures, prints a table and
writes benchmarks/results/results.json and results.png. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batch_cost import measure_batch_cost
from first_batch import measure_first_batch
from first_batch import print_table as print_first_batch
from latency import measure_latency
from memory import measure_memory
from overhead import measure_batch_costs, summarize_overhead
from peers import measure_peers
from report import (
    machine_facts,
    print_report,
    ratios,
    write_json,
    write_plot,
    write_round2_plot,
)
from scaling import measure_scaling
from server import TABLE, postgres, recreate_table, reset_table, server_facts
from steady import SERVER_OVERRIDES, measure_guard_cost, measure_steady, print_steady
from streaming import JDBC_JAR, Sink, read_stream, run_available_now, spark_facts, start_session
from throughput import methods, run_rounds
from trap import measure_trap
from workload import Dataset, ensure_dataset

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
RESULTS = HERE / "results"
MEASURES = (
    "throughput",
    "overhead",
    "memory",
    "latency",
    "trap",
    "scaling",
    "peers",
    "batch_cost",
    "first_batch",
    "steady",  # issue 27: the steady-state append beside COPY and noop, --repeat runs
    "guard_cost",  # batch_cost's exactly_once alone, a guard's size (compare.py)
)
# measures that run on a server with shared_buffers = 1GB (when run.py starts it)
ONE_GB = {"steady", "guard_cost"}


@dataclass(frozen=True)
class Sizes:
    """How much each measure does; --quick shrinks everything to a smoke run."""

    rows: int
    repeat: int
    stream_files: int = 10
    small_batches: int = 30  # files of the overhead measure: batches per query
    small_batch_rows: int = 1_000
    overhead_rounds: int = 2  # queries per (sink, partitions): 2 x 30 = 60 batches
    partitions: tuple[int, ...] = (1, 2, 4)
    memory_rows: int = 200_000  # N; the second memory run has 10·N
    latency_drops: int = 7
    latency_warmup: int = 2
    # issue 16's measures
    trap_rows: int = 1_000_000  # 8 files
    trap_batches: int = 4  # of the Spark shapes
    trap_repeat: int = 3
    scaling_partitions: tuple[int, ...] = (1, 2, 4, 8)
    scaling_repeat: int = 3
    peer_rows: int = 500_000
    peer_repeat: int = 3
    cost_batches: int = 100  # steady batches per query; x cost_rounds per sink
    cost_rounds: int = 2
    cost_warmup: int = 5
    cost_counted_batches: int = 20  # the query whose statements are counted
    first_rounds: int = 3  # fresh drivers: every sink new and restarted, per round
    first_rows: int = 10_000  # the first batch's rows (one file)
    # issue 27's measures
    steady_rows: int = 2_000_000  # 8 files, 2 per batch
    steady_repeat: int = 5
    steady_warmup: int = 3  # rounds before the measured ones (the JVM's JIT)
    guard_batches: int = 20
    guard_warmup: int = 3
    guard_counted_batches: int = 6

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Sizes:
        if args.quick:
            return cls(
                rows=args.rows or 20_000,
                repeat=args.repeat or 1,
                stream_files=4,
                small_batches=3,
                small_batch_rows=100,
                overhead_rounds=1,
                partitions=(1, 2),
                memory_rows=2_000,
                latency_drops=2,
                latency_warmup=1,
                trap_rows=20_000,
                trap_batches=1,
                trap_repeat=1,
                scaling_partitions=(1, 2),
                scaling_repeat=1,
                peer_rows=10_000,
                peer_repeat=1,
                cost_batches=4,
                cost_rounds=1,
                cost_warmup=1,
                cost_counted_batches=3,
                first_rounds=1,
                steady_rows=args.rows or 8_000,
                steady_repeat=args.repeat or 1,
                steady_warmup=0,
                guard_batches=3,
                guard_warmup=1,
                guard_counted_batches=3,
            )
        rows = args.rows or 1_000_000
        repeat = args.repeat or 3
        return cls(
            rows=rows,
            repeat=repeat,
            memory_rows=max(rows // 5, 1_000),
            trap_rows=rows,
            trap_repeat=repeat,
            scaling_repeat=repeat,
            peer_rows=max(rows // 2, 1_000),
            peer_repeat=repeat,
            steady_rows=args.rows or 2_000_000,
            steady_repeat=args.repeat or 5,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, help="rows of the throughput (1,000,000) and steady (2,000,000) runs"
    )
    parser.add_argument("--repeat", type=int, help="runs per throughput number, median (3)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--url", help="an existing PostgreSQL (max_prepared_transactions > 0)")
    parser.add_argument("--only", help=f"comma-separated subset of {', '.join(MEASURES)}")
    parser.add_argument("--out", type=Path, default=RESULTS / "results.json", help="JSON file")
    parser.add_argument("--no-plot", action="store_true", help="do not write results.png")
    args = parser.parse_args(argv)
    args.only = tuple(args.only.split(",")) if args.only else MEASURES
    unknown = set(args.only) - set(MEASURES)
    if unknown:
        parser.error(f"unknown measure(s): {', '.join(sorted(unknown))}")
    return args


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Datasets:
    rows: Dataset
    small_batches: Dataset
    memory_small: Dataset
    memory_large: Dataset
    trap: Dataset
    peers: Dataset


def prepare_datasets(sizes: Sizes) -> Datasets:
    """Generated once and cached under benchmarks/work/data; disjoint id ranges."""
    root = WORK / "data"
    small_total = sizes.small_batches * sizes.small_batch_rows
    return Datasets(
        rows=ensure_dataset(root, "rows", 0, sizes.rows, sizes.stream_files),
        small_batches=ensure_dataset(
            root, "batches", 1_000_000_000, small_total, sizes.small_batches
        ),
        memory_small=ensure_dataset(root, "memory", 2_000_000_000, sizes.memory_rows, 10),
        memory_large=ensure_dataset(root, "memory", 3_000_000_000, 10 * sizes.memory_rows, 10),
        trap=ensure_dataset(root, "trap", 4_000_000_000, sizes.trap_rows, 8),
        peers=ensure_dataset(root, "peers", 5_000_000_000, sizes.peer_rows, 4),
    )


class Bench:
    """One benchmark run: the server, the session, the data, and what was measured."""

    def __init__(self, args: argparse.Namespace, sizes: Sizes, url: str, spark: Any) -> None:
        self.args, self.sizes, self.url, self.spark = args, sizes, url, spark
        self.checkpoints = WORK / "checkpoints"
        self.measures: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.load_after: dict[str, list[float]] = {}  # load average (1, 5, 15 min) after each

    def attempt(self, name: str, measure: Callable[[], Any]) -> Any:
        """Run one measure; a failure is recorded (and reported), the others still run."""
        say(f"{name} ...")
        started = time.perf_counter()
        result = None
        try:
            result = measure()
        except Exception as exc:
            traceback.print_exc()
            self.errors[name] = describe(exc)
        say(f"{name}: {time.perf_counter() - started:.0f} s")
        return result

    def record(self, name: str, measure: Callable[[], Any]) -> None:
        started = time.perf_counter()
        result = self.attempt(name, measure)
        self.timings[name] = round(time.perf_counter() - started, 1)
        self.load_after[name] = list(os.getloadavg())
        if result is not None:
            self.measures[name] = result

    def run(self, data: Datasets) -> None:
        """Memory first: its workers then carry the least from earlier runs."""
        if "memory" in self.args.only:
            self.record("memory", lambda: self.memory(data.memory_small, data.memory_large))
        if "throughput" in self.args.only:
            self.record("throughput", lambda: self.throughput(data.rows))
        if "overhead" in self.args.only:
            self.record("overhead", lambda: self.overhead(data.small_batches))
        if "latency" in self.args.only:
            self.record("latency", self.latency)
        if "trap" in self.args.only:
            self.record("trap", lambda: self.trap(data.trap))
        if "scaling" in self.args.only:
            self.record("scaling", lambda: self.scaling(data.rows))
        if "peers" in self.args.only:
            self.record("peers", lambda: self.peers(data.peers))
        if "batch_cost" in self.args.only:
            self.record("batch_cost", self.batch_cost)
        if "first_batch" in self.args.only:
            self.record("first_batch", self.first_batch)
        if "guard_cost" in self.args.only:
            self.record("guard_cost", self.guard_cost)
        if "steady" in self.args.only:
            self.record("steady", self.steady)

    def warm_up(self, data: Datasets) -> None:
        """Start the Python workers and JIT the paths once, so no measure pays for it."""
        for sink in (Sink.sqlsink(self.url, TABLE, "exactly_once"), Sink.noop()):
            reset_table(self.url)
            frame = read_stream(self.spark, data.memory_small.path).repartition(2)
            run_available_now(frame, sink, self.checkpoints)

    def throughput(self, rows: Dataset) -> list[dict[str, Any]]:
        jdbc = JDBC_JAR.is_file()
        if not jdbc:
            self.skipped["jdbc"] = f"{JDBC_JAR} missing: run scripts/ensure-jdbc.sh (make setup)"
        found = methods(self.spark, self.url, rows, self.checkpoints, jdbc)
        run_rounds(found, self.url, self.sizes.repeat, self.attempt)
        return [method.as_dict(rows.rows) for method in found if method.seconds]

    def overhead(self, batches: Dataset) -> dict[str, Any]:
        sizes = self.sizes
        costs = measure_batch_costs(
            self.spark, self.url, batches, sizes.partitions, sizes.overhead_rounds, self.checkpoints
        )
        return summarize_overhead(costs)

    def memory(self, small: Dataset, large: Dataset) -> dict[str, Any]:
        return measure_memory(self.spark, self.url, small, large, self.checkpoints)

    def latency(self) -> dict[str, Any]:
        drops, warmup = self.sizes.latency_drops, self.sizes.latency_warmup
        return measure_latency(self.spark, self.url, WORK, drops, warmup)

    def trap(self, data: Dataset) -> dict[str, Any]:
        sizes = self.sizes
        return measure_trap(
            self.spark,
            self.url,
            data,
            self.checkpoints,
            sizes.trap_repeat,
            sizes.trap_batches,
            self.attempt,
        )

    def scaling(self, data: Dataset) -> dict[str, Any]:
        sizes = self.sizes
        return measure_scaling(
            self.spark,
            self.url,
            data,
            self.checkpoints,
            sizes.scaling_partitions,
            sizes.scaling_repeat,
            self.attempt,
        )

    def peers(self, data: Dataset) -> dict[str, Any]:
        jdbc = JDBC_JAR.is_file()
        if not jdbc:
            self.skipped["peers jdbc"] = (
                f"{JDBC_JAR} missing: run scripts/ensure-jdbc.sh (make setup)"
            )
        return measure_peers(
            self.spark, self.url, data, self.checkpoints, self.sizes.peer_repeat, jdbc, self.attempt
        )

    def batch_cost(self) -> dict[str, Any]:
        sizes = self.sizes
        return measure_batch_cost(
            self.spark,
            self.url,
            self.checkpoints,
            sizes.cost_batches,
            sizes.cost_rounds,
            sizes.cost_warmup,
            sizes.cost_counted_batches,
            self.attempt,
        )

    def first_batch(self) -> dict[str, Any]:
        """Fresh driver processes of their own (not this run's session): the first batch."""
        sizes = self.sizes
        return measure_first_batch(
            self.url, WORK, sizes.first_rounds, sizes.first_rows, self.attempt
        )

    def steady(self) -> dict[str, Any]:
        sizes = self.sizes
        return measure_steady(
            self.spark,
            self.url,
            WORK / "data",
            self.checkpoints,
            sizes.steady_rows,
            sizes.steady_repeat,
            self.attempt,
            sizes.steady_warmup,
        )

    def guard_cost(self) -> dict[str, Any]:
        sizes = self.sizes
        return measure_guard_cost(
            self.spark,
            self.url,
            self.checkpoints,
            sizes.guard_batches,
            sizes.guard_warmup,
            sizes.guard_counted_batches,
            self.attempt,
        )


def describe(exc: BaseException) -> str:
    """The exception in a few lines (a Py4J error's first line says nothing)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: " + " | ".join(lines[:4])[:1000]


def clean_work() -> None:
    """Checkpoints and latency sources of earlier runs; the generated data stays."""
    for path in WORK.glob("*"):
        if path.name != "data":
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.from_args(args)
    started = time.perf_counter()
    clean_work()
    say(f"generating data (cached in {WORK / 'data'}) ...")
    data = prepare_datasets(sizes)
    results: dict[str, Any] = {"config": {**asdict(sizes), "only": list(args.only)}}
    results["machine"] = machine_facts()
    overrides = SERVER_OVERRIDES if ONE_GB & set(args.only) else None
    with postgres(args.url, WORK / "pg", overrides) as url:
        recreate_table(url)
        results["postgres"] = server_facts(url)
        bench = run_bench(args, sizes, url, data, results)
    results.update(
        measures=bench.measures,
        errors=bench.errors,
        skipped=bench.skipped,
        timings=bench.timings,
        load_average_after=bench.load_after,
    )
    results["ratios"] = ratios(bench.measures.get("throughput", []))
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    results["machine"]["total_seconds"] = time.perf_counter() - started
    write_results(results, args)
    return 1 if bench.errors else 0


def run_bench(
    args: argparse.Namespace, sizes: Sizes, url: str, data: Datasets, results: dict[str, Any]
) -> Bench:
    say("starting Spark (local[2]) ...")
    spark = start_session()
    try:
        results["spark"] = spark_facts(spark)
        bench = Bench(args, sizes, url, spark)
        bench.attempt("warm-up", lambda: bench.warm_up(data))
        bench.run(data)
        return bench
    finally:
        spark.stop()


def write_results(results: dict[str, Any], args: argparse.Namespace) -> None:
    write_json(results, args.out)  # first: a failure to print or plot loses nothing
    say(f"wrote {args.out}")
    print_report(results)
    if "first_batch" in results["measures"]:
        print_first_batch(results["measures"]["first_batch"])
    if "steady" in results["measures"]:
        print_steady(results["measures"]["steady"])
    if not args.no_plot:
        # results.png: measures 1-6; issue 16's measures in results_issue16.png beside it,
        # or in <out>.png when they ran alone
        old = {"throughput", "overhead", "memory", "latency"}
        plot = args.out.with_suffix(".png")
        if old & set(results["measures"]):
            write_plot(results, plot)
            say(f"wrote {plot}")
            plot = args.out.with_name(args.out.stem + "_issue16.png")
        if set(results["measures"]) - old - {"first_batch"} - ONE_GB:
            write_round2_plot(results, plot)
            say(f"wrote {plot}")


if __name__ == "__main__":
    sys.exit(main())
