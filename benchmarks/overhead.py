"""Measure 4: what exactly_once adds per micro-batch over at_least_once, by partition count.

Many small batches (one Parquet file per trigger), repartitioned to p partitions, into the
``noop`` sink, sqlsink ``at_least_once`` and sqlsink ``exactly_once``; the three run in turn,
``rounds`` times over, so that a change of load on the machine hits all three alike.

A batch's cost is Spark's ``addBatch`` (the sink's writes and its commit); the first batch of
every run is left out (planning, warming). ``triggerExecution`` (which adds Spark's offset and
commit logs, the same for every sink) is kept too. At p partitions:

* overhead = median addBatch of exactly_once - median addBatch of at_least_once;
* sink cost = median addBatch of at_least_once - median addBatch of noop (what the sink costs
  per batch whatever the semantic: its planning on the driver, its connections, its commit).

A least-squares line overhead = a + b·p splits the overhead into a per-batch part (a: the
commit-log decision) and a per-partition part (b: marker row, PREPARE, COMMIT PREPARED).
95% intervals come from resampling each run's batches (bootstrap, 1000 times).

That difference of two medians carries Spark's batch-to-batch jitter (tens of ms). The
driver's share of the exactly-once work is also read directly: every decision in the
commit log has ``commit_ms`` (writing the decision, the COMMIT PREPAREDs, the sweep,
marking it complete), reported as its median per partition count.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from server import TABLE, check_rows, reset_table
from streaming import Sink, read_stream, run_available_now
from workload import Dataset

SINKS = ("noop", "at_least_once", "exactly_once")
RESAMPLES = 1000


@dataclass
class BatchCosts:
    """Per-batch durations (ms) of one sink at one partition count, pooled over rounds."""

    sink: str
    partitions: int
    add_batch_ms: list[float] = field(default_factory=list)
    trigger_ms: list[float] = field(default_factory=list)
    commit_ms: list[float] = field(default_factory=list)  # exactly_once: the commit log's
    wall_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "partitions": self.partitions,
            "batches": len(self.add_batch_ms),
            "median_add_batch_ms": statistics.median(self.add_batch_ms),
            "median_trigger_ms": statistics.median(self.trigger_ms),
            "median_commit_ms": statistics.median(self.commit_ms) if self.commit_ms else None,
            "wall_s": self.wall_s,
        }


def sink_for(name: str, url: str) -> Sink:
    return Sink.noop() if name == "noop" else Sink.sqlsink(url, TABLE, name)


def run_small_batches(
    spark: Any, url: str, dataset: Dataset, costs: BatchCosts, checkpoints: Path
) -> None:
    """One query over the data set, one batch per file; its steady batches go to ``costs``."""
    reset_table(url)
    frame = read_stream(spark, dataset.path, files_per_trigger=1).repartition(costs.partitions)
    run = run_available_now(frame, sink_for(costs.sink, url), checkpoints)
    if costs.sink != "noop":
        check_rows(url, dataset.rows, f"{costs.sink}, {costs.partitions} partitions")
    steady = run.progress[1:]
    costs.add_batch_ms += [float(p["durationMs"].get("addBatch", 0)) for p in steady]
    costs.trigger_ms += [float(p["durationMs"].get("triggerExecution", 0)) for p in steady]
    costs.wall_s.append(run.seconds)
    if costs.sink == "exactly_once":
        costs.commit_ms += commit_ms(url, str(run.progress[0]["id"]), after=0)


def commit_ms(url: str, sink_id: str, after: int) -> list[float]:
    """The driver's commit time of each batch after ``after`` (the sink id is the query id)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT commit_ms FROM sqlsink.decisions WHERE sink_id = %s AND batch_id > %s "
            "AND commit_ms IS NOT NULL ORDER BY batch_id",
            (sink_id, after),
        ).fetchall()
    return [float(r[0]) for r in rows]


def measure_batch_costs(
    spark: Any,
    url: str,
    dataset: Dataset,
    partitions: Sequence[int],
    rounds: int,
    checkpoints: Path,
) -> list[BatchCosts]:
    costs = {(s, p): BatchCosts(s, p) for p in partitions for s in SINKS}
    for p in partitions:
        for _ in range(rounds):
            for sink in SINKS:
                run_small_batches(spark, url, dataset, costs[(sink, p)], checkpoints)
    return list(costs.values())


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least squares y = a + b·x; (a, b)."""
    xs, ys = list(points), list(points.values())
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return mean_y - b * mean_x, b


def differences(
    costs: dict[tuple[str, int], list[float]], minuend: str, subtrahend: str
) -> dict[int, float]:
    """partitions -> median(minuend) - median(subtrahend)."""
    ps = sorted({p for _, p in costs})
    return {
        p: statistics.median(costs[(minuend, p)]) - statistics.median(costs[(subtrahend, p)])
        for p in ps
    }


def interval(values: list[float]) -> list[float]:
    ordered = sorted(values)
    return [ordered[int(0.025 * len(ordered))], ordered[int(0.975 * len(ordered)) - 1]]


def bootstrap(costs: dict[tuple[str, int], list[float]]) -> dict[str, Any]:
    """95% intervals of the overheads and of the fit, resampling each run's batches."""
    rng = random.Random(0)
    overheads: dict[int, list[float]] = {p: [] for _, p in costs}
    fits: list[tuple[float, float]] = []
    for _ in range(RESAMPLES):
        sample = {key: rng.choices(values, k=len(values)) for key, values in costs.items()}
        diff = differences(sample, "exactly_once", "at_least_once")
        for p, ms in diff.items():
            overheads[p].append(ms)
        fits.append(fit_line(diff))
    return {
        "overhead_ms_by_partitions": {str(p): interval(v) for p, v in overheads.items()},
        "per_batch_a": interval([a for a, _ in fits]),
        "per_partition_b": interval([b for _, b in fits]),
    }


def summarize_overhead(runs: Sequence[BatchCosts]) -> dict[str, Any]:
    costs = {(c.sink, c.partitions): c.add_batch_ms for c in runs}
    overhead = differences(costs, "exactly_once", "at_least_once")
    a, b = fit_line(overhead)
    return {
        "runs": [c.as_dict() for c in runs],
        "overhead_ms_by_partitions": {str(p): ms for p, ms in overhead.items()},
        "sink_cost_ms_by_partitions": {
            str(p): ms for p, ms in differences(costs, "at_least_once", "noop").items()
        },
        "fit_ms": {"per_batch_a": a, "per_partition_b": b},
        "exactly_once_commit_ms_by_partitions": {
            str(c.partitions): statistics.median(c.commit_ms) for c in runs if c.commit_ms
        },
        "ci95": bootstrap(costs),
    }
