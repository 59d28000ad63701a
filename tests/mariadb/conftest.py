"""Fixtures shared by tests/mariadb's files (the server itself: tests/fix_mariadb.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

SILENT_FOR_S = 25.0  # the mute server hangs up after this: the test's own bound


@pytest.fixture
def mute_port() -> Iterator[int]:
    """A port that accepts TCP connections but never says a word (a hung mariadbd, a
    proxy whose backend is gone, a firewall that completes handshakes); it hangs up every
    connection after SILENT_FOR_S, so that an unbounded wait ends with the test."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        started = time.monotonic()
        while not stop.is_set() and time.monotonic() - started < SILENT_FOR_S:
            with contextlib.suppress(OSError):  # no connection within 0.2 s
                held.append(listener.accept()[0])
        for sock in held:
            sock.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(SILENT_FOR_S + 5)
