"""The COPY's sending thread (``sqlsink.postgres.connection.CopySender``): an error of the
partition's thread (a value the encoder refuses) or of the sending thread (the session
killed mid-COPY) surfaces with its own text, leaves nothing prepared and no thread
running; rows the thread sent arrive whole and in order."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.core.model import TaskIdentity
from sqlsink.errors import TransientError, WriteError
from sqlsink.options import SinkOptions
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.partition import write_partition
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import plan_target
from tests.fix_pg import PgServer, prepared_transactions


def batches(first: int, count: int, size: int, bad_at: int | None = None) -> list[pa.RecordBatch]:
    """count batches of size rows (id, x); x of batch bad_at's last row is infinity."""
    out = []
    for number in range(count):
        ids = list(range(first + number * size, first + (number + 1) * size))
        xs = [float(i) for i in ids]
        if number == bad_at:
            xs[-1] = float("inf")
        out.append(pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()), "x": xs}))
    return out


def setup(conn: psycopg.Connection, pg_url: str, table: str, sink: str) -> tuple:  # type: ignore[type-arg]
    ensure_schema(conn)  # type: ignore[arg-type]
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, x numeric)").format(sql.Identifier(table))
    )
    options = SinkOptions.parse({"url": pg_url, "table": table, "sinkId": sink})
    return options, plan_target(conn, options, ["id", "x"], None)  # type: ignore[arg-type]


def senders() -> list[threading.Thread]:
    """The COPY sending threads alive (psycopg names them after their target, worker)."""
    return [t for t in threading.enumerate() if t.name.endswith("(worker)")]


def task(sink: str, batch: int) -> TaskIdentity:
    return TaskIdentity(sink, batch, 0, "run1", 0, 0, query_id=None)


def count(conn: psycopg.Connection, table: str) -> int:  # type: ignore[type-arg]
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
    return int(row[0]) if row else -1


def test_rows_sent_by_the_thread_arrive_whole(pg_url: str, table: str) -> None:
    sink = f"s-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        options, target = setup(conn, pg_url, table, sink)
        outcome = write_partition(options, target, task(sink, 1), batches(0, 30, 20_000))
        assert senders() == []
        assert outcome.gid is not None
        backend = PostgresBackend(conn)  # type: ignore[arg-type]
        backend.insert_decision(sink, 1, [outcome.gid], outcome.rows, None, "run1")
        backend.commit_prepared(outcome.gid)
        query = sql.SQL("SELECT count(*), min(id), max(id), sum(x) FROM {}")
        row = conn.execute(query.format(sql.Identifier(table))).fetchone()
        assert row is not None
        assert (row[0], row[1], row[2], int(row[3])) == (600_000, 0, 599_999, 599_999 * 300_000)


def test_an_encoding_error_mid_copy_surfaces_and_ends_the_thread(
    pg_url: str, pg_server: PgServer, table: str
) -> None:
    sink = f"s-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        options, target = setup(conn, pg_url, table, sink)
        with pytest.raises(WriteError, match=r"row 19999 of the batch: .*inf") as caught:
            write_partition(options, target, task(sink, 1), batches(0, 30, 20_000, bad_at=20))
        assert "column 'x'" in str(caught.value)
        assert senders() == []  # the sending thread ended
        assert prepared_transactions(pg_server.admin_url) == []
        assert count(conn, table) == 0


def test_the_sending_threads_error_surfaces_and_ends_the_thread(
    pg_url: str,
    pg_server: PgServer,
    table: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session is killed while the partition's thread sleeps after its first batch:
    the sending thread's next write fails, and the partition's thread raises that."""
    sink = f"s-{uuid.uuid4().hex[:8]}"
    faults = tmp_path / "faults.json"
    sleep = {"point": "mid_copy", "batch": 1, "attempt": 0, "action": "sleep", "seconds": 1.5}
    faults.write_text(json.dumps([sleep]))
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        options, target = setup(conn, pg_url, table, sink)

        sending: list[int] = []

        def kill_the_copy() -> None:
            with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
                for _ in range(100):
                    sending.append(len(senders()))
                    found = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE query LIKE 'COPY %%' AND pid <> pg_backend_pid()"
                    ).fetchall()
                    if found:
                        return
                    time.sleep(0.02)

        killer = threading.Thread(target=kill_the_copy)
        killer.start()
        with pytest.raises(TransientError) as caught:
            write_partition(options, target, task(sink, 1), batches(0, 40, 20_000))
        killer.join()
        message = str(caught.value)
        assert (faults.parent / "faults.json.fired").exists()
        assert "writing to table" in message and "server says:" in message
        # the sending thread's own error (psycopg's put_copy_data), not the COPY's end
        assert "sending copy data failed" in message, message
        assert sending[-1] == 1  # the COPY had its sending thread when it was killed
        assert senders() == []
        assert prepared_transactions(pg_server.admin_url) == []
        assert count(conn, table) == 0
