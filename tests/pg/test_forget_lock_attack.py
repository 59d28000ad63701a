"""sqlsink forget --lock-timeout on PostgreSQL while a committer holds the sink lock
(atk-mdb3): the wait is bounded and names the holder's pid, but the error's words are
not true of this command (tests/mariadb/test_attack_mdb3.py has MariaDB's twin)."""

from __future__ import annotations

import time

from sqlsink.postgres.locks import lock_key
from tests.pg.test_cli import Db, bare_db, db, sqlsink

__all__ = ["bare_db", "db"]  # the fixtures this test uses


def test_forget_lock_timeout_says_how_long_it_waited_and_a_true_fix(db: Db) -> None:
    """'waited 0 s' for --lock-timeout 500ms, 'or raise lockTimeout' (a sink option, not
    this command's --lock-timeout), and the CLI's fix of a failed connect ('check that the
    server is up, and the host, port, database and user of --url ...') for a lock held."""
    with db.connect() as holder:
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (lock_key("a"),))
        pid = holder.info.backend_pid
        started = time.monotonic()
        done = sqlsink(
            "forget", "--json", "--sink-id", "a", "--lock-timeout", "500ms", "--url", db.url
        )
        took = time.monotonic() - started
    # a held lock is a refusal, as recover's (exit 1: docs/reference/json.md), not an
    # error: the refusal's words are the document's message and its warning's fix
    assert done.code == 1 and done.json["error"] is None, done.out + done.err
    assert done.json["forgotten"] is False
    assert took < 10, took
    message, fix = done.json["message"], done.json["warnings"][0]["fix"] or ""
    assert done.json["warnings"][0]["message"] == message
    assert f"pid {pid}" in message, message
    assert "waited 0 s" not in message, message
    assert "--lock-timeout" in message + fix, (message, fix)
    assert "check that the server is up" not in fix, fix
    assert "still held after 0.5s" in message and "lockTimeout" not in message + fix
    assert "pg_terminate_backend" in fix, fix
