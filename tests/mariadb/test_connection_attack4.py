"""Attack (atk-fixes) on connection.connect's login bound (2bb940f): a server that sends
its greeting and then stalls, and one that trickles its greeting. A proxy in front of
the real private mariadbd (tests/fix_mariadb.py); every wait bounded."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sqlsink.errors import TransientError
from sqlsink.mariadb.connection import connect
from tests.fix_mariadb import TARGET_DB, MariaServer


def _proxy(server: MariaServer, mode: str) -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def one(client: socket.socket) -> None:
        upstream = socket.create_connection((server.host, server.port), 5)
        held.append(upstream)
        greeting = upstream.recv(65536)
        if mode == "stall":
            client.sendall(greeting)  # then never forward the answer to the login
            while not stop.is_set():
                time.sleep(0.1)
            return
        for byte in greeting:  # trickle: one byte every 1.5 s (timeout 2 s)
            if stop.is_set():
                return
            with contextlib.suppress(OSError):
                client.sendall(bytes([byte]))
            stop.wait(1.5)

    def serve() -> None:
        started = time.monotonic()
        while not stop.is_set() and time.monotonic() - started < 60:
            with contextlib.suppress(OSError):
                client = listener.accept()[0]
                held.append(client)
                threading.Thread(target=one, args=(client,), daemon=True).start()
        for sock in held:
            sock.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(10)


@pytest.fixture
def stall_port(mariadb_server: MariaServer) -> Iterator[int]:
    yield from _proxy(mariadb_server, "stall")


@pytest.fixture
def trickle_port(mariadb_server: MariaServer) -> Iterator[int]:
    yield from _proxy(mariadb_server, "trickle")


def test_greeting_then_stall_is_given_up_with_true_words(
    stall_port: int, mariadb_server: MariaServer
) -> None:
    url = f"mariadb://sink:{mariadb_server.sink[1]}@127.0.0.1:{stall_port}/{TARGET_DB}"
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        connect(url, doing="planning the batch", connect_timeout=2)
    took = time.monotonic() - started
    text = str(caught.value)
    assert 1.5 < took < 6, took
    assert "did not answer the login within 2 s" in text, text
    assert mariadb_server.sink[1] not in text


def test_a_trickled_greeting_is_given_up_within_a_bound_of_connect_timeout(
    trickle_port: int, mariadb_server: MariaServer
) -> None:
    """connect's docstring: 'the login is bounded (invariant 11): connect_timeout ... a
    server that accepts and never answers is given up after it'. The bound is per read,
    not for the login: a server (or a proxy) that sends its greeting one byte every 1.5 s
    under connect_timeout=2 keeps the login waiting for about 1.5 s per byte of the
    greeting (a MariaDB greeting is ~100 bytes: minutes; with the default 10 s, one byte
    every 9 s: a quarter of an hour) and the connect is not given up in ~connect_timeout."""
    url = f"mariadb://sink:{mariadb_server.sink[1]}@127.0.0.1:{trickle_port}/{TARGET_DB}"
    started = time.monotonic()
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            connect(url, doing="planning the batch", connect_timeout=2).close()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(12)  # 6x connect_timeout
    took = time.monotonic() - started
    assert outcome, f"the login still waits after {took:.0f} s with connect_timeout=2"


def test_a_trickled_greeting_is_given_up_with_true_words(
    trickle_port: int, mariadb_server: MariaServer
) -> None:
    """The fix (connect's watchdog): the whole login ends within connect_timeout +
    LOGIN_MARGIN_S, and the error says the server did not finish the login within
    connect_timeout (not that it did not answer: it did, a byte at a time)."""
    from sqlsink.mariadb.connection import LOGIN_MARGIN_S

    url = f"mariadb://sink:{mariadb_server.sink[1]}@127.0.0.1:{trickle_port}/{TARGET_DB}"
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        connect(url, doing="planning the batch", connect_timeout=2)
    took = time.monotonic() - started
    text = str(caught.value)
    assert 2 <= took < 2 + LOGIN_MARGIN_S + 4, took  # (bounded; trickled, about 150 s)
    assert "did not finish the login within 2 s" in text, text
    assert "did not answer" not in text, text
    assert "cannot connect to MariaDB at 127.0.0.1" in text, text
    assert mariadb_server.sink[1] not in text


def test_a_trickled_greeting_without_doing_is_pymysqls_error_with_true_words(
    trickle_port: int, mariadb_server: MariaServer
) -> None:
    """The sink's own second sessions (no ``doing``) get PyMySQL's error type, with words
    that say the login was ended, not that the server hung up."""
    import pymysql

    url = f"mariadb://sink:{mariadb_server.sink[1]}@127.0.0.1:{trickle_port}/{TARGET_DB}"
    started = time.monotonic()
    with pytest.raises(pymysql.err.OperationalError) as caught:
        connect(url, connect_timeout=2)
    assert time.monotonic() - started < 5
    assert "Login not finished within 2 s" in str(caught.value), caught.value


def test_a_login_that_finishes_leaves_no_watchdog(mariadb_server: MariaServer) -> None:
    """A session kept past its login's deadline is not shut down by the watchdog."""
    url = f"mariadb://sink:{mariadb_server.sink[1]}@127.0.0.1:{mariadb_server.port}/{TARGET_DB}"
    conn = connect(url, doing="planning the batch", connect_timeout=1)
    try:
        time.sleep(2.5)  # past connect_timeout + LOGIN_MARGIN_S
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchall() == ((1,),)
    finally:
        conn.close()
