"""Measure 6: end-to-end latency of a 10-row micro-batch.

A running query watches a source directory (trigger processingTime 100 ms). A 10-row Parquet
file is dropped into it (an atomic rename); for sqlsink exactly_once the table is polled every
5 ms until the rows are visible. Reported per drop:

* ``drop_to_visible_ms``: from the rename to the rows visible (includes the wait for the next
  trigger, up to 100 ms, and the file listing);
* ``trigger_to_visible_ms``: from the batch's trigger (its progress ``timestamp``) to visible;
* ``trigger_ms``: Spark's ``durationMs.triggerExecution`` of that batch.

The ``noop`` sink runs the same query; its ``triggerExecution`` is Spark's own floor for such a
batch. Medians over the drops after the warm-up ones.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from server import TABLE, reset_table, wait_for_rows
from streaming import Sink, read_stream, start_query
from workload import write_file

ROWS_PER_DROP = 10
FIRST_ID = 9_000_000_000
TRIGGER = {"processingTime": "100 milliseconds"}


@dataclass(frozen=True)
class Drop:
    drop_to_visible_ms: float | None
    trigger_to_visible_ms: float | None
    trigger_ms: float


def progress_of(query: Any, batch_id: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """The progress report of batch ``batch_id`` once the query has made it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for progress in reversed(query.recentProgress):
            if progress["batchId"] == batch_id:
                return dict(progress)
        if query.exception() is not None:
            raise RuntimeError(f"latency query failed: {query.exception()}")
        time.sleep(0.005)
    raise TimeoutError(f"no progress for batch {batch_id} after {timeout_s} s")


def started_at(progress: dict[str, Any]) -> float:
    """The trigger's start, as time.time()."""
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def drop_files(
    source: Path, drops: int, on_drop: Callable[[int, float], tuple[float | None, float | None]]
) -> list[tuple[float, float | None, float | None]]:
    """Drop ``drops`` files one at a time; on_drop(k, t_drop) waits and measures."""
    results = []
    for k in range(drops):
        write_file(source / f"drop-{k:04d}.parquet", FIRST_ID + k * ROWS_PER_DROP, ROWS_PER_DROP)
        dropped = time.perf_counter()
        visible, visible_wall = on_drop(k, dropped)
        results.append((dropped, visible, visible_wall))
        time.sleep(0.25)  # the next drop lands at a random point of the trigger interval
    return results


def run_drops(spark: Any, url: str, sink: Sink, work: Path, drops: int) -> list[Drop]:
    source = work / f"latency-{uuid.uuid4().hex[:8]}" / "source"
    source.mkdir(parents=True)
    reset_table(url)
    query = start_query(read_stream(spark, source), sink, work / "checkpoints", TRIGGER)
    try:
        with psycopg.connect(url, autocommit=True) as conn:

            def on_drop(k: int, dropped: float) -> tuple[float | None, float | None]:
                if sink.format == "noop":
                    progress_of(query, k)
                    return None, None
                visible = wait_for_rows(conn, (k + 1) * ROWS_PER_DROP, timeout_s=120)
                visible_wall = time.time()
                progress_of(query, k)  # the batch ends before the next drop
                return visible, visible_wall

            timings = drop_files(source, drops, on_drop)
        return [to_drop(timing, progress_of(query, k)) for k, timing in enumerate(timings)]
    finally:
        query.stop()


def to_drop(timing: tuple[float, float | None, float | None], progress: dict[str, Any]) -> Drop:
    dropped, visible, visible_wall = timing
    return Drop(
        drop_to_visible_ms=None if visible is None else (visible - dropped) * 1000,
        trigger_to_visible_ms=None
        if visible_wall is None
        else (visible_wall - started_at(progress)) * 1000,
        trigger_ms=float(progress["durationMs"].get("triggerExecution", 0)),
    )


def median_of(drops: list[Drop], name: str) -> float | None:
    values = [getattr(d, name) for d in drops if getattr(d, name) is not None]
    return statistics.median(values) if values else None


def summarize(drops: list[Drop]) -> dict[str, Any]:
    fields = ("drop_to_visible_ms", "trigger_to_visible_ms", "trigger_ms")
    return {
        "drops": len(drops),
        **{f"median_{name}": median_of(drops, name) for name in fields},
        "each": [d.__dict__ for d in drops],
    }


def measure_latency(
    spark: Any, url: str, work: Path, drops: int, warmup: int
) -> dict[str, dict[str, Any]]:
    """sqlsink exactly_once and noop, each medians over ``drops`` after ``warmup`` drops."""
    sinks = {"sqlsink_exactly_once": Sink.sqlsink(url, TABLE, "exactly_once"), "noop": Sink.noop()}
    return {
        name: summarize(run_drops(spark, url, sink, work, warmup + drops)[warmup:])
        for name, sink in sinks.items()
    }
