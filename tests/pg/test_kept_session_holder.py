"""A session kept between uses (postgres/sessions.py) that a fenced run recorded as its
sink-lock holder, now in the new run's use: nobody ends it as the fenced run's
(docs/DESIGN.md invariant 10 and 4.3)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sqlsink.core.checkpoint_check import CheckpointCheck, CheckpointMode, CheckpointPolicy
from sqlsink.core.committer import Committer
from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.core.model import PartitionOutcome
from sqlsink.errors import TransientError
from sqlsink.postgres import appnames, locks
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.sessions import close_idle, session
from tests.fix_pg import PgServer
from tests.pg.protocol import Writer, ids_of, prepared_of
from tests.programs import REPO


def commit_on_a_kept_session(
    writer: Writer,
    batch: int,
    outcomes: list[PartitionOutcome | None],
    read_checkpoint: Callable[[], frozenset[int]],
    pids: list[int],
) -> None:
    """The driver's commit as the data source and the foreachBatch writer make it
    (spark/plan.CommitterSession): a kept session named for the sink's commit, the
    checkpoint check reading ``read_checkpoint`` (a remote listing)."""
    name = appnames.committer(writer.sink)
    with session(writer.url, None, application_name=name) as conn:
        pids.append(conn.info.backend_pid)
        backend = PostgresBackend(conn, writer.options.lock_timeout_s)
        policy = CheckpointPolicy("s3://bucket/chk", read_checkpoint, CheckpointMode.WARN)
        committer = Committer(
            backend, writer.sink, checkpoint_check=CheckpointCheck(backend, policy)
        )
        committer.commit_batch(batch, outcomes, query_id=writer.query_id, run_id=writer.run)


def recorded_holders(url: str, sink: str) -> list[tuple[str, bool, int | None]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT run_id, superseded_at IS NOT NULL, lock_pid FROM sqlsink.runs "
            "WHERE sink_id = %s ORDER BY first_seen",
            (sink,),
        ).fetchall()
    return [(str(r), bool(f), None if p is None else int(p)) for r, f, p in rows]


def recover_while_committing(
    writer: Writer, batch: int, outcomes: list[PartitionOutcome | None], pids: list[int]
) -> tuple[str, list[BaseException]]:
    """``writer``'s commit of ``batch`` takes this process's kept session (``pids[0]``'s)
    and holds the sink lock while it reads a slow checkpoint listing (the first commit of
    a run checks the checkpoint); meanwhile ``sqlsink recover --lock-timeout 2s`` runs.
    What recover said, and what the commit raised."""
    reading, release = threading.Event(), threading.Event()

    def slow_listing() -> frozenset[int]:
        reading.set()
        release.wait(25)  # the check's own bound is 30 s
        return frozenset(range(batch))

    failures: list[BaseException] = []

    def commit() -> None:
        try:
            commit_on_a_kept_session(writer, batch, outcomes, slow_listing, pids)
        except BaseException as exc:  # reported by the caller
            failures.append(exc)

    committing = threading.Thread(target=commit)
    committing.start()
    try:
        assert reading.wait(20), "the commit never reached its checkpoint check"
        assert pids[-1] == pids[0]  # the kept session, holding the sink lock now
        with psycopg.connect(writer.url, autocommit=True) as conn:
            holders = locks.sink_lock_holders(conn, writer.sink)  # type: ignore[arg-type]
        assert [h.pid for h in holders] == [pids[0]]
        recover = subprocess.run(
            [sys.executable, "-m", "sqlsink", "recover", "--url", writer.url,
             "--sink-id", writer.sink, "--lock-timeout", "2s"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
    finally:
        release.set()
        committing.join(30)
    assert recover.returncode != 0 or "ended session" in recover.stdout + recover.stderr
    return recover.stdout + recover.stderr, failures


def test_the_new_runs_commit_on_the_fenced_runs_kept_session_is_not_ended(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Review 2026-11-26 R2 (its r6). Run 1 commits through a kept session and records
    it as its sink-lock holder; the query restarts in the same process; run 2's task
    fences run 1, and run 2's first commit takes the same kept session and holds the
    sink lock while it reads a slow checkpoint listing. ``sqlsink recover
    --lock-timeout 2s`` meanwhile took the session for the fenced run's zombie holder
    and ended it: run 2's commit died with AdminShutdown. Now the record names a
    session only while it holds the lock for that run: recover waits, names the live
    holder and does nothing; run 2's commit goes on."""
    close_idle()  # this process's kept sessions: only those this test makes
    pids: list[int] = []
    run1 = Writer(pg_url, keyed, sink, query_id="q", run="run-1")
    commit_on_a_kept_session(run1, 0, [run1.write(0, range(5))], frozenset, pids)
    assert recorded_holders(pg_url, sink) == [("run-1", False, None)]  # cleared at unlock
    # the query restarts in the same process: run 2, whose task fences run 1
    run2 = Writer(pg_url, keyed, sink, query_id="q", run="run-2")
    written = [run2.write(1, range(5, 10))]
    said, failures = recover_while_committing(run2, 1, written, pids)
    assert failures == [], f"run 2's commit failed: {failures!r}; recover said: {said}"
    assert "ended session" not in said
    assert "the sink's lock is still held after 2s" in said
    assert f"its lock is held by pid {pids[0]} 'sqlsink {sink} commit'" in said
    assert "nothing was done for it" in said
    assert "--force --run-id run-2" in said  # the holder's run: the live one
    assert ids_of(pg_url, keyed) == list(range(10))
    assert prepared_of(pg_url, sink) == []
    assert recorded_holders(pg_url, sink) == [("run-1", True, None), ("run-2", False, None)]


def test_a_record_the_unlock_could_not_clear_does_not_get_the_new_runs_holder_ended(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unlock never waits for a runs row another transaction holds (a registration
    at that very moment): it leaves that record. Run 1's row is locked while its commit
    lets the lock go, so its record of the kept session stays; run 2's commit then
    holds the lock on that session and records it too. A session that a run not
    superseded records is that run's: recover does not end it."""
    close_idle()
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "after_commit", "batch": 0, "action": "sleep",
                                   "seconds": 2}]))  # fmt: skip
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    pids: list[int] = []
    run1 = Writer(pg_url, keyed, sink, query_id="q", run="run-1")
    first = [run1.write(0, range(5))]
    committing = threading.Thread(
        target=commit_on_a_kept_session, args=(run1, 0, first, frozenset, pids)
    )
    committing.start()
    with psycopg.connect(pg_url) as row_lock:  # a transaction holding run 1's row
        deadline = time.monotonic() + 20
        while not Path(f"{faults}.fired").exists():  # run 1 sleeps under the sink lock
            assert time.monotonic() < deadline, "run 1's commit never reached after_commit"
            time.sleep(0.05)
        row_lock.execute(
            "SELECT 1 FROM sqlsink.runs WHERE sink_id = %s AND run_id = 'run-1' FOR UPDATE",
            (sink,),
        )
        committing.join(20)  # the unlock skips the locked row: it does not wait
        assert not committing.is_alive()
    assert recorded_holders(pg_url, sink) == [("run-1", False, pids[0])]
    monkeypatch.delenv(FAULTS_ENV)
    run2 = Writer(pg_url, keyed, sink, query_id="q", run="run-2")
    written = [run2.write(1, range(5, 10))]  # run 1 fenced; its record of the session stays
    said, failures = recover_while_committing(run2, 1, written, pids)
    assert failures == [], f"run 2's commit failed: {failures!r}; recover said: {said}"
    assert "ended session" not in said
    assert f"its lock is held by pid {pids[0]} 'sqlsink {sink} commit'" in said
    assert ids_of(pg_url, keyed) == list(range(10))
    assert prepared_of(pg_url, sink) == []
    # run 2's unlock cleared every record of the session, run 1's stale one with its own
    assert recorded_holders(pg_url, sink) == [("run-1", True, None), ("run-2", False, None)]


def test_the_record_stays_while_the_session_still_holds_the_lock(
    pg_url: str, keyed: str, sink: str
) -> None:
    """The sink lock stacks (``sqlsink recover`` takes it, then its committer again):
    letting the inner hold go keeps the record, the outer one clears it."""
    Writer(pg_url, keyed, sink, query_id="q", run="run-1").batch(0, range(5))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        backend = PostgresBackend(conn, 5)  # type: ignore[arg-type]
        assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
        with backend.sink_lock(sink):
            backend.register_run(sink, "run-1", 300, holds_lock=True)
        pid = conn.info.backend_pid
        assert recorded_holders(pg_url, sink) == [("run-1", False, pid)]
        locks.unlock_sink(conn, sink)  # type: ignore[arg-type]
        assert recorded_holders(pg_url, sink) == [("run-1", False, None)]


def held_here(conn: psycopg.Connection[tuple[object, ...]], sink: str) -> bool:
    """Whether ``conn``'s session holds the sink lock (pg_locks: once, however stacked)."""
    classid, objid = locks.lock_ids(conn, sink)  # type: ignore[arg-type]
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND objsubid = 1 AND pid = pg_backend_pid() AND classid::bigint = %s "
        "AND objid::bigint = %s",
        (classid, objid),
    ).fetchone()
    return bool(row and row[0])


def test_a_hold_taken_twice_keeps_the_record_until_its_last_unlock(
    pg_url: str, keyed: str, sink: str
) -> None:
    """The unlock and the clearing are one statement: the clearing's check of pg_locks
    sees the lock as the unlock left it. Taken twice (``try_sink_lock`` stacks), the
    first unlock keeps both the hold and the record, the second lets both go."""
    Writer(pg_url, keyed, sink, query_id="q", run="run-1").batch(0, range(5))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        backend = PostgresBackend(conn, 5)  # type: ignore[arg-type]
        assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
        assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
        backend.register_run(sink, "run-1", 300, holds_lock=True)
        pid = conn.info.backend_pid
        assert recorded_holders(pg_url, sink) == [("run-1", False, pid)]
        locks.unlock_sink(conn, sink)  # type: ignore[arg-type]
        assert held_here(conn, sink)
        assert recorded_holders(pg_url, sink) == [("run-1", False, pid)]
        locks.unlock_sink(conn, sink)  # type: ignore[arg-type]
        assert not held_here(conn, sink)
        assert recorded_holders(pg_url, sink) == [("run-1", False, None)]
        with psycopg.connect(pg_url, autocommit=True) as other:  # free for anyone now
            assert locks.try_sink_lock(other, sink)  # type: ignore[arg-type]


def logged_statements(
    conn: psycopg.Connection[tuple[object, ...]],
    log_file: Path,
    pid: int,
    act: Callable[[], object],
) -> tuple[str, list[str]]:
    """What the server logged while ``act`` ran on ``conn`` (session ``pid``), and the
    statements among it (``log_statement = all`` around it, not counted)."""
    conn.execute("SET log_statement = 'all'")
    start = log_file.stat().st_size
    result = act()
    conn.execute("SET log_statement = 'none'")
    assert result is not False, "the action failed"
    with log_file.open("rb") as log:
        log.seek(start)
        logged = log.read().decode(errors="replace")
    statements = [
        line
        for line in logged.splitlines()
        if f"[{pid}]" in line
        and ("statement: " in line or "execute " in line)
        and "log_statement" not in line
    ]
    return logged, statements


def test_the_unlock_is_one_statement(pg_server: PgServer, keyed: str, sink: str) -> None:
    """The driver's commit lets the sink lock go every batch: one statement, one round
    trip, whether or not a record is cleared (the server's log of the session's
    statements, log_statement = all)."""
    if pg_server.embedded is None:
        pytest.skip("reads the server log of a server this run started")
    log_file = pg_server.embedded.log_file
    Writer(pg_server.url, keyed, sink, query_id="q", run="run-1").batch(0, range(5))
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        backend = PostgresBackend(conn, 5)  # type: ignore[arg-type]
        pid = conn.info.backend_pid
        for register in (True, False):  # a record to clear, then none
            assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
            if register:
                backend.register_run(sink, "run-1", 300, holds_lock=True)
                assert recorded_holders(pg_server.url, sink) == [("run-1", False, pid)]
            logged, statements = logged_statements(
                conn,
                log_file,
                pid,
                lambda: locks.unlock_sink(conn, sink),  # type: ignore[arg-type]
            )
            assert len(statements) == 1, "\n".join(statements)
            assert "pg_advisory_unlock" in logged
            assert not held_here(conn, sink)
            assert recorded_holders(pg_server.url, sink) == [("run-1", False, None)]


def test_a_commit_log_without_holder_records_is_unlocked_once(pg_server: PgServer) -> None:
    """A commit log older than version 3 (here: none at all) has no record to clear: the
    statement fails before any of it ran, and the lock goes once, by the plain unlock,
    never twice (a stacked hold stays until its own unlock)."""
    sink = "no-runs-table"
    with pg_server.database("sqlsink_nolog") as url, psycopg.connect(url, autocommit=True) as conn:
        assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
        assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
        locks.unlock_sink(conn, sink)  # type: ignore[arg-type]
        assert held_here(conn, sink)
        locks.unlock_sink(conn, sink)  # type: ignore[arg-type]
        assert not held_here(conn, sink)


def reset_like_pgbouncer(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """What PgBouncer's server_reset_query (DISCARD ALL) does to a session whose client
    died: its advisory locks go, no unlock_sink runs, the session stays."""
    conn.execute("DISCARD ALL")


def test_a_fresh_take_clears_the_record_a_reset_session_left(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Review 2026-11-26 attack1 D3, without PgBouncer: a session lets the lock go without
    the unlock (DISCARD ALL), so run 1's record of it stays. Its next take of the lock,
    free (``try_sink_lock``) or waited for (``acquire_sink_lock``), clears that record in the
    same statement; a stacked take keeps a record of the hold still on."""
    Writer(pg_url, keyed, sink, query_id="q", run="run-1").batch(0, range(5))
    with (
        psycopg.connect(pg_url, autocommit=True) as conn,
        psycopg.connect(pg_url, autocommit=True) as other,
    ):
        backend = PostgresBackend(conn, 5)  # type: ignore[arg-type]
        pid = conn.info.backend_pid
        for wait in (False, True):
            assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
            backend.register_run(sink, "run-1", 300, holds_lock=True)
            reset_like_pgbouncer(conn)
            assert not held_here(conn, sink)
            assert recorded_holders(pg_url, sink) == [("run-1", False, pid)]  # stale
            if wait:  # held by another session: the waiting take
                assert locks.try_sink_lock(other, sink)  # type: ignore[arg-type]
                threading.Timer(0.5, locks.unlock_sink, (other, sink)).start()
                assert not locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
                assert recorded_holders(pg_url, sink) == [("run-1", False, pid)]
                assert locks.acquire_sink_lock(conn, sink, 10).held  # type: ignore[arg-type]
            else:
                assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
            assert held_here(conn, sink)
            assert recorded_holders(pg_url, sink) == [("run-1", False, None)]
            backend.register_run(sink, "run-1", 300, holds_lock=True)
            assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]  # stacked
            assert recorded_holders(pg_url, sink) == [("run-1", False, pid)]
            locks.unlock_sink(conn, sink)  # type: ignore[arg-type]
            locks.unlock_sink(conn, sink)  # type: ignore[arg-type]
            assert not held_here(conn, sink)
            assert recorded_holders(pg_url, sink) == [("run-1", False, None)]


def test_the_take_is_one_statement(pg_server: PgServer, keyed: str, sink: str) -> None:
    """The driver's commit takes the sink lock every batch: one statement, one round
    trip, whether or not a stale record is cleared (log_statement = all)."""
    if pg_server.embedded is None:
        pytest.skip("reads the server log of a server this run started")
    log_file = pg_server.embedded.log_file
    Writer(pg_server.url, keyed, sink, query_id="q", run="run-1").batch(0, range(5))
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        backend = PostgresBackend(conn, 5)  # type: ignore[arg-type]
        pid = conn.info.backend_pid
        for stale in (True, False):  # a record to clear, then none
            if stale:
                assert locks.try_sink_lock(conn, sink)  # type: ignore[arg-type]
                backend.register_run(sink, "run-1", 300, holds_lock=True)
                reset_like_pgbouncer(conn)
            logged, statements = logged_statements(
                conn,
                log_file,
                pid,
                lambda: locks.try_sink_lock(conn, sink),  # type: ignore[arg-type]
            )
            assert len(statements) == 1, "\n".join(statements)
            assert "pg_try_advisory_lock" in logged
            assert held_here(conn, sink)
            assert recorded_holders(pg_server.url, sink) == [("run-1", False, None)]
            locks.unlock_sink(conn, sink)  # type: ignore[arg-type]


def test_a_record_naming_a_cli_session_never_gets_it_ended(
    pg_url: str, keyed: str, sink: str
) -> None:
    """A record the clearing skipped (its row held by a registration at that moment)
    naming a session that ``sqlsink recover`` or ``forget`` now holds the lock on: no
    command of the CLI registers a run, so the record is stale whatever it says, and a
    waiter names that session instead of ending it."""
    Writer(pg_url, keyed, sink, query_id="q", run="run-1").batch(0, range(5))
    with (
        psycopg.connect(pg_url, autocommit=True, application_name=appnames.cli("recover")) as cli,
        psycopg.connect(pg_url, autocommit=True) as waiter,
    ):
        assert locks.try_sink_lock(cli, sink)  # type: ignore[arg-type]
        # the record as a skipped clearing leaves it: run 1's, naming recover's session
        PostgresBackend(cli, 5).register_run(sink, "run-1", 300, holds_lock=True)  # type: ignore[arg-type]
        pid = cli.info.backend_pid
        task = Committer(PostgresBackend(waiter, 1), sink)  # type: ignore[arg-type]
        task.register("run-2", holds_lock=False)  # run 1 superseded
        assert recorded_holders(pg_url, sink) == [("run-1", True, pid), ("run-2", False, None)]
        with pytest.raises(TransientError) as raised:
            task.resolve_leftovers("run-2", 1)
        assert f"held by session pid {pid} 'sqlsink recover (cli)'" in str(raised.value)
        assert cli.execute("SELECT 1").fetchone() == (1,)  # not ended
        locks.unlock_sink(cli, sink)  # type: ignore[arg-type]
    assert prepared_of(pg_url, sink) == []
