"""Flaws found by attacking the MariaDB changes of 1430599..aa6eeac (atk-mdb3): each test
fails on main for the reason its docstring names. Real private mariadbd (tests/fix_mariadb.py),
no mocks; every wait bounded."""

from __future__ import annotations

import socket
import time
import urllib.parse
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from sqlsink.core.model import TaskIdentity
from sqlsink.errors import SqlsinkError
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, rows
from sqlsink.mariadb.locks import lock_name
from sqlsink.mariadb.partition import LoadTarget, write_partition
from sqlsink.options import SinkOptions
from sqlsink.spark.plan import plan_write
from tests.fix_mariadb import TARGET_DB, MariaServer
from tests.mariadb.conftest import SILENT_FOR_S
from tests.mariadb.protocol import Writer, forget_sink, make_table, new_sink
from tests.pg.test_cli import sqlsink

SCHEMA = T.StructType([T.StructField("id", T.LongType(), False)])
CONNECT_TIMEOUT_S = 10.0  # connection.connect's connect_timeout


def _task() -> TaskIdentity:
    return TaskIdentity(f"a3{uuid.uuid4().hex[:8]}", 0, 0, f"r{uuid.uuid4().hex[:8]}", 1, 0, None)


def _ids(n: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": pa.array(list(range(n)), pa.int64())})]


@pytest.mark.parametrize("who", ["planning", "partition"])
def test_a_server_that_accepts_but_never_answers_is_given_up_within_connect_timeout(
    mute_port: int, who: str
) -> None:
    """PyMySQL's connect_timeout bounds only the TCP connect: the server's greeting is
    read with no timeout (read_timeout None), and bound_waits' keepalives are set only
    after connect returns (and a live peer answers keepalives anyway). Planning and a
    partition wait for a mute server forever (invariant 11; libpq's connect_timeout bounds
    PostgreSQL's whole start-up). Here they wait until the mute server hangs up after
    SILENT_FOR_S, then are told 'the server ended the connection during the login'."""
    url = f"mariadb://sink:Pw-9x@127.0.0.1:{mute_port}/{TARGET_DB}"
    started = time.monotonic()
    with pytest.raises(SqlsinkError) as caught:
        if who == "planning":
            plan_write(SinkOptions.parse({"url": url, "table": "t_never"}), SCHEMA, "t")
        else:
            write_partition(LoadTarget(url, f"{TARGET_DB}.t"), _task(), _ids(3))
    took = time.monotonic() - started
    text = str(caught.value)
    assert "Pw-9x" not in text
    assert took < CONNECT_TIMEOUT_S + 5, f"waited {took:.1f} s for a mute server: {text}"
    assert f"cannot connect to MariaDB at 127.0.0.1:{mute_port}" in text, text


def test_the_cli_gives_up_on_a_server_that_never_answers(mute_port: int) -> None:
    """The commands connect with the same connect(): sqlsink status hangs on a mute
    server (bounded here by the mute server hanging up after SILENT_FOR_S)."""
    url = f"mariadb://sink:Pw-9x@127.0.0.1:{mute_port}/{TARGET_DB}"
    started = time.monotonic()
    done = sqlsink("status", "--url", url, timeout=SILENT_FOR_S + 20)
    took = time.monotonic() - started
    assert done.code == 2 and "Pw-9x" not in done.out + done.err
    assert took < CONNECT_TIMEOUT_S + 5, f"status waited {took:.1f} s: {done.err}"


@pytest.mark.parametrize("password", ["pa/ss", "pa#ss", "pa?ss"])
def test_a_password_with_an_unencoded_slash_hash_or_question_mark_is_never_printed(
    password: str,
) -> None:
    """The very error that tells the user to percent-encode '/' quotes the URL with the
    password in clear: urlparts.redact's pattern stops at '/', '#' and '?' (the password's
    own characters), so nothing is redacted. The sink's option check, connect() and every
    command print it (PostgreSQL's URL too: 'postgresql://u:pa/ss@...')."""
    url = f"mariadb://sink:{password}@127.0.0.1:3399/{TARGET_DB}"
    said: list[str] = []
    for step in (
        lambda: SinkOptions.parse({"url": url, "table": "t"}),
        lambda: connect(url, doing="planning the batch"),
    ):
        with pytest.raises(SqlsinkError) as caught:
            step()
        said.append(str(caught.value))
    done = sqlsink("status", "--url", url)
    said.append(done.out + done.err)
    assert done.code == 2
    leaked = [s for s in said if password in s]
    assert not leaked, leaked


def test_the_fix_for_a_database_the_user_may_not_use_is_runnable_sql(
    mariadb_server: MariaServer,
) -> None:
    """not_connected's fix for 1044 names the database unquoted: 'CREATE DATABASE my-db'
    is a syntax error (identifiers are quoted in the sink's texts: `my-db`)."""
    password = urllib.parse.quote(mariadb_server.sink[1])
    url = f"mariadb://sink:{password}@{mariadb_server.host}:{mariadb_server.port}/my-db"
    with pytest.raises(SqlsinkError) as caught:
        plan_write(SinkOptions.parse({"url": url, "table": "t_never"}), SCHEMA, "t")
    text = str(caught.value)
    assert "may not use database 'my-db'" in text, text
    assert "CREATE DATABASE `my-db`" in text, text


def test_a_mysql_url_is_not_told_to_check_mariadbd() -> None:
    """On a mysql:// URL the message names MySQL, but its fix says 'check that mariadbd
    runs': a MySQL server runs mysqld."""
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"mysql://sink:Pw-9x@127.0.0.1:{port}/{TARGET_DB}"
    with pytest.raises(SqlsinkError) as caught:
        write_partition(LoadTarget(url, f"{TARGET_DB}.t"), _task(), _ids(3))
    text = str(caught.value)
    assert f"cannot connect to MySQL at 127.0.0.1:{port}" in text, text
    assert "mariadbd" not in text, text


def test_cli_status_where_nothing_listens_says_so_not_a_lost_connection() -> None:
    """sqlsink status on a MariaDB URL where nothing listens: 'lost the connection to
    MariaDB ... Fix: run the command again: recovery is idempotent' -- no connection was
    ever made, status recovers nothing, and the fix never says to check the server, host
    or port (PostgreSQL's says 'nothing accepts connections at ...; fix: start
    PostgreSQL there, or correct the host and port'). connect(..., doing=) now words this
    for planning and partitions; the commands still get driver_error's reading."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = sqlsink("status", "--url", f"mariadb://sink:Pw-9x@127.0.0.1:{port}/{TARGET_DB}")
    text = done.out + done.err
    assert done.code == 2 and "Pw-9x" not in text
    assert "lost the connection" not in text and "recovery is idempotent" not in text, text
    assert f"127.0.0.1:{port}" in text, text


def test_forget_lock_timeout_says_how_long_it_waited_and_a_true_fix(
    mariadb_server: MariaServer,
) -> None:
    """forget --lock-timeout 500ms while a committer holds the sink lock: the wait is
    bounded (held), but the error says 'waited 0 s', tells to 'raise lockTimeout' (a sink
    option; this command's knob is --lock-timeout), and the CLI adds the fix of a failed
    connect to every TransientError: 'check that the server is up, and the host, port,
    database and user of --url (and its password, or PGPASSWORD ...)'. PostgreSQL's
    forget says the same three things (pid named there)."""
    url = mariadb_server.url()
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=1)
    make_table(url, w.table)
    try:
        w.batch(0, range(0, 5))
        time.sleep(1.2)  # the run is over: forget would go ahead but for the lock
        holder = connect(url)
        try:
            assert rows(holder, "SELECT GET_LOCK(%s, 0)", (lock_name(w.sink),))[0][0] == 1
            pid = rows(holder, "SELECT CONNECTION_ID()")[0][0]
            started = time.monotonic()
            done = sqlsink(
                "forget", "--json", "--sink-id", w.sink, "--lock-timeout", "500ms", "--url", url
            )
            took = time.monotonic() - started
        finally:
            holder.close()
        # a held lock is a refusal, as recover's (exit 1: docs/reference/json.md), not an
        # error: the refusal's words are the document's message and its warning's fix
        assert done.code == 1 and done.json["error"] is None, done.out + done.err
        assert done.json["forgotten"] is False
        assert took < 10, took  # python's start-up and 0.5 s
        message, fix = done.json["message"], done.json["warnings"][0]["fix"] or ""
        assert f"held by connection {pid}" in message, message
        assert "waited 0 s" not in message, message
        assert "--lock-timeout" in message + fix, (message, fix)
        assert "check that the server is up" not in fix, fix
        assert "still held after 0.5s" in message and "lockTimeout" not in message + fix
        assert "KILL CONNECTION" in fix, fix
    finally:
        forget_sink(url, w.sink)


def test_a_branch_rolled_back_by_hand_is_named_by_mariadbs_statement(
    mariadb_server: MariaServer,
) -> None:
    """The committer's 'no longer prepared' error says 'or by hand (ROLLBACK PREPARED)' on
    MariaDB, where the statement is XA ROLLBACK (the texts name the database's statements:
    commit_statement does so for the commits, ServerTerms.rollback_example for the CLI)."""
    url = mariadb_server.url()
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=300)
    make_table(url, w.table)
    try:
        outcome = w.write(0, range(0, 5))
        assert outcome.gid is not None
        conn = connect(url)
        try:
            MariaDBBackend(conn, 5.0).rollback_prepared(outcome.gid)  # by hand
        finally:
            conn.close()
        with pytest.raises(SqlsinkError) as caught:
            w.commit(0, [outcome])
        text = str(caught.value)
        assert "is no longer prepared" in text, text
        assert "ROLLBACK PREPARED" not in text and "XA ROLLBACK" in text, text
    finally:
        forget_sink(url, w.sink)


def test_a_user_at_its_accounts_connection_limit_is_named_as_such(
    mariadb_server: MariaServer,
) -> None:
    """An account's own limit (CREATE/ALTER USER ... WITH MAX_USER_CONNECTIONS n, the
    way one limits a user at run time: the global max_user_connections cannot be set
    from 0 without a restart) is error 1226, not 1203: not_connected falls back to 'the
    connection failed. Fix: see the server's words in brackets' instead of its
    max_user_connections words (raise the limit, or write fewer partitions at once)."""
    user = f"lim_{uuid.uuid4().hex[:6]}"
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute(
                f"CREATE USER '{user}'@'%' IDENTIFIED BY 'Lim-pw1' WITH MAX_USER_CONNECTIONS 1"
            )
            cur.execute(f"GRANT ALL ON `{TARGET_DB}`.* TO '{user}'@'%'")
        url = f"mariadb://{user}:Lim-pw1@{mariadb_server.host}:{mariadb_server.port}/{TARGET_DB}"
        held = connect(url)  # the one session the account may have
        try:
            with pytest.raises(SqlsinkError) as caught:
                write_partition(LoadTarget(url, f"{TARGET_DB}.t"), _task(), _ids(3))
        finally:
            held.close()
        text = str(caught.value)
        assert "max_user_connections" in text and "Lim-pw1" not in text, text
        assert "the connection failed" not in text, text
        assert "fewer partitions" in text, text
    finally:
        with root.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        root.close()


def test_a_unix_socket_that_is_not_there_is_told_about_the_socket(tmp_path: Path) -> None:
    """A URL whose unix_socket names no socket: the message names the path, but its fix
    speaks of 'the URL's host and port' and 'a bind-address of 127.0.0.1', none of
    which a socket has (the fix: the socket path mariadbd listens on, its socket
    setting)."""
    path = tmp_path / "no.sock"
    url = f"mariadb://sink:Pw-9x@localhost/{TARGET_DB}?unix_socket={path}"
    with pytest.raises(SqlsinkError) as caught:
        plan_write(SinkOptions.parse({"url": url, "table": "t_never"}), SCHEMA, "t")
    text = str(caught.value)
    assert f"cannot connect to MariaDB at {path}" in text, text
    assert "host and port" not in text and "bind-address" not in text, text


@pytest.mark.parametrize("step", ["commit", "heartbeat", "run end"])
def test_the_drivers_commit_heartbeat_and_run_end_are_not_called_planning(step: str) -> None:
    """loading._session, which now says 'planning the batch' of every failed connect,
    opens the driver's sessions of every batch too: the committer's (CommitterSession,
    each batch's decision and commits), the run's heartbeat and the run's end record. A
    server down at batch 7's commit is reported as 'planning the batch: cannot connect
    ...' (DESIGN 5.1 and the commit say: planning or a partition)."""
    from sqlsink.spark.plan import CommitterSession, database_of

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"mariadb://sink:Pw-9x@127.0.0.1:{port}/{TARGET_DB}"
    options = SinkOptions.parse({"url": url, "table": "t_never", "sinkId": "a3-driver"})
    loading = database_of(options).loading()
    with pytest.raises(SqlsinkError) as caught:
        if step == "commit":
            with CommitterSession(options, "a3-driver"):
                pass
        elif step == "heartbeat":
            with loading.heartbeat_backend(options, "a3-driver"):
                pass
        else:
            loading.record_run_end(options, "a3-driver", "run1", "stopped", None)
    text = str(caught.value)
    assert "cannot connect to MariaDB" in text and "Pw-9x" not in text, text
    assert not text.startswith("planning the batch"), text
