"""MariaDB's load paths for one partition, no Spark (issue 31, item 2): which one the sink
keeps (sqlsink/mariadb/partition.py).

The rows: ``--rows`` (200,000) of a mixed-type table (bigint key, int, double, decimal(38,
10), varchar with tabs, newlines and backslashes, utf8mb4 text, varbinary, boolean,
datetime(6), date; some NULLs), as Arrow record batches of 10,000 rows, built before
timing. Each path loads all of them into an empty table in one transaction of one
session, committed; best of ``--repeat`` (3) runs, the table truncated between:

    load_data   LOAD DATA LOCAL INFILE from a FIFO fed by a thread: the sink's encoding
                (sqlsink.mariadb.encoding, Arrow compute) timed with the load
    insert      PyMySQL's executemany of one multi-row INSERT per ~1 MB (the driver's own
                batching: what a multi-row INSERT from Python costs); the rows' conversion
                from Arrow to Python tuples timed with it
    sink        the sink's whole branch (sqlsink.mariadb.partition.write_partition: the
                checks, XA START, LOAD DATA, marker, XA END, XA PREPARE, disconnect) and
                the XA COMMIT, through the core's Committer

(PyMySQL has no server-side prepared statements; a prepared INSERT would need another
client, and its per-row round trips or its own batching are what executemany does.)

A private mariadbd is started (tests/fix_mariadb.py's: Debian's binaries, the binary log
on, a free port), and stopped at the end. Run from the repository's root:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/mariadb_load.py [--rows N] [--repeat R]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from sqlsink.core.committer import Committer
from sqlsink.core.model import TaskIdentity
from sqlsink.mariadb import encoding
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.partition import LoadTarget, write_partition
from sqlsink.mariadb.schema import ensure_schema
from tests.fix_mariadb import _own_server

COLUMNS = (
    "id bigint PRIMARY KEY, n int, f double, d decimal(38, 10), s varchar(100), "
    "u text, b varbinary(64), ok boolean, ts datetime(6), day date"
)
BATCH = 10_000


def make_batches(count: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    out = []
    base = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    words = ["plain", "tab\there", "new\nline", "back\\slash", "", "ünï 😀", "\\N"]
    for start in range(0, count, BATCH):
        n = min(BATCH, count - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        nulls = rng.random(n) < 0.05
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "id": pa.array(ids),
                    "n": pa.array(rng.integers(-(2**31), 2**31 - 1, n), pa.int32()),
                    "f": pa.array(rng.normal(size=n), mask=nulls),
                    "d": pa.array(
                        [Decimal(int(x)).scaleb(-10) for x in rng.integers(-(10**17), 10**17, n)],
                        pa.decimal128(38, 10),
                    ),
                    "s": pa.array([words[i % len(words)] + str(i) for i in ids], mask=nulls),
                    "u": pa.array([f"text {i} 😀 ü" for i in ids]),
                    "b": pa.array([bytes(rng.integers(0, 256, 16, dtype=np.uint8)) for _ in ids]),
                    "ok": pa.array(rng.random(n) < 0.5),
                    "ts": pa.array(
                        [base + dt.timedelta(microseconds=int(x)) for x in ids * 997],
                        pa.timestamp("us", "UTC"),
                    ),
                    "day": pa.array(
                        [dt.date(2024, 1, 1) + dt.timedelta(days=int(i % 900)) for i in ids]
                    ),
                }
            )
        )
    return out


def load_data(conn: Any, table: str, batches: list[pa.RecordBatch]) -> None:
    place = tempfile.mkdtemp(prefix="bench-load-")
    fifo = os.path.join(place, "rows")
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as pipe:
            for batch in batches:
                pipe.write(encoding.encode(batch))

    feeder = threading.Thread(target=feed)
    feeder.start()
    statement, args = encoding.load_statement(f"`{table}`", batches[0].schema.names, fifo)
    execute(conn, "BEGIN")
    execute(conn, statement, args)
    execute(conn, "COMMIT")
    feeder.join()
    os.unlink(fifo)
    os.rmdir(place)


def insert(conn: Any, table: str, batches: list[pa.RecordBatch]) -> None:
    names = batches[0].schema.names
    statement = (
        f"INSERT INTO `{table}` ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
    )
    execute(conn, "BEGIN")
    with conn.cursor() as cur:
        for batch in batches:
            columns = [c.to_pylist() for c in batch.columns]
            cur.executemany(statement, list(zip(*columns, strict=True)))
    execute(conn, "COMMIT")


def sink(url: str, table: str, batches: list[pa.RecordBatch]) -> None:
    sink_id = f"b-{uuid.uuid4().hex[:8]}"
    task = TaskIdentity(sink_id, 0, 0, "run1", 1, 0, "q1")
    outcome = write_partition(LoadTarget(url, table), task, batches)
    conn = connect(url)
    try:
        Committer(MariaDBBackend(conn), sink_id).commit_batch(
            0, [outcome], query_id="q1", run_id="run1"
        )
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    batches = make_batches(args.rows)
    with tempfile.TemporaryDirectory(prefix="bench-mariadb-") as base:
        servers = _own_server(Path(base))
        server = next(servers)
        try:
            url = server.url()
            conn = connect(url, local_infile=True)
            ensure_schema(conn)
            table = "bench_load"
            execute(conn, f"CREATE TABLE `{table}` ({COLUMNS}) ENGINE=InnoDB")
            paths: dict[str, Callable[[], None]] = {
                "load_data": lambda: load_data(conn, table, batches),
                "insert": lambda: insert(conn, table, batches),
                "sink": lambda: sink(url, table, batches),
            }
            results: dict[str, float] = {}
            for name, run in paths.items():
                times = []
                for _ in range(args.repeat):
                    execute(conn, f"TRUNCATE TABLE `{table}`")
                    began = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - began)
                    count = int(rows(conn, f"SELECT count(*) FROM `{table}`")[0][0])
                    assert count == args.rows, (name, count)
                results[name] = min(times)
                print(
                    f"{name:10s} best {min(times):7.2f} s  {args.rows / min(times):9.0f} rows/s  "
                    f"(runs: {', '.join(f'{t:.2f}' for t in times)})",
                    flush=True,
                )
            print(f"insert / load_data: {results['insert'] / results['load_data']:.1f}x slower")
            if args.json:
                args.json.write_text(
                    json.dumps({"rows": args.rows, "best_s": results}, indent=2) + "\n"
                )
            conn.close()
        finally:
            servers.close()


if __name__ == "__main__":
    main()
