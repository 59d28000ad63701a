"""First errors on MariaDB, in the sink's words: a load cut by the server's
net_read_timeout (a pause of Spark's iterator) is a TransientError naming the setting,
its value and the fix; binlog_format=STATEMENT is refused at planning, and by the
partition's first statement if it changes after; MIXED (MariaDB's default) serves the
append and the upsert (its temporary staging table) alike. On the tests' private server,
settings changed with SET GLOBAL and set back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from sqlsink.core.model import TaskIdentity
from sqlsink.errors import ConfigError, SqlsinkError, TransientError, WriteError
from sqlsink.mariadb import xid
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.partition import LoadTarget, write_partition
from sqlsink.mariadb.schema import ensure_schema
from sqlsink.mariadb.upsert import UpsertPlan
from sqlsink.options import SinkOptions
from sqlsink.spark.plan import plan_write
from tests.fix_mariadb import TARGET_DB, MariaServer
from tests.mariadb.protocol import global_settings

SCHEMA = T.StructType([T.StructField("id", T.LongType(), False)])


def _task() -> TaskIdentity:
    return TaskIdentity(
        f"fst{uuid.uuid4().hex[:8]}", 0, 0, f"run{uuid.uuid4().hex[:8]}", 1, 0, None
    )


def _batches(ids: range, pause_s: float = 0.0) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch([pa.array(list(ids)[:50], pa.int64())], names=["id"])
    time.sleep(pause_s)
    yield pa.record_batch([pa.array(list(ids)[50:], pa.int64())], names=["id"])


def _prepared_of(server: MariaServer, sink_id: str) -> list[Any]:
    root = server.connect(root=True)
    try:
        found = [xid.from_recover_row(r) for r in rows(root, "XA RECOVER")]
    finally:
        root.close()
    return [g for g in found if g is not None and g.sink_id == sink_id]


def _finish(server: MariaServer, gid: str) -> None:
    root = server.connect(root=True)
    try:
        execute(root, f"XA COMMIT {xid.encode_text(gid).sql()}")  # type: ignore[union-attr]
    finally:
        root.close()


@pytest.fixture(scope="module")
def table(mariadb_server: MariaServer) -> Iterator[str]:
    name = f"first_{uuid.uuid4().hex[:6]}"
    conn = connect(mariadb_server.url())
    ensure_schema(conn)
    execute(conn, f"CREATE TABLE `{name}` (id bigint PRIMARY KEY) ENGINE=InnoDB")
    yield name
    execute(conn, f"DROP TABLE `{name}`")
    conn.close()


def _count(server: MariaServer, table: str) -> int:
    conn = connect(server.url())
    try:
        return int(rows(conn, f"SELECT count(*) FROM `{table}`")[0][0])
    finally:
        conn.close()


def test_a_load_cut_by_net_read_timeout_is_transient_and_says_so(
    mariadb_server: MariaServer, table: str
) -> None:
    task = _task()
    target = LoadTarget(mariadb_server.url(), f"{TARGET_DB}.{table}")
    with (
        global_settings(mariadb_server, net_read_timeout=1),
        pytest.raises(TransientError) as caught,
    ):
        write_partition(target, task, _batches(range(100), pause_s=2.5))
    text = str(caught.value)
    assert "net_read_timeout" in text
    assert "net_read_timeout = 1 s" in text
    assert "SET GLOBAL net_read_timeout = " in text
    assert "sqlsink check" in text
    assert f"Nothing of batch {task.batch_id} is visible" in text
    assert _prepared_of(mariadb_server, task.sink_id) == []
    assert _count(mariadb_server, table) == 0


def test_statement_logging_is_refused_at_planning(mariadb_server: MariaServer) -> None:
    name = f"stmt_{uuid.uuid4().hex[:6]}"
    options = SinkOptions.parse({"url": mariadb_server.url(), "table": name, "createTable": "true"})
    with (
        global_settings(mariadb_server, binlog_format="'STATEMENT'"),
        pytest.raises(ConfigError) as caught,
    ):
        plan_write(options, SCHEMA, "t")
    text = str(caught.value)
    assert "binlog_format = STATEMENT" in text
    assert "READ COMMITTED" in text
    assert "SET GLOBAL binlog_format = 'ROW'" in text
    assert "binlog_format=ROW under [mariadbd]" in text
    assert "Nothing was written" in text
    conn = connect(mariadb_server.url())
    try:  # refused before anything was written: not even the table created
        found = rows(
            conn,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s AND "
            "table_name = %s",
            (TARGET_DB, name),
        )
        assert found[0][0] == 0
    finally:
        conn.close()


def test_statement_logging_after_planning_is_the_sinks_error(
    mariadb_server: MariaServer, table: str
) -> None:
    task = _task()
    target = LoadTarget(mariadb_server.url(), f"{TARGET_DB}.{table}")
    with (
        global_settings(mariadb_server, binlog_format="'STATEMENT'"),
        pytest.raises(WriteError) as caught,
    ):
        write_partition(target, task, _batches(range(100)))
    text = str(caught.value)
    assert "binlog_format = STATEMENT" in text
    assert "SET GLOBAL binlog_format = 'ROW'" in text
    assert f"batch {task.batch_id}" in text
    assert _prepared_of(mariadb_server, task.sink_id) == []
    assert _count(mariadb_server, table) == 0


@pytest.mark.parametrize("upsert", [None, UpsertPlan(("id",))], ids=["append", "upsert"])
def test_mixed_logging_serves_append_and_upsert(
    mariadb_server: MariaServer, upsert: UpsertPlan | None
) -> None:
    name = f"mixed_{uuid.uuid4().hex[:6]}"
    conn = connect(mariadb_server.url())
    execute(conn, f"CREATE TABLE `{name}` (id bigint PRIMARY KEY) ENGINE=InnoDB")
    conn.close()
    task = _task()
    target = LoadTarget(mariadb_server.url(), f"{TARGET_DB}.{name}", upsert=upsert)
    with global_settings(mariadb_server, binlog_format="'MIXED'"):
        assert plan_write(
            SinkOptions.parse(
                {"url": mariadb_server.url(), "table": name, "mode": "upsert" if upsert else
                 "append"}
            ),
            SCHEMA,
            "t",
        ) is not None  # fmt: skip
        outcome = write_partition(target, task, _batches(range(100)))
    assert outcome.gid is not None
    _finish(mariadb_server, outcome.gid)
    assert _count(mariadb_server, name) == 100
    assert _prepared_of(mariadb_server, task.sink_id) == []
    conn = connect(mariadb_server.url())
    execute(conn, f"DROP TABLE `{name}`")
    conn.close()


def test_enter_task_session_under_statement_logging_is_the_sinks_error(
    mariadb_server: MariaServer, table: str
) -> None:
    from sqlsink.mariadb.backend import enter_task_session

    conn = mariadb_server.connect(root=True)
    try:  # this session only (the table fixture made the commit log): statement logging
        execute(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        execute(conn, "SET SESSION binlog_format = 'STATEMENT'")
        with pytest.raises(WriteError) as caught:
            enter_task_session(conn, "fst-session", 3, 1)
    finally:
        conn.close()
    text = str(caught.value)
    assert text.startswith("sink 'fst-session', batch 3, partition 1: ")
    assert "binlog_format = STATEMENT" in text
    assert "SET GLOBAL binlog_format = 'ROW'" in text


def _wrong(url: str, **change: str) -> str:
    """``url`` with its password, port or database changed."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    user = parts.username or ""
    password = change.get("password", parts.password or "")
    port = change.get("port", str(parts.port))
    path = change.get("database", parts.path.lstrip("/"))
    return f"mariadb://{user}:{password}@{parts.hostname}:{port}/{path}"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"password": "Wr0ng-s3cret"}, "refused the login of user 'sink'"),
        ({"database": "no_such_db"}, "may not use database 'no_such_db'"),
    ],
    ids=["password", "database"],
)
def test_planning_that_cannot_log_in_says_why_in_the_sinks_words(
    mariadb_server: MariaServer, change: dict[str, str], why: str
) -> None:
    url = _wrong(mariadb_server.url(), **change)
    options = SinkOptions.parse({"url": url, "table": "t_never"})
    with pytest.raises(SqlsinkError) as caught:
        plan_write(options, SCHEMA, "t")
    text = str(caught.value)
    assert f"cannot connect to MariaDB at {mariadb_server.host}:{mariadb_server.port}" in text
    assert why in text and "Fix:" in text, text
    assert "Wr0ng-s3cret" not in text and mariadb_server.sink[1] not in text


def test_a_partition_that_cannot_reach_the_server_is_transient_and_says_why() -> None:
    import socket as sockets

    with sockets.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    task = _task()
    target = LoadTarget(f"mariadb://sink:Pw-9x@127.0.0.1:{port}/{TARGET_DB}", f"{TARGET_DB}.t")
    with pytest.raises(TransientError) as caught:
        write_partition(target, task, _batches(range(100)))
    text = str(caught.value)
    assert f"cannot connect to MariaDB at 127.0.0.1:{port}" in text
    assert "nothing accepts connections there" in text and "Fix:" in text, text
    assert f"batch {task.batch_id}, partition {task.partition_id}" in text, text
    assert "Pw-9x" not in text


def test_a_host_that_does_not_resolve_is_named_as_such() -> None:
    task = _task()
    target = LoadTarget(f"mysql://sink:Pw-9x@host.invalid:3306/{TARGET_DB}", f"{TARGET_DB}.t")
    with pytest.raises(TransientError) as caught:
        write_partition(target, task, _batches(range(100)))
    text = str(caught.value)
    assert "cannot connect to MySQL at host.invalid:3306" in text
    assert "host name does not resolve" in text and "Pw-9x" not in text, text
