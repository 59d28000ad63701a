"""connection.connect after atk-mdb3: the login bounded by connect_timeout and the session
without a read timeout afterwards (the one private attribute of PyMySQL the sink writes,
``_end_login_timeouts``), and the words of a failed connect (per-hour account limits,
a runnable CREATE DATABASE, a unix socket). Real private mariadbd (tests/fix_mariadb.py),
no mocks; every wait bounded."""

from __future__ import annotations

import re
import socket
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest

from sqlsink.errors import SqlsinkError, TransientError
from sqlsink.mariadb.connection import connect, rows
from tests.fix_mariadb import TARGET_DB, MariaServer


def test_a_mute_server_is_told_as_accepted_but_not_answering_within_the_timeout(
    mute_port: int,
) -> None:
    url = f"mysql://sink:Pw-9x@127.0.0.1:{mute_port}/{TARGET_DB}"
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        connect(url, doing="planning the batch", connect_timeout=2)
    took = time.monotonic() - started
    text = str(caught.value)
    assert 1.5 < took < 6, took
    assert text.startswith(f"planning the batch: cannot connect to MySQL at 127.0.0.1:{mute_port}")
    assert "accepted the connection but did not answer the login within 2 s" in text, text
    assert "mysqld" in text and "mariadbd" not in text and "Pw-9x" not in text, text


def test_after_the_login_the_session_has_no_read_timeout(mariadb_server: MariaServer) -> None:
    """The login's 1 s read timeout is taken off the session: a statement that takes
    longer (a load, a GET_LOCK wait) is waited for. Fails should PyMySQL rename the
    attributes ``_end_login_timeouts`` writes (the session would keep the 1 s bound, or
    every connect would fail loudly)."""
    conn = connect(mariadb_server.url(), doing="testing", connect_timeout=1)
    try:
        assert rows(conn, "SELECT SLEEP(2.5)")[0][0] == 0
        assert conn._sock.gettimeout() is None  # what the reads run with
        assert rows(conn, "SELECT @@tx_isolation")[0][0] == "READ-COMMITTED"
    finally:
        conn.close()


def test_the_create_database_of_the_fix_runs_as_written(mariadb_server: MariaServer) -> None:
    """A database name with a backtick and a dash: the fix's CREATE DATABASE is quoted so
    that it runs, and creates that very database."""
    name = f"a`b-{uuid.uuid4().hex[:6]}"
    password = urllib.parse.quote(mariadb_server.sink[1])
    url = (
        f"mariadb://sink:{password}@{mariadb_server.host}:{mariadb_server.port}/"
        f"{urllib.parse.quote(name, safe='')}"
    )
    with pytest.raises(SqlsinkError) as caught:
        connect(url, doing="planning the batch")
    text = str(caught.value)
    found = re.search(r"CREATE DATABASE (`(?:[^`]|``)+`)", text)
    assert found is not None, text
    assert f"GRANT ALL ON {found.group(1)}.* TO 'sink'@'%'" in text, text
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute(f"CREATE DATABASE {found.group(1)}")
            cur.execute(
                "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                (name,),
            )
            assert cur.fetchall() == ((name,),)
            cur.execute(f"DROP DATABASE {found.group(1)}")
    finally:
        root.close()


@pytest.mark.parametrize(
    ("limit", "resource"),
    [
        ("MAX_CONNECTIONS_PER_HOUR 1", "max_connections_per_hour"),
        ("MAX_QUERIES_PER_HOUR 2", "max_queries_per_hour"),
    ],
)
def test_an_accounts_hourly_limit_is_named_with_its_fix(
    mariadb_server: MariaServer, limit: str, resource: str
) -> None:
    """Error 1226 names the resource; the fix raises that very limit (not
    MAX_USER_CONNECTIONS) and says the count is per hour."""
    user = f"lim_{uuid.uuid4().hex[:6]}"
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'Lim-pw1' WITH {limit}")
            cur.execute(f"GRANT ALL ON `{TARGET_DB}`.* TO '{user}'@'%'")
        url = f"mariadb://{user}:Lim-pw1@{mariadb_server.host}:{mariadb_server.port}/{TARGET_DB}"
        with pytest.raises(SqlsinkError) as caught:
            for _ in range(3):  # the first connect may be within the limit
                connect(url, doing="planning the batch").close()
        text = str(caught.value)
        assert f"reached its account's {resource} limit" in text, text
        clause = limit.split()[0]
        assert f"ALTER USER '{user}'@'%' WITH {clause}" in text, text
        assert "FLUSH USER_RESOURCES" in text and "Lim-pw1" not in text, text
        assert "MAX_USER_CONNECTIONS" not in text, text
    finally:
        with root.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        root.close()


def test_a_socket_that_nothing_listens_on_is_told_so(tmp_path: Path) -> None:
    """A socket file left by a stopped server: nothing accepts on it."""
    path = f"{tmp_path}/stale.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens
    url = f"mariadb://sink:Pw-9x@localhost/{TARGET_DB}?unix_socket={path}"
    with pytest.raises(TransientError) as caught:
        connect(url, doing="sqlsink status")
    text = str(caught.value)
    assert f"cannot connect to MariaDB at {path}" in text, text
    assert "nothing accepts connections on that socket" in text and "@@socket" in text, text
    assert "host and port" not in text.split("Fix:")[0], text
