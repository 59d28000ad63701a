"""Measures 1-3: rows/s of a plain binary COPY, of Spark's JDBC writer, of sqlsink streaming.

Every run loads the same rows into the same emptied table and is checked to have loaded every
row exactly once. The runs go round-robin (every method once per round, ``repeat`` rounds), so
a change of load on the machine hits every method alike; a method's time is its median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from server import TABLE, check_rows, jdbc_target, reset_table
from streaming import Sink, read_stream, run_available_now
from workload import COPY_TYPES, SPARK_SCHEMA, Dataset, load_tuples

SEMANTICS = ("none", "at_least_once", "exactly_once")
CEILING = "ceiling: binary COPY, 1 process"


@dataclass
class Method:
    """One way to load the rows; ``run`` loads them once into the emptied table, timed."""

    name: str
    run: Callable[[], float]
    notes: str = ""
    seconds: list[float] = field(default_factory=list)

    def as_dict(self, rows: int) -> dict[str, Any]:
        median = statistics.median(self.seconds)
        return {
            "method": self.name,
            "rows": rows,
            "seconds": self.seconds,
            "median_s": median,
            "rows_per_s": rows / median,
            "notes": self.notes,
        }


def copy_ceiling(url: str, dataset: Dataset) -> Method:
    """One Python process, one binary COPY with psycopg's write_row over pre-built tuples."""
    rows = load_tuples(dataset)  # not timed

    def run() -> float:
        started = time.perf_counter()
        copy_tuples(url, rows)
        seconds = time.perf_counter() - started
        check_rows(url, dataset.rows, "binary COPY")
        return seconds

    return Method(CEILING, run, "psycopg copy.write_row, tuples built beforehand")


def copy_tuples(url: str, rows: Sequence[tuple[Any, ...]]) -> None:
    statement = f"COPY {TABLE} (id, ts, n, x, s) FROM STDIN (FORMAT BINARY)"
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(list(COPY_TYPES))
            for row in rows:
                copy.write_row(row)
        conn.commit()


def jdbc_writer(spark: Any, url: str, dataset: Dataset, *, rewrite: bool) -> Method:
    """df.write.format("jdbc") in append mode, batchsize left at its default."""
    jdbc_url, props = jdbc_target(url)
    if rewrite:
        jdbc_url += "?reWriteBatchedInserts=true"
    frame = spark.read.schema(SPARK_SCHEMA).parquet(str(dataset.path))
    options = {"url": jdbc_url, "dbtable": TABLE, "driver": "org.postgresql.Driver", **props}

    def run() -> float:
        started = time.perf_counter()
        frame.write.format("jdbc").mode("append").options(**options).save()
        seconds = time.perf_counter() - started
        check_rows(url, dataset.rows, "JDBC")
        return seconds

    name = "Spark JDBC, reWriteBatchedInserts" if rewrite else "Spark JDBC, defaults"
    return Method(name, run, f"batch read, {frame.rdd.getNumPartitions()} partitions")


def streaming_query(
    spark: Any, url: str, dataset: Dataset, sink: Sink, checkpoints: Path
) -> Method:
    """readStream of the Parquet directory, trigger(availableNow=True), a fresh checkpoint."""

    def run() -> float:
        result = run_available_now(read_stream(spark, dataset.path), sink, checkpoints)
        if sink.format == "sqlsink":
            check_rows(url, dataset.rows, f"sqlsink {sink.options['semantic']}")
        return result.seconds

    if sink.format == "noop":
        return Method("Spark floor: noop sink", run, "the same streaming query")
    return Method(f"sqlsink {sink.options['semantic']}", run, "streaming, availableNow")


def methods(spark: Any, url: str, dataset: Dataset, checkpoints: Path, jdbc: bool) -> list[Method]:
    found = [copy_ceiling(url, dataset)]
    if jdbc:
        found += [jdbc_writer(spark, url, dataset, rewrite=r) for r in (False, True)]
    sinks = [Sink.sqlsink(url, TABLE, s) for s in SEMANTICS] + [Sink.noop()]
    found += [streaming_query(spark, url, dataset, sink, checkpoints) for sink in sinks]
    return found


def run_rounds(
    found: list[Method], url: str, repeat: int, attempt: Callable[[str, Callable[[], Any]], Any]
) -> None:
    """``repeat`` rounds of every method; ``attempt`` runs one and returns None on failure."""
    failed: set[str] = set()
    for round_number in range(1, repeat + 1):
        for method in found:
            if method.name in failed:
                continue
            reset_table(url)
            seconds = attempt(f"{method.name} (round {round_number}/{repeat})", method.run)
            if seconds is None:
                failed.add(method.name)
            else:
                method.seconds.append(seconds)
