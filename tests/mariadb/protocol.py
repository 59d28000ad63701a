"""Helpers for the MariaDB protocol tests: partition tasks (``sqlsink.mariadb.partition``)
and commits (``Committer`` on ``MariaDBBackend``), without Spark."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow as pa

from sqlsink.core.committer import Committer
from sqlsink.core.model import PartitionOutcome, ResolutionReport, TaskIdentity
from sqlsink.mariadb import xid
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.partition import LoadTarget, write_partition
from sqlsink.mariadb.schema import ensure_schema
from tests.fix_mariadb import MariaServer

LOG = "sqlsink"


def new_sink() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def id_rows(ids: range) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": pa.array(list(ids), pa.int64())})]


def make_table(url: str, table: str, columns: str = "id bigint PRIMARY KEY") -> None:
    conn = connect(url)
    try:
        ensure_schema(conn)
        execute(conn, f"CREATE TABLE `{table}` ({columns}) ENGINE=InnoDB")
    finally:
        conn.close()


def ids_of(url: str, table: str) -> list[int]:
    conn = connect(url)
    try:
        return [int(r[0]) for r in rows(conn, f"SELECT id FROM `{table}` ORDER BY id")]
    finally:
        conn.close()


def prepared_of(url: str, sink: str) -> list[str]:
    """The sink's branches XA RECOVER lists."""
    conn = connect(url)
    try:
        found = [xid.from_recover_row(r) for r in rows(conn, "XA RECOVER")]
        return sorted(str(g) for g in found if g is not None and g.sink_id == sink)
    finally:
        conn.close()


def forget_sink(url: str, sink: str) -> None:
    """Roll back what the sink left prepared and erase its commit log rows."""
    conn = connect(url)
    backend = MariaDBBackend(conn, 5.0)
    try:
        for txn in backend.prepared(sink):
            backend.rollback_prepared(txn.gid)
        execute(conn, "BEGIN")
        execute(conn, "SET @sqlsink_forget = %s", (sink,))
        for table in ("markers", "decisions", "runs", "task_sessions", "sinks"):
            execute(conn, f"DELETE FROM `{LOG}`.{table} WHERE sink_id = %s", (sink,))
        execute(conn, "COMMIT")
    finally:
        conn.close()


@dataclass
class Writer:
    """One streaming query writing a sink: its tasks and its committer."""

    url: str
    table: str
    sink: str
    query_id: str | None = "q1"
    run: str = field(default_factory=lambda: uuid.uuid4().hex)
    lock_timeout_s: float = 10.0
    live_s: float = 300.0  # runTimeout: how long the run counts as live unheard
    _attempt: int = 0

    @property
    def target(self) -> LoadTarget:
        return LoadTarget(self.url, self.table, self.lock_timeout_s, run_timeout_s=self.live_s)

    def task(self, batch: int, partition: int = 0) -> TaskIdentity:
        self._attempt += 1
        return TaskIdentity(self.sink, batch, partition, self.run, self._attempt, 0, self.query_id)

    def write(
        self, batch: int, ids: range | list[pa.RecordBatch], partition: int = 0
    ) -> PartitionOutcome:
        given = id_rows(ids) if isinstance(ids, range) else ids
        return write_partition(self.target, self.task(batch, partition), given)

    @contextmanager
    def committer(self) -> Iterator[Committer]:
        conn = connect(self.url)
        try:
            backend = MariaDBBackend(conn, self.lock_timeout_s)
            yield Committer(backend, self.sink, run_timeout_s=self.live_s)
        finally:
            conn.close()

    def commit(self, batch: int, outcomes: list[PartitionOutcome | None]) -> ResolutionReport:
        with self.committer() as committer:
            return committer.commit_batch(
                batch, outcomes, query_id=self.query_id, run_id=self.run, load=not self.query_id
            )

    def batch(self, batch: int, *parts: range) -> ResolutionReport:
        outcomes: list[PartitionOutcome | None] = [
            self.write(batch, ids, p) for p, ids in enumerate(parts)
        ]
        return self.commit(batch, outcomes)


@contextmanager
def global_settings(server: MariaServer, **values: object) -> Iterator[None]:
    """SET GLOBAL on a private server the test started, set back after (each value as
    SQL: quote strings, e.g. binlog_format="'ROW'")."""
    root = server.connect(root=True)
    try:
        before = {name: rows(root, f"SELECT @@GLOBAL.{name}")[0][0] for name in values}
        for name, value in values.items():
            execute(root, f"SET GLOBAL {name} = {value}")
        yield
    finally:
        for name, value in before.items():
            execute(root, f"SET GLOBAL {name} = %s", (value,))
        root.close()
