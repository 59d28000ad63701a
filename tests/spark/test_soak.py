"""Soak: one exactly-once stream over many small micro-batches, watched after every batch.

The query runs with a processing-time trigger; the test adds one source file (one
micro-batch), waits with ``processAllAvailable`` and then looks at everything a
slow leak would show in: the sink's server sessions (none may stay in use after a
batch; those kept idle for the next batch, ``sqlsink idle``, stay bounded: at most
``KEEP`` per Python process that wrote, and no more at the end than early on), its
prepared transactions (none may stay prepared), the RSS of the Python driver, of
Spark's Python workers and of the JVM. ``--soak-batches N`` sets the length (CI:
the default; a long run: 500). ``-s`` prints a one-line summary.

Memory must stay flat: after a warm-up (the first batches start workers, import
modules, fill caches), the median RSS over the last third of the batches may
exceed the median over the first third by less than ``RSS_GROWTH_BOUND``. 20 MB is
well above the noise of a steady Python process (allocator arenas, Arrow's pool,
which keeps freed blocks, a worker forked now and then) and far below what a leak
of a batch's rows or of a connection per batch adds up to over a long run: at 500
batches the two thirds are ~160 batches apart, so anything from ~125 kB per batch
fails it; at the CI default it catches only gross leaks (~1.5 MB per batch) and the
session and transaction checks carry the run. The JVM's RSS is reported, not
bounded: its heap grows until the collector settles, whatever Python does.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlsink.postgres.sessions import KEEP
from tests.fix_pg import PgServer, prepared_in_test_db
from tests.spark.streams import (
    SCHEMA,
    ActivityMonitor,
    add_source_file,
    commit_log,
    decided_batches,
    python_workers,
    rss_bytes,
    table_ids,
)

pytestmark = pytest.mark.spark

ROWS_PER_BATCH = 500
PARTITIONS = 2
WARMUP = 4
RSS_GROWTH_BOUND = 20 * 2**20
MB = 2**20


@dataclass(frozen=True)
class Sample:
    batch: int
    seconds: float  # file written -> processAllAvailable returned
    peak_sink_sessions: int  # during the batch (sampled every 50 ms)
    settle_seconds: float  # until the sink's sessions had left pg_stat_activity
    sink_sessions: int  # after the batch (settled)
    other_sessions: int
    idle_sessions: int  # kept for the next batch (sqlsink/postgres/sessions.py)
    prepared: int  # the sink's prepared transactions after the batch
    driver_rss: int  # this process: the Python driver
    workers: dict[int, int]  # Spark's Python workers: pid -> RSS
    jvm_rss: int


def third_of(values: list[int]) -> int:
    return max(1, (len(values) - WARMUP) // 3)


def growth(values: list[int]) -> int:
    """Median of the last third minus median of the first third, after the warm-up."""
    steady = values[WARMUP:]
    third = max(1, len(steady) // 3)
    return int(statistics.median(steady[-third:]) - statistics.median(steady[:third]))


def sink_prepared(url: str, sink_id: str) -> int:
    prefix = f"sqlsink\\_{sink_id}\\_%"
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (prefix,)
        ).fetchone()
    return int(str(row[0])) if row else 0


def test_many_small_batches_leave_no_session_no_transaction_and_flat_memory(
    spark: Any,
    tmp_path: Path,
    pg_url: str,
    table: str,
    pg_server: PgServer,
    request: pytest.FixtureRequest,
) -> None:
    batches: int = request.config.getoption("--soak-batches")
    assert batches >= WARMUP + 6, "--soak-batches: at least 10 batches"
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    source.mkdir()
    jvm_pid = spark.sparkContext._gateway.proc.pid
    samples: list[Sample] = []
    started = time.monotonic()
    with ActivityMonitor(pg_url) as monitor:
        baseline = monitor.settle(others=0, timeout=2.0)[1]  # sessions not of this test
        events = (
            spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
        ).repartition(PARTITIONS)
        query = (
            events.writeStream.format("sqlsink")
            .option("checkpointLocation", str(checkpoint))
            .option("url", pg_url)
            .option("table", table)
            .option("createTable", "true")
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            sink_id = str(query.id)  # the default sink id: the query id
            for batch in range(batches):
                monitor.peak()
                begun = time.monotonic()
                add_source_file(
                    source, batch, range(batch * ROWS_PER_BATCH, (batch + 1) * ROWS_PER_BATCH)
                )
                query.processAllAvailable()
                seconds = time.monotonic() - begun
                sink, other, waited = monitor.settle(others=baseline)
                samples.append(
                    Sample(
                        batch=batch,
                        seconds=seconds,
                        peak_sink_sessions=monitor.peak()[0],
                        settle_seconds=waited,
                        sink_sessions=sink,
                        other_sessions=other,
                        idle_sessions=monitor.idle,
                        prepared=sink_prepared(pg_url, sink_id),
                        driver_rss=rss_bytes(os.getpid()),
                        workers={pid: rss_bytes(pid) for pid in python_workers(jvm_pid)},
                        jvm_rss=rss_bytes(jvm_pid),
                    )
                )
                last = samples[-1]
                assert (last.sink_sessions, last.other_sessions) == (0, baseline), last
                assert last.prepared == 0, last
        finally:
            query.stop()
        assert query.exception() is None
        elapsed = time.monotonic() - started

    # every id exactly once, every batch decided and complete, in its own micro-batch
    assert table_ids(pg_url, table) == list(range(batches * ROWS_PER_BATCH))
    assert decided_batches(pg_url, sink_id) == dict.fromkeys(range(batches), True)
    shapes = set(commit_log(pg_url, sink_id, "rows", "partitions").values())
    assert shapes == {(ROWS_PER_BATCH, PARTITIONS)}
    assert prepared_in_test_db(pg_server) == []

    peak_sessions = max(s.peak_sink_sessions for s in samples)
    idle = [s.idle_sessions for s in samples]
    driver, jvm = [s.driver_rss for s in samples], [s.jvm_rss for s in samples]
    total = [sum(s.workers.values()) for s in samples]
    counts = [len(s.workers) for s in samples]
    # a leak grows a process that lives on: each worker that served the whole run
    steady = samples[WARMUP:]
    lasting = set.intersection(*(set(s.workers) for s in steady))
    per_worker = {pid: growth([0] * WARMUP + [s.workers[pid] for s in steady]) for pid in lasting}
    worst = max(per_worker.values(), default=0)
    print(
        f"\nsoak: {batches} batches x {ROWS_PER_BATCH} rows in {elapsed:.1f} s "
        f"(median {statistics.median(s.seconds for s in samples):.2f} s/batch); "
        f"sink sessions: max {peak_sessions} during a batch, 0 in use after every batch, "
        f"kept idle {idle[WARMUP]} -> {idle[-1]} (max {max(idle)}) "
        f"(settled in <= {max(s.settle_seconds for s in samples):.2f} s); "
        f"sink's prepared transactions after a batch: max {max(s.prepared for s in samples)}; "
        f"RSS MB after batch {WARMUP} -> last (growth, last third vs first third): "
        f"driver {mb(driver[WARMUP])} -> {mb(driver[-1])} ({mb(growth(driver), '+')}), "
        f"{counts[WARMUP]} -> {counts[-1]} workers {mb(total[WARMUP])} -> {mb(total[-1])} "
        f"({mb(growth(total), '+')}; worst of {len(lasting)} lasting workers "
        f"{mb(worst, '+')}), JVM {mb(jvm[WARMUP])} -> {mb(jvm[-1])} ({mb(growth(jvm), '+')})"
    )
    # a batch opens a session per partition, the planner's and the committer's, no more
    assert peak_sessions <= PARTITIONS + 2, samples
    # kept sessions: bounded by the processes that use them, and not piling up
    assert max(idle) <= KEEP * (max(counts) + 1), (idle, counts)
    assert max(idle[-third_of(idle) :]) <= max(idle[WARMUP : WARMUP + third_of(idle)]), idle
    assert growth(driver) < RSS_GROWTH_BOUND, driver
    assert worst < RSS_GROWTH_BOUND, {pid: [s.workers[pid] for s in steady] for pid in lasting}
    # no pile-up of worker processes either (say, a commit worker per batch that stays)
    third = len(steady) // 3
    assert max(counts[-third:]) <= max(counts[WARMUP : WARMUP + third]) + 1, counts


def mb(value: float, sign: str = "") -> str:
    return f"{value / MB:{sign}.1f}"
