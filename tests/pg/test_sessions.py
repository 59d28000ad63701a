"""Sessions kept between batches (sqlsink/postgres/sessions.py), on a real server: kept
only after a clean use, named ``sqlsink idle`` while kept (so never taken for a live
run), stripped of locks and settings, replaced when the server ended them, bounded in
number, never shared with a forked child, and ended by the server when idle too long."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import psycopg
import pytest

from sqlsink.postgres import appnames, sessions
from sqlsink.postgres.sessions import IDLE_NAME, session


@pytest.fixture(autouse=True)
def nothing_kept() -> Iterator[None]:
    sessions.close_idle()
    yield
    sessions.close_idle()


def pid_of(url: str, name: str) -> int:
    with session(url, None, application_name=name) as conn:
        return int(conn.info.backend_pid)


def activity(url: str, pid: int) -> tuple[str, str] | None:
    """(application_name, state) of a session, None when it is gone."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT application_name, state FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def gone(url: str, pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if activity(url, pid) is None:
            return True
        time.sleep(0.05)
    return False


def test_a_clean_use_is_kept_idle_and_named_for_its_next_use(pg_url: str) -> None:
    with session(pg_url, None, application_name="sqlsink s1 commit") as conn:
        pid = conn.info.backend_pid
        assert activity(pg_url, pid) == ("sqlsink s1 commit", "idle")
    assert activity(pg_url, pid) == (IDLE_NAME, "idle")
    assert not appnames.of_sink(IDLE_NAME, "s1")  # status and recover: nobody's, not live
    with session(pg_url, None, application_name="sqlsink s1 commit") as conn:
        assert conn.info.backend_pid == pid
        assert activity(pg_url, pid) == ("sqlsink s1 commit", "idle")
        row = conn.execute("SHOW idle_session_timeout").fetchone()
        assert row == ("0",)  # only while kept


def test_what_a_use_leaves_in_the_session_is_dropped_before_it_is_kept(pg_url: str) -> None:
    with session(pg_url, None, application_name="sqlsink s2 commit") as conn:
        pid = conn.info.backend_pid
        conn.execute("SELECT pg_advisory_lock(4242)")
        conn.execute("SET lock_timeout = '1ms'")
        conn.execute("CREATE TEMP TABLE left_behind (i int)")
    with psycopg.connect(pg_url, autocommit=True) as other:  # the lock is free
        assert other.execute("SELECT pg_try_advisory_lock(4242)").fetchone() == (True,)
        other.execute("SELECT pg_advisory_unlock(4242)")
    with session(pg_url, None, application_name="sqlsink s2 commit") as conn:
        assert conn.info.backend_pid == pid
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)
        assert conn.execute("SELECT to_regclass('left_behind')").fetchone() == (None,)
        assert conn.execute("SHOW idle_session_timeout").fetchone() == ("0",)


def test_a_use_that_fails_or_leaves_a_transaction_open_is_closed(pg_url: str) -> None:
    with (
        pytest.raises(RuntimeError),
        session(pg_url, None, application_name="sqlsink s3 commit") as conn,
    ):
        failed = conn.info.backend_pid
        raise RuntimeError("the use failed")
    assert gone(pg_url, failed)
    with session(pg_url, None, application_name="sqlsink s3 commit") as conn:
        open_tx = conn.info.backend_pid
        conn.execute("BEGIN")
    assert gone(pg_url, open_tx)
    assert pid_of(pg_url, "sqlsink s3 commit") not in (failed, open_tx)


def test_a_kept_session_the_server_ended_is_replaced_before_the_use(pg_url: str) -> None:
    pid = pid_of(pg_url, "sqlsink s4 commit")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
    with session(pg_url, None, application_name="sqlsink s4 commit") as conn:
        assert conn.info.backend_pid != pid
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_server_ends_a_session_kept_idle_too_long(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions, "IDLE_TIMEOUT_S", 1)
    pid = pid_of(pg_url, "sqlsink s5 commit")
    assert gone(pg_url, pid, within=10.0)  # idle_session_timeout, on the server
    assert pid_of(pg_url, "sqlsink s5 commit") != pid  # and the next use gets a new one


def test_kept_sessions_are_bounded_per_target_and_in_all(pg_url: str) -> None:
    held = []
    with (
        session(pg_url, None, application_name="a") as a,
        session(pg_url, None, application_name="b") as b,
        session(pg_url, None, application_name="c") as c,
    ):
        held = [a.info.backend_pid, b.info.backend_pid, c.info.backend_pid]
    alive = [pid for pid in held if not gone(pg_url, pid, within=0.5)]
    assert len(alive) == sessions.KEEP  # the oldest of the target closed
    for n in range(sessions.KEEP_ALL + 2):  # other targets: other passwords
        with session(pg_url, f"pw{n}", application_name="d"):
            pass
    assert len(sessions._idle) == sessions.KEEP_ALL


def test_a_forked_child_never_uses_its_parents_kept_session(pg_url: str) -> None:
    pid = pid_of(pg_url, "sqlsink s6 commit")
    child = os.fork()
    if child == 0:  # the child: a session of its own, the parent's untouched
        code = 1
        try:
            with session(pg_url, None, application_name="sqlsink s6 child") as conn:
                code = 0 if conn.info.backend_pid != pid else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with session(pg_url, None, application_name="sqlsink s6 commit") as conn:
        assert conn.info.backend_pid == pid  # still good, still the parent's
        assert conn.execute("SELECT 1").fetchone() == (1,)
