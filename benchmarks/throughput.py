"""Measures 1-3: rows/s of a plain binary COPY, of Spark's JDBC writer, of sqlsink streaming.

Every run loads the same rows into the same emptied table and is checked to have loaded every
row exactly once. The runs go round-robin (every method once per round, ``repeat`` rounds), so
a change of load on the machine hits every method alike; a method's time is its median.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from cpu import CpuMeter
from server import TABLE, check_rows, jdbc_target, reset_table
from streaming import Sink, read_stream, run_available_now
from workload import COPY_TYPES, SPARK_SCHEMA, Dataset, load_tuples

SEMANTICS = ("none", "at_least_once", "exactly_once")
CEILING = "ceiling: binary COPY, 1 process"


Timing = tuple[float, dict[str, float]]  # seconds, CPU seconds per process group


def timed(work: Callable[[], float | None]) -> Timing:
    """Run ``work``; its time (its own if it returns one, else the wall time) and CPU split."""
    with CpuMeter() as cpu:
        started = time.perf_counter()
        own = work()
        seconds = time.perf_counter() - started if own is None else own
    assert cpu.split is not None
    return seconds, cpu.split


@dataclass
class Method:
    """One way to load the rows; ``run`` loads them once into the emptied table, timed."""

    name: str
    run: Callable[[], Timing]
    notes: str = ""
    prepare: Callable[[], None] | None = None  # not timed; the default empties the table
    seconds: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)

    def as_dict(self, rows: int) -> dict[str, Any]:
        median = statistics.median(self.seconds)
        middle = sorted(range(len(self.seconds)), key=self.seconds.__getitem__)[
            (len(self.seconds) - 1) // 2
        ]
        return {
            "method": self.name,
            "rows": rows,
            "seconds": self.seconds,
            "median_s": median,
            "rows_per_s": rows / median,
            "cpu_s_of_median_run": self.cpu[middle],
            "cpu_s": self.cpu,
            "notes": self.notes,
        }


def copy_ceiling(url: str, dataset: Dataset, rows: Sequence[tuple[Any, ...]]) -> Method:
    """One Python process, one binary COPY with psycopg's write_row over pre-built tuples."""

    def run() -> Timing:
        timing = timed(lambda: copy_tuples(url, rows))
        check_rows(url, dataset.rows, "binary COPY")
        return timing

    return Method(CEILING, run, "psycopg copy.write_row, tuples built beforehand")


TWO_COPIES = "binary COPY, 2 processes at once"


def copy_in_processes(url: str, dataset: Dataset, rows: Sequence[tuple[Any, ...]]) -> Method:
    """The ceiling's COPY split in two halves loaded at once by two forked processes: what
    two concurrent writers (like two Spark partitions) cost PostgreSQL, without Spark."""
    fork = multiprocessing.get_context("fork")  # the children inherit the tuples, unpickled

    def load() -> None:
        half = len(rows) // 2
        children = [
            fork.Process(target=copy_tuples, args=(url, part))
            for part in (rows[:half], rows[half:])
        ]
        for child in children:
            child.start()
        for child in children:
            child.join()
        if any(child.exitcode != 0 for child in children):
            raise RuntimeError(f"a COPY process failed: {[c.exitcode for c in children]}")

    def run() -> Timing:
        timing = timed(load)
        check_rows(url, dataset.rows, "binary COPY, 2 processes")
        return timing

    return Method(TWO_COPIES, run, "two forked processes, half of the tuples each")


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

    def run() -> Timing:
        timing = timed(frame.write.format("jdbc").mode("append").options(**options).save)
        check_rows(url, dataset.rows, "JDBC")
        return timing

    name = "Spark JDBC, reWriteBatchedInserts" if rewrite else "Spark JDBC, defaults"
    return Method(name, run, f"batch read, {frame.rdd.getNumPartitions()} partitions")


def streaming_query(
    spark: Any, url: str, dataset: Dataset, sink: Sink, checkpoints: Path
) -> Method:
    """readStream of the Parquet directory, trigger(availableNow=True), a fresh checkpoint."""

    def run() -> Timing:
        frame = read_stream(spark, dataset.path)
        timing = timed(lambda: run_available_now(frame, sink, checkpoints).seconds)
        if sink.format == "sqlsink":
            check_rows(url, dataset.rows, f"sqlsink {sink.options['semantic']}")
        return timing

    if sink.format == "noop":
        return Method("Spark floor: noop sink", run, "the same streaming query")
    return Method(f"sqlsink {sink.options['semantic']}", run, "streaming, availableNow")


UPSERT = "sqlsink exactly_once, upsert"


def upsert_query(
    url: str, dataset: Dataset, rows: Sequence[tuple[Any, ...]], spark: Any, checkpoints: Path
) -> Method:
    """mode=upsert into a table pre-filled with every other row (n = -1): half the rows
    update a row, half insert one."""
    stale = [(i, ts, -1, x, s) for i, ts, _, x, s in rows[::2]]
    sink = Sink.sqlsink(url, TABLE, "exactly_once", mode="upsert")
    timed_query = streaming_query(spark, url, dataset, sink, checkpoints)

    def prefill() -> None:
        reset_table(url)
        copy_tuples(url, stale)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {TABLE}")

    def run() -> Timing:
        timing = timed_query.run()
        with psycopg.connect(url) as conn:
            row = conn.execute(f"SELECT count(*) FILTER (WHERE n = -1) FROM {TABLE}").fetchone()
        if row is None or row[0] != 0:
            raise AssertionError(f"upsert left {row} stale rows")
        return timing

    notes = f"{len(stale):,} of the rows pre-filled (updated), the rest inserted"
    return Method(UPSERT, run, notes, prepare=prefill)


def methods(spark: Any, url: str, dataset: Dataset, checkpoints: Path, jdbc: bool) -> list[Method]:
    rows = load_tuples(dataset)  # once, not timed: the ceiling's input and the upsert's prefill
    found = [copy_ceiling(url, dataset, rows), copy_in_processes(url, dataset, rows)]
    if jdbc:
        found += [jdbc_writer(spark, url, dataset, rewrite=r) for r in (False, True)]
    sinks = [Sink.sqlsink(url, TABLE, s) for s in SEMANTICS] + [Sink.noop()]
    found += [streaming_query(spark, url, dataset, sink, checkpoints) for sink in sinks]
    found.append(upsert_query(url, dataset, rows, spark, checkpoints))
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
            (method.prepare or (lambda: reset_table(url)))()
            timing = attempt(f"{method.name} (round {round_number}/{repeat})", method.run)
            if timing is None:
                failed.add(method.name)
            else:
                method.seconds.append(timing[0])
                method.cpu.append(timing[1])
