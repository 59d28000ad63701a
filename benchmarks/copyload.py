"""Plain binary COPY from N processes at once, no Spark: the database-level shapes.

The rows (``workload`` rows, in key order) are split between N sessions by a *shape*
(round-robin or contiguous ranges of the key), put in an *order* within each session (key
order, shuffled as Spark's ``repartition(n)`` delivers them, or sorted within every chunk of
k rows), and encoded beforehand, not timed, with the sink's own encoder
(``sqlsink.postgres.encoding``) into one ``Copy.write()`` buffer per ``rows_per_write`` rows
(the sink writes one per Arrow batch, 10,000 rows by default) and one ``COPY`` statement per
``rows_per_copy`` rows (the sink sends one per partition; 0 = one for the session), all in
one transaction per session, committed. N forked processes connect, wait at a barrier, then
load at once; the time is from the barrier to the last commit.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from workload import Dataset

APP = "bench copy"


@dataclass(frozen=True)
class Layout:
    """How the rows reach the server."""

    sessions: int
    shape: str = "range"  # "range": contiguous key ranges; "round_robin": row i -> i % n
    order: str = "key"  # "key", "shuffled", "sorted_chunks" (each chunk_rows sorted)
    chunk_rows: int = 10_000
    rows_per_write: int = 10_000
    rows_per_copy: int = 0  # 0: one COPY per session

    def describe(self) -> str:
        copy = "one COPY" if not self.rows_per_copy else f"a COPY per {self.rows_per_copy:,} rows"
        order = {
            "key": "key order",
            "shuffled": "shuffled",
            "sorted_chunks": f"sorted per {self.chunk_rows:,} rows",
        }[self.order]
        return (
            f"{self.sessions} session(s), {self.shape.replace('_', '-')}, {order}, {copy}, "
            f"{self.rows_per_write:,} rows per write"
        )


def read_sorted(dataset: Dataset) -> pa.Table:
    return pq.read_table(dataset.path).sort_by("id").select(["id", "ts", "n", "x", "s"])


def session_indices(rows: int, layout: Layout, seed: int = 0) -> list[np.ndarray]:
    """The row numbers (into the key-ordered table) each session sends, in sending order."""
    n = layout.sessions
    if layout.shape == "round_robin":
        parts = [np.arange(s, rows, n) for s in range(n)]
    elif layout.shape == "range":
        bounds = [rows * k // n for k in range(n + 1)]
        parts = [np.arange(bounds[s], bounds[s + 1]) for s in range(n)]
    else:
        raise ValueError(f"unknown shape {layout.shape!r}")
    rng = np.random.default_rng(seed)
    out = []
    for part in parts:
        if layout.order in ("shuffled", "sorted_chunks"):
            part = rng.permutation(part)
        if layout.order == "sorted_chunks":
            part = np.concatenate(
                [
                    np.sort(part[i : i + layout.chunk_rows])
                    for i in range(0, len(part), layout.chunk_rows)
                ]
            )
        out.append(part)
    return out


Encoded = list[list[bytes]]  # per COPY statement: its write() buffers


def encode_sessions(table: pa.Table, layout: Layout) -> list[Encoded]:
    """Every session's COPY statements, encoded (not timed)."""
    # imported here: reset() serves benchmarks run against an older package too
    from sqlsink.postgres.catalog import TargetColumn
    from sqlsink.postgres.encoding import build_encoder

    columns = [
        TargetColumn("id", 20, "bigint", True, False),
        TargetColumn("ts", 1184, "timestamp with time zone", True, False),
        TargetColumn("n", 23, "integer", True, False),
        TargetColumn("x", 701, "double precision", True, False),
        TargetColumn("s", 25, "text", True, False),
    ]
    encoder = build_encoder(list(table.schema), columns)
    sessions = []
    for indices in session_indices(table.num_rows, layout):
        part = table.take(pa.array(indices))
        per_copy = layout.rows_per_copy or max(part.num_rows, 1)
        statements: Encoded = []
        for start in range(0, part.num_rows, per_copy):
            piece = part.slice(start, per_copy)
            writes = [
                bytes(encoder.encode(batch))
                for batch in piece.to_batches(max_chunksize=layout.rows_per_write)
            ]
            statements.append(writes)
        sessions.append(statements)
    return sessions


def _load_session(
    url: str, table: str, statements: Encoded, barrier: Any, done: Any, index: int
) -> None:
    from sqlsink.postgres.encoding.writer import COPY_HEADER, COPY_TRAILER

    copy_sql = f"COPY {table} (id, ts, n, x, s) FROM STDIN (FORMAT BINARY)"
    with psycopg.connect(url, application_name=APP) as conn:
        conn.execute("SELECT 1")
        conn.rollback()
        barrier.wait(60)
        with conn.cursor() as cur:
            for writes in statements:
                with cur.copy(copy_sql) as copy:
                    copy.write(COPY_HEADER)
                    for buffer in writes:
                        copy.write(buffer)
                    copy.write(COPY_TRAILER)
        conn.commit()
        done.put((index, time.perf_counter()))


def load_at_once(url: str, table: str, sessions: list[Encoded]) -> float:
    """Load every session's statements from its own forked process at once; wall seconds
    from the barrier to the last commit."""
    fork = multiprocessing.get_context("fork")  # the children inherit the encoded buffers
    barrier = fork.Barrier(len(sessions) + 1)
    done = fork.Queue()
    children = [
        fork.Process(target=_load_session, args=(url, table, s, barrier, done, i))
        for i, s in enumerate(sessions)
    ]
    for child in children:
        child.start()
    barrier.wait(60)
    started = time.perf_counter()
    ends = [done.get(timeout=600)[1] for _ in children]
    for child in children:
        child.join()
    if any(child.exitcode != 0 for child in children):
        raise RuntimeError(f"a COPY process failed: {[c.exitcode for c in children]}")
    return max(ends) - started


def check_table(url: str, table: str, expected: int) -> None:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
    if row is None or int(row[0]) != expected or int(row[1]) != expected:
        raise RuntimeError(f"{table}: expected {expected} rows, found {row}")


def reset(url: str, table: str, ddl: str) -> None:
    """Drop and recreate the table (a fresh index), then checkpoint."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(ddl.format(table=table))
        # no autovacuum (its ANALYZE of the fresh rows) in the middle of a measure
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        conn.execute("CHECKPOINT")
