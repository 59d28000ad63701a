"""Where an exactly_once batch's time goes, step by step (issue 16: what each protocol
addition costs: fencing, heartbeat, checkpoint check, view bookkeeping, ...).

    .venv/bin/python benchmarks/commit_phases.py [--batches 100] [--warmup 10] [--url URL]
                                                 [--out benchmarks/results/commit_phases.json]

The foreachBatch writer, whose commit runs in the driver's own process, so that every
step can be timed from here, on Spark's ``rate-micro-batch`` source: 10 rows in 2
partitions a batch, a trigger every 100 ms, ``exactly_once``, as ``batch_cost.py`` runs
it. Twice: into the table alone, and with a consistent view of it (``view=``). Each step
is timed by wrapping the function that does it, in this process only (nothing of sqlsink
changes; the wrappers cost a few µs a call):

- before the job: the writer's admission (binding, forward-only), the target's plan;
- the job: Spark's start of it (to the first task's first write), the tasks' writes (to
  the last PREPARE, from their outcomes), Spark's end of it (last PREPARE to the job's
  results on the driver);
- the commit (``Committer.commit_batch``): the registration before the lock (fencing: the
  binding checked with the sink's row locked, older runs superseded), the checks under
  the lock (binding, forward-only), the registration under it (heartbeat, the lock
  holder's session), the checkpoint check, the consistent view kept, the decision, each
  COMMIT PREPARED, the completion (markers deleted), the batch's figures, and the rest
  of the resolution (its reads of the log and of pg_prepared_xacts);
- after it: the server re-check (it reads the server only when the batch's partitions or
  slowest write grew past what the process measured before).

Per batch, the median and p90 of each step in ms (a step that runs twice, as COMMIT
PREPARED at 2 partitions, counts its sum), and of the whole function; the JSON and a
plot beside the other results. Spark's and PostgreSQL's processes share the 2 cores:
every figure includes that contention, as the other per-batch figures do.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batch_cost import TABLE, TRIGGER, cost_frame
from copyload import reset
from report import machine_facts, write_results
from server import postgres, server_facts
from streaming import start_session
from workload import TABLE_DDL

HERE = Path(__file__).resolve().parent
VIEW = "cost_rows_whole"
CONFIGS = ("table", "table + view")
# the steps, in the order a batch meets them; "resolution, the rest" is derived
STEPS = (
    "admission (before the job)",
    "target plan",
    "Spark: job start to first write",
    "tasks: first write to last PREPARE",
    "Spark: last PREPARE to job end",
    "registration before the lock (fencing)",
    "sink lock",
    "checks under the lock",
    "registration under the lock (heartbeat)",
    "checkpoint check",
    "consistent view kept",
    "decision",
    "COMMIT PREPARED",
    "completion (markers deleted)",
    "resolution, the rest",
    "batch figures",
    "server re-check",
)


def say(message: str) -> None:
    print(f"[commit_phases] {message}", flush=True)


class Steps:
    """The time of each step of each batch: (batch, step) -> [seconds]."""

    def __init__(self) -> None:
        self.batch: int | None = None
        self.seconds: dict[tuple[int, str], list[float]] = defaultdict(list)
        self.marks: dict[tuple[int, str], float] = {}

    def add(self, step: str, seconds: float) -> None:
        if self.batch is not None:
            self.seconds[(self.batch, step)].append(seconds)

    def mark(self, name: str, at: float) -> None:
        if self.batch is not None:
            self.marks[(self.batch, name)] = at


def wrap(steps: Steps, owner: Any, name: str, step: str | Callable[..., str]) -> None:
    """Time every call of ``owner.name`` as ``step`` (or ``step(*args, **kwargs)``)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            label = step if isinstance(step, str) else step(*args, **kwargs)
            steps.add(label, time.perf_counter() - started)

    setattr(owner, name, timed)


def instrument(steps: Steps) -> None:
    """Wrap the functions of each step (in this process; the tasks' figures come from
    their outcomes)."""
    from sqlsink.core.checkpoint_check import CheckpointCheck
    from sqlsink.core.committer import Committer
    from sqlsink.core.resolver import Resolver
    from sqlsink.postgres import checks
    from sqlsink.postgres.backend import PostgresBackend
    from sqlsink.postgres.views import ConsistentViews
    from sqlsink.spark import batch, parts, plan

    def registration(*args: Any, **kwargs: Any) -> str:
        return (
            "registration under the lock (heartbeat)"
            if kwargs.get("holds_lock")
            else "registration before the lock (fencing)"
        )

    wrap(steps, batch.Batch, "_check_writer", "admission (before the job)")
    wrap(steps, plan, "plan_write", "target plan")
    wrap(steps, Committer, "register", registration)
    wrap(steps, Committer, "check_writer", "checks under the lock")
    wrap(steps, CheckpointCheck, "at_commit", "checkpoint check")
    wrap(steps, ConsistentViews, "keep", "consistent view kept")
    wrap(steps, Committer, "_decide", "decision")
    wrap(steps, Resolver, "resolve", "resolution")
    wrap(steps, PostgresBackend, "commit_prepared", "COMMIT PREPARED")
    wrap(steps, PostgresBackend, "mark_complete", "completion (markers deleted)")
    wrap(steps, PostgresBackend, "record_metrics", "batch figures")
    wrap(steps, checks, "check_after_commit", "server re-check")
    wrap(steps, Committer, "commit_batch", "commit, in all")

    original_lock = PostgresBackend.sink_lock

    def sink_lock(self: Any, sink_id: str | None) -> Any:
        started = time.perf_counter()
        held = original_lock(self, sink_id)

        class Timed:
            def __enter__(self) -> None:
                held.__enter__()
                steps.add("sink lock", time.perf_counter() - started)

            def __exit__(self, *exc: Any) -> Any:
                return held.__exit__(*exc)

        return Timed()

    setattr(PostgresBackend, "sink_lock", sink_lock)  # noqa: B010 (a method replaced)

    original_prepare = parts.prepare_part

    def prepare_part(*args: Any, **kwargs: Any) -> Any:
        steps.mark("job start", time.time())
        outcomes = original_prepare(*args, **kwargs)
        steps.mark("job end", time.time())
        written = [o for o in outcomes if o is not None and o.gid is not None]
        if written:
            steps.mark("first write", min(o.started_at for o in written))
            steps.mark("last prepare", max(o.prepared_at for o in written))
        return outcomes

    setattr(parts, "prepare_part", prepare_part)  # noqa: B010


def run_config(
    spark: Any, url: str, steps: Steps, config: str, batches: int, warmup: int
) -> dict[str, Any]:
    """One streaming query of warmup + batches batches; the per-batch figures."""
    import sqlsink

    reset(url, TABLE, TABLE_DDL)
    steps.seconds.clear()
    steps.marks.clear()
    writer = sqlsink.ForeachBatchWriter(
        url=url, sink_id=f"phases-{os.getpid()}-{config.replace(' + ', '-')}"
    )
    write = writer.to(TABLE, view=VIEW if config == "table + view" else None)
    whole: dict[int, float] = {}

    def each_batch(df: Any, batch_id: int) -> None:
        steps.batch = batch_id
        started = time.perf_counter()
        write(df, batch_id)
        whole[batch_id] = time.perf_counter() - started
        steps.batch = None

    target = warmup + batches
    with tempfile.TemporaryDirectory(prefix="sqlsink-phases-") as checkpoint:
        query = (
            cost_frame(spark)
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", checkpoint)
            .trigger(**TRIGGER)
            .start()
        )
        try:
            deadline = time.monotonic() + 60 + target * 5
            while len([b for b in whole if b >= warmup]) < batches:
                if query.exception() is not None:
                    raise RuntimeError(f"commit phases: the query failed: {query.exception()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"commit phases: {target} batches not done in time")
                time.sleep(0.2)
            idle_by = time.monotonic() + 1.0  # stop between batches if one comes soon
            while query.status["isTriggerActive"] and time.monotonic() < idle_by:
                time.sleep(0.005)
        finally:
            query.stop()
    figures = per_batch(steps, whole, warmup, target)
    # every step must have been met: a wrapped function the code no longer calls (renamed,
    # moved) would otherwise drop out of the table without a word
    expected = set(STEPS) - ({"consistent view kept"} if config == "table" else set())
    missing = sorted(expected - set(figures))
    if missing:
        raise RuntimeError(f"commit phases, {config}: steps never timed: {missing}")
    return figures


def per_batch(steps: Steps, whole: dict[int, float], warmup: int, target: int) -> dict[str, Any]:
    """Median and p90 (ms) of each step over the steady batches."""
    figures: dict[str, list[float]] = defaultdict(list)
    for batch_id in range(warmup, target):
        if batch_id not in whole:
            continue
        ms = {step: sum(s) * 1000 for (b, step), s in steps.seconds.items() if b == batch_id}
        marks = {name: at for (b, name), at in steps.marks.items() if b == batch_id}
        if {"job start", "first write", "last prepare", "job end"} <= set(marks):
            start, first = marks["job start"], marks["first write"]
            last, end = marks["last prepare"], marks["job end"]
            ms["Spark: job start to first write"] = (first - start) * 1000
            ms["tasks: first write to last PREPARE"] = (last - first) * 1000
            ms["Spark: last PREPARE to job end"] = (end - last) * 1000
        inside = ("COMMIT PREPARED", "completion (markers deleted)")
        ms["resolution, the rest"] = ms.pop("resolution", 0.0) - sum(ms.get(s, 0.0) for s in inside)
        ms["the batch, in all"] = whole[batch_id] * 1000
        for step, value in ms.items():
            figures[step].append(value)
    out = {}
    for step, values in figures.items():
        ordered = sorted(values)
        out[step] = {
            "median_ms": statistics.median(ordered),
            "p90_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))],
            "batches": len(ordered),
        }
    return out


def print_report(results: dict[str, Any]) -> None:
    configs = list(results["configs"])
    print(f"\n{'step (ms per batch, median / p90)':44}" + "".join(f"{c:>20}" for c in configs))
    for step in (*STEPS, "commit, in all", "the batch, in all"):
        cells = []
        for config in configs:
            figure = results["configs"][config].get(step)
            shown = "{median_ms:.2f} / {p90_ms:.2f}".format(**figure) if figure else "-"
            cells.append(shown)
        print(f"{step:44}" + "".join(f"{c:>20}" for c in cells))


def write_plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s for s in STEPS if any(s in c for c in results["configs"].values())]
    fig, ax = plt.subplots(figsize=(11, 7))
    height = 0.38
    for offset, (config, color) in zip(
        (-height / 2, height / 2),
        zip(results["configs"], ("#1f77b4", "#d62728"), strict=False),
        strict=False,
    ):
        figures = results["configs"][config]
        medians = [figures.get(s, {}).get("median_ms", 0.0) for s in steps]
        ax.barh([y + offset for y in range(len(steps))], medians, height, color=color, label=config)
    ax.set_yticks(range(len(steps)), steps, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per batch (median)")
    ax.legend(loc="lower right")
    facts = results["machine"]
    ax.set_title(
        f"an exactly_once batch (foreachBatch writer, 10 rows, 2 partitions), step by step: "
        f"{results['config']['batches']} batches, {facts['cpu_count']} CPUs, "
        f"PostgreSQL {results['postgres'].get('server_version', '?')}, {facts['date'][:10]}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100, help="steady batches per config")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--url", help="an existing PostgreSQL (max_prepared_transactions > 0)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "commit_phases.json")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "config": {"batches": args.batches, "warmup": args.warmup, "trigger": TRIGGER},
        "machine": machine_facts(),
        "configs": {},
    }
    steps = Steps()
    instrument(steps)
    spark = start_session()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="sqlsink-phases-pg-") as base,
            postgres(args.url, Path(base)) as url,
        ):
            results["postgres"] = server_facts(url)
            for config in CONFIGS:
                say(f"{config} ...")
                results["configs"][config] = run_config(
                    spark, url, steps, config, args.batches, args.warmup
                )
    finally:
        spark.stop()
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    print_report(results)
    write_results(
        results,
        args.out,
        None if args.no_plot else write_plot,
        lambda m: print(f"[commit_phases] {m}"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
