"""What the foreachBatch writer's heartbeat (``sqlsink/spark/heartbeat.py``) costs a
batch: its registrations and the time its block's exit waits on it.

    .venv/bin/python benchmarks/heartbeat_exit.py [--batches 50] [--url URL]

Driver side only, without Spark: each batch opens a heartbeat as ``Batch.write`` does
(``heartbeat.before_job``), runs its part's task in this process as a Spark task does
(``write_partition``: registration, COPY, PREPARE of 10 rows), then exits as
``Batch.__exit__`` does (``heartbeat.end``, then ``Committer.commit_batch``). Two cases:

- one part (the common case): ``--batches`` batches; per batch the heartbeat's
  registrations (each a session checkout and a ``register_run`` round trip) and the
  block exit's wait on the heartbeat (``end``), median and max;
- two parts, part 1's registration in progress at the exit (another session holds the
  sink's row, which every registration locks, until the exit returned): the exit's wait.

Prints the command, the date and the figures; run it with ``PYTHONPATH`` naming the
checkout to measure (before/after a change: two checkouts).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from server import postgres

from sqlsink.core.committer import Committer
from sqlsink.core.model import TaskIdentity
from sqlsink.options import SinkOptions
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.partition import write_partition
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import plan_target
from sqlsink.spark import heartbeat
from sqlsink.spark.heartbeat import Heartbeat

TABLE = "heartbeat_rows"


class Block:
    """What ``before_job`` keys a heartbeat by: the open batch."""


def counting_beats() -> list[float]:
    """Every registration the heartbeat starts (its start time), in this process."""
    started: list[float] = []
    beat = Heartbeat.beat

    def counted(self: Heartbeat) -> None:
        started.append(time.monotonic())
        beat(self)

    Heartbeat.beat = counted  # type: ignore[method-assign]
    return started


def one_batch(
    options: SinkOptions, target: Any, sink: str, run: str, batch: int, parts: int, hold: bool
) -> float:
    """A batch of ``parts`` parts; the seconds its block's exit waited on the heartbeat."""
    block = Block()
    outcomes = []
    holder = None
    for part in range(parts):
        if hold and part == parts - 1:  # the last part's registration waits at the exit
            holder = psycopg.connect(options.url)
            holder.execute("SELECT 1 FROM sqlsink.sinks WHERE sink_id = %s FOR UPDATE", (sink,))
        heartbeat.before_job(block, options, sink, run, "q")
        if holder is not None:
            time.sleep(0.2)  # the registration reaches the lock
        else:
            task = TaskIdentity(sink, batch, 0, run, batch * 10 + part, 0, "q", part=part)
            ids = pa.array(range(batch * 100 + part * 10, batch * 100 + part * 10 + 10))
            outcomes.append(
                write_partition(options, target, task, [pa.RecordBatch.from_pydict({"id": ids})])
            )
    started = time.monotonic()
    heartbeat.end(block)
    waited = time.monotonic() - started
    if holder is not None:
        holder.close()
    with psycopg.connect(options.url, autocommit=True) as conn:
        backend = PostgresBackend(conn, options.lock_timeout_s)  # type: ignore[arg-type]
        Committer(backend, sink, run_timeout_s=options.run_timeout_s).commit_batch(
            batch, outcomes, query_id="q", run_id=run
        )
    return waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    print("$", " ".join([Path(sys.executable).name, *sys.argv]))
    print("date:", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    import sqlsink

    print("sqlsink from:", Path(sqlsink.__file__).parent)
    with tempfile.TemporaryDirectory() as tmp, postgres(args.url, Path(tmp)) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
            conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY)")
            ensure_schema(conn)  # type: ignore[arg-type]
            print("server:", conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        sink, run = f"hb-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        options = SinkOptions.parse(
            {"url": url, "table": TABLE, "sinkId": sink, "runTimeout": "5min"}
        )
        with psycopg.connect(url, autocommit=True) as conn:
            target = plan_target(conn, options, ["id"], None)  # type: ignore[arg-type]
        started = counting_beats()
        one_batch(options, target, sink, run, 0, 1, hold=False)  # the schema, warm sessions
        time.sleep(0.5)
        started.clear()
        waits = [
            one_batch(options, target, sink, run, b, 1, hold=False)
            for b in range(1, args.batches + 1)
        ]
        time.sleep(0.5)  # a registration still running after its block's exit
        beats = len(started)
        print(
            f"one part, {len(waits)} batches: heartbeat registrations {beats} "
            f"({beats / len(waits):.2f} a batch); block exit's wait on the heartbeat: "
            f"median {statistics.median(waits) * 1000:.2f} ms, max {max(waits) * 1000:.2f} ms"
        )
        held = one_batch(options, target, sink, run, args.batches + 1, 2, hold=True)
        print(f"two parts, part 1's registration in progress: block exit waited {held:.3f} s")
        deadline = time.monotonic() + 10
        while any(t.name.startswith("sqlsink heartbeat") for t in threading.enumerate()):
            assert time.monotonic() < deadline, "a heartbeat thread outlived its batch by 10 s"
            time.sleep(0.05)


if __name__ == "__main__":
    main()
