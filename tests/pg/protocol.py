"""Helpers for the protocol tests: partition tasks and commits through the sink's own code.

A task is ``write_partition`` (the participant's checks, COPY, marker, PREPARE); a
commit is ``Committer.commit_batch`` on ``PostgresBackend``: exactly what the Spark
adapter calls, without Spark, so every interleaving can be set up by hand.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sqlsink.core.committer import Committer
from sqlsink.core.gid import Gid
from sqlsink.core.model import PartitionOutcome, ResolutionReport, TaskIdentity
from sqlsink.options import SinkOptions
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.partition import write_partition
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import TargetPlan, plan_target
from sqlsink.postgres.views import ConsistentView
from tests.fix_pg import forget_sink


def new_sink() -> str:
    return f"p-{uuid.uuid4().hex[:8]}"


def rows(ids: range) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": pa.array(list(ids), pa.int64())})]


@dataclass
class Writer:
    """One writer of a sink: a streaming query (``query_id``) or a batch load (None)."""

    url: str
    table: str
    sink: str
    query_id: str | None
    run: str = field(default_factory=lambda: uuid.uuid4().hex)
    extra: dict[str, str] = field(default_factory=dict)
    token: str | None = None  # the driver's (spark/driver_token.py), when it has one
    _attempt: int = 0

    @property
    def options(self) -> SinkOptions:
        return SinkOptions.parse(
            {"url": self.url, "table": self.table, "sinkId": self.sink, **self.extra}
        )

    def target(self) -> TargetPlan:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return plan_target(conn, self.options, ["id"], None)  # type: ignore[arg-type]

    def task(self, batch: int, partition: int = 0, attempt_number: int = 0) -> TaskIdentity:
        self._attempt += 1
        return TaskIdentity(
            self.sink,
            batch,
            partition,
            self.run,
            self._attempt,
            attempt_number,
            self.query_id,
            writer_token=self.token,
        )

    def write(self, batch: int, ids: range, partition: int = 0) -> PartitionOutcome:
        return write_partition(self.options, self.target(), self.task(batch, partition), rows(ids))

    @contextmanager
    def committer(self) -> Iterator[Committer]:
        options = self.options
        with psycopg.connect(self.url, autocommit=True) as conn:
            backend = PostgresBackend(conn, options.lock_timeout_s)  # type: ignore[arg-type]
            view = options.consistent_view  # kept as the Spark adapter's commit keeps it
            yield Committer(
                backend,
                self.sink,
                timeouts=options.timeouts,
                run_timeout_s=options.run_timeout_s,
                keep_batches=options.keep_batches,
                view=None if view is None else ConsistentView(backend, view, options.table),
            )

    def commit(self, batch: int, outcomes: list[PartitionOutcome | None]) -> ResolutionReport:
        with self.committer() as committer:
            return committer.commit_batch(
                batch, outcomes, query_id=self.query_id, run_id=self.run, load=not self.query_id
            )

    def abort(
        self, batch: int, outcomes: list[PartitionOutcome | None], run: str | None = ""
    ) -> ResolutionReport:
        """Spark's abort(): the run id is the writer's unless given (None: unknown)."""
        with self.committer() as committer:
            return committer.abort_batch(
                batch,
                outcomes,
                run_id=self.run if run == "" else run,
                query_id=self.query_id,
                load=not self.query_id,
                writer_token=self.token,
            )

    def batch(self, batch: int, *parts: range) -> ResolutionReport:
        """A whole batch: one task per range, then the commit."""
        outcomes: list[PartitionOutcome | None] = [
            self.write(batch, ids, p) for p, ids in enumerate(parts)
        ]
        return self.commit(batch, outcomes)


def make_table(url: str, table: str, *, key: bool = True) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        column = "id bigint PRIMARY KEY" if key else "id bigint"
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), sql.SQL(column)))


def ids_of(url: str, table: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
        return [int(str(r[0])) for r in found]


def prepared_of(url: str, sink: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s ORDER BY gid",
            (f"sqlsink\\_{sink}\\_%",),
        )
        return [str(r[0]) for r in found]


@pytest.fixture
def sink(pg_url: str) -> Iterator[str]:
    """A new sink id; its commit log is forgotten after the test."""
    sink = new_sink()
    yield sink
    forget_sink(pg_url, sink)


@pytest.fixture
def keyed(pg_url: str, table: str) -> str:
    """The test's table, with a primary key on ``id``."""
    make_table(pg_url, table)
    return table


def prepare_by_hand(pg_url: str, table: str, gid: Gid, ids: range) -> str:
    """A partition transaction as a task leaves it (rows, marker, PREPARE)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        with (
            conn.cursor() as cur,
            cur.copy(sql.SQL("COPY {} (id) FROM STDIN").format(sql.Identifier(table))) as copy,
        ):
            for i in ids:
                copy.write_row((i,))
        conn.execute(
            "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
            "VALUES (%s, %s, %s, %s, %s)",
            (str(gid), gid.sink_id, gid.batch_id, gid.partition_id, len(ids)),
        )
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(str(gid))))
    return str(gid)
