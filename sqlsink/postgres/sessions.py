"""Sessions kept between batches: one idle connection per target, per process.

A new connection costs a TCP handshake, a server process and the pooler probe (about
5 ms here, more across a network), and a micro-batch opens one for its planning, one
per partition and one for its commit. Spark reuses its Python workers, so the same
process plans, writes or commits batch after batch; ``session`` hands it the
connection its last use left, when that is still good, instead of a new one.

What keeps liveness and fencing exact (docs/DESIGN.md, "Sessions kept between
batches"):

- A session is kept only after a use that ended cleanly: no exception, no
  transaction open, the connection good. ``DISCARD ALL`` then drops everything the
  use left in the session (session advisory locks, so never the sink lock; settings
  such as ``lock_timeout``; temporary tables), and it is renamed ``sqlsink idle``:
  ``sqlsink status`` and ``recover`` read the application names of the sink's sessions
  to tell a live run, and an idle session is nobody's. Anything else is closed.
- Taking it back names it for its new use and is its health check: one statement;
  when it fails (the server restarted, the session was ended), the session is closed
  and a new connection is made, before anything of the use has run.
- The server ends a kept session idle for ``IDLE_TIMEOUT_S`` (``idle_session_timeout``,
  PostgreSQL 14 and later), so a process that stops writing does not hold a
  connection slot for long; fencing never needs to end one (it ends only sessions
  holding the sink lock, which an idle one cannot).
- At most ``KEEP`` idle sessions per target and ``KEEP_ALL`` in all per process (the
  oldest is closed first); one in use is never shared. A forked child never touches
  its parent's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator

import psycopg
from psycopg.pq import TransactionStatus

from sqlsink.credentials import PasswordSource
from sqlsink.postgres.connection import Connection, Password, connect

IDLE_NAME = "sqlsink idle"
IDLE_TIMEOUT_S = 60
KEEP = 2  # idle sessions per target and process (a driver's planner and committer)
KEEP_ALL = 4  # idle sessions per process, all targets together
_TIMEOUT_SINCE = 140000  # idle_session_timeout: PostgreSQL 14

_idle: list[tuple[tuple[str, str], Connection]] = []  # (target, session), oldest first
_lock = threading.Lock()
_inherited: list[Connection] = []  # a forked child's copies of its parent's sessions


def _forget_in_child() -> None:
    """A forked child shares its parent's sockets: it must never use (nor close, which
    would end the parent's session) a kept session. They are set aside, untouched."""
    global _lock
    _lock = threading.Lock()  # the parent's may have been held while it forked
    _inherited.extend(conn for _, conn in _idle)
    _idle.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _key(url: str, password: Password) -> tuple[str, str]:
    """The target: the URL and who logs in (a fingerprint of the password, never it)."""
    if isinstance(password, PasswordSource):
        return url, f"source {password.describe()}"
    digest = hashlib.sha256((password or "").encode()).hexdigest()[:16]
    return url, digest


@contextlib.contextmanager
def session(url: str, password: Password, *, application_name: str) -> Iterator[Connection]:
    """An autocommit connection named ``application_name`` for one use: a kept one when
    it is still good, else a new one (``connection.connect``). Kept again after a use
    that ended cleanly; closed otherwise."""
    key = _key(url, password)
    conn = _take(key, application_name) or connect(url, password, application_name=application_name)
    clean = False
    try:
        yield conn
        clean = True
    finally:
        if clean:
            _give_back(key, conn)
        else:
            conn.close()


def _take(key: tuple[str, str], application_name: str) -> Connection | None:
    while True:
        with _lock:
            found = [i for i, (target, _) in enumerate(_idle) if target == key]
            conn = _idle.pop(found[-1])[1] if found else None
        if conn is None:
            return None
        try:
            _name(conn, application_name[:63], idle_timeout_ms=0)
        except psycopg.Error:  # gone meanwhile: a new one instead, nothing has run
            conn.close()
            continue
        return conn


def _give_back(key: tuple[str, str], conn: Connection) -> None:
    if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
        conn.close()
        return
    try:
        conn.execute("DISCARD ALL")
        _name(conn, IDLE_NAME, idle_timeout_ms=IDLE_TIMEOUT_S * 1000)
    except psycopg.Error:
        conn.close()
        return
    with _lock:
        _idle.append((key, conn))
        same = [i for i, (target, _) in enumerate(_idle) if target == key]
        extra = same[: max(0, len(same) - KEEP)]  # the oldest of this target
        closing = [_idle[i][1] for i in extra]
        for i in reversed(extra):
            del _idle[i]
        while len(_idle) > KEEP_ALL:
            closing.append(_idle.pop(0)[1])
    for old in closing:
        with contextlib.suppress(Exception):
            old.close()


def _name(conn: Connection, name: str, *, idle_timeout_ms: int) -> None:
    """One statement: the session's application name, and (PostgreSQL 14+) how long the
    server lets it sit idle (0: for ever, while in use)."""
    if conn.info.server_version >= _TIMEOUT_SINCE:
        conn.execute(
            "SELECT set_config('application_name', %s, false), "
            "set_config('idle_session_timeout', %s, false)",
            (name, str(idle_timeout_ms)),
        )
    else:
        conn.execute("SELECT set_config('application_name', %s, false)", (name,))


def close_idle() -> int:
    """Close every kept session of this process (tests, and a process about to fork)."""
    with _lock:
        kept = [conn for _, conn in _idle]
        _idle.clear()
    for conn in kept:
        with contextlib.suppress(Exception):
            conn.close()
    return len(kept)
