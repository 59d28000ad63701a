"""The sink through a real PgBouncer (Debian's, 1.18): session pooling works, transaction
pooling is refused before anything is written (docs/DESIGN.md section 5; issue 12
item 18). The pgbouncer processes are this module's own (``tests.fix_pgbouncer``), in
front of the tests' server; rows, prepared transactions and sessions are looked at on
the server directly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlsink import cli
from sqlsink.cli.recover import Recovery
from sqlsink.core.committer import Committer
from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.errors import ConfigError, TransientError
from sqlsink.postgres import appnames, locks, pooler
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.connection import connect
from sqlsink.postgres.partition import write_partition
from tests.fix_pg import PgServer
from tests.fix_pgbouncer import Bouncer, pgbouncer
from tests.pg.protocol import Writer, ids_of, make_table, new_sink, prepared_of, rows

REFUSAL = "PgBouncer transaction pooling detected"


@dataclass
class SinkWriter(Writer):
    """``Writer`` whose commits, like the Spark adapter's, connect with the sink's ``connect``."""

    @contextmanager
    def committer(self) -> Iterator[Committer]:
        conn = connect(self.url, application_name=appnames.committer(self.sink))
        try:
            yield Committer(PostgresBackend(conn), self.sink)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def session_pool(pg_server: PgServer) -> Iterator[Bouncer]:
    with pgbouncer(pg_server.url, "session") as bouncer:
        yield bouncer


@pytest.fixture(scope="module")
def transaction_pool(pg_server: PgServer) -> Iterator[Bouncer]:
    with pgbouncer(pg_server.url, "transaction") as bouncer:
        yield bouncer


@pytest.fixture(autouse=True)
def _fresh_verdicts() -> Iterator[None]:
    pooler.forget_verdicts()  # every test probes its pooler itself
    yield
    pooler.forget_verdicts()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = cli.main([*args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def wait_no_sessions(pg_url: str, sink: str, timeout_s: float = 10.0) -> None:
    """Until the server shows no session of the sink (a closed client's session ends a
    moment later, directly or through the pooler's reset)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while True:
            names = [
                str(r[0])
                for r in conn.execute("SELECT application_name FROM pg_stat_activity").fetchall()
            ]
            if not any(appnames.of_sink(n, sink) for n in names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"sessions of sink {sink} still connected after {timeout_s} s")
            time.sleep(0.02)


def pool_modes(bouncer: Bouncer) -> set[str]:
    """The pool_mode PgBouncer shows for the pools of this test's database."""
    dbname = psycopg.conninfo.conninfo_to_dict(bouncer.server_url)["dbname"]
    columns_rows = bouncer.admin("SHOW POOLS")
    return {str(r[-1]) for r in columns_rows if r[0] == dbname}


# -- session pooling: the sink works ------------------------------------------------------


def test_session_pooling_is_recognised_and_costs_one_probe_per_process(
    session_pool: Bouncer, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes = []
    real_probe = pooler.probe

    def counted(*args: Any) -> pooler.Verdict:
        verdict = real_probe(*args)
        probes.append(verdict)
        return verdict

    monkeypatch.setattr(pooler, "probe", counted)
    with psycopg.connect(pg_url, autocommit=True) as direct:
        assert pooler.check(direct, pg_url, shown_url="direct").mode == "direct"
    for _ in range(3):
        conn = connect(session_pool.url(), application_name="sqlsink test")
        assert conn.prepare_threshold is None  # no server-side prepared statements
        conn.close()
    assert [v.mode for v in probes] == ["session"]  # then cached
    assert pool_modes(session_pool) == {"session"}


def test_a_batch_through_session_pooling_commits_exactly_its_rows(
    session_pool: Bouncer, pg_url: str, table: str
) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    writer = SinkWriter(session_pool.url(), table, sink, query_id="q")
    writer.batch(0, range(5), range(5, 10))
    assert ids_of(pg_url, table) == list(range(10))
    assert prepared_of(pg_url, sink) == []
    writer.batch(0, range(100, 105), range(105, 110))  # a replay writes nothing
    writer.batch(1, range(10, 15), range(15, 20))
    assert ids_of(pg_url, table) == list(range(20))
    assert prepared_of(pg_url, sink) == []


def test_session_pooling_keeps_the_sink_lock_and_the_sessions(
    session_pool: Bouncer,
    pg_url: str,
    table: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    SinkWriter(session_pool.url(), table, sink, query_id="q").batch(0, range(3))
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "10")  # main() sets it when unset: keep it local
    holder = connect(session_pool.url(), application_name=appnames.committer(sink))
    other = connect(session_pool.url(), application_name="sqlsink test")
    try:
        assert locks.try_sink_lock(holder, sink)
        assert not locks.try_sink_lock(other, sink)  # excluded, whatever the pool does
        code, doc, _ = run_cli(capsys, "status", "--url", session_pool.url(), "--sink-id", sink)
        (status,) = doc["sinks"]
        assert status["live"] is True  # its run, heard from just now (the runs registry)
        # its session is seen through the pooler (shown as evidence)
        assert [s["application_name"] for s in status["sessions"]] == [appnames.committer(sink)]
        locks.unlock_sink(holder, sink)
        assert locks.try_sink_lock(other, sink)
        locks.unlock_sink(other, sink)
    finally:
        holder.close()
        other.close()
    wait_no_sessions(pg_url, sink)
    code, doc, err = run_cli(capsys, "status", "--url", session_pool.url(), "--sink-id", sink)
    assert code == 0, err
    assert doc["sinks"][0]["sessions"] == [] and doc["sinks"][0]["lock_holders"] == []


def test_recover_and_status_through_session_pooling(
    session_pool: Bouncer,
    pg_url: str,
    table: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    writer = SinkWriter(session_pool.url(), table, sink, query_id="q")
    writer.batch(0, range(5), range(5, 10))
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "mid_commit", "batch": 1, "action": "raise"}]))
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    with pytest.raises(RuntimeError, match="injected fault"):  # the driver dies mid-commit
        writer.batch(1, range(10, 15), range(15, 20))
    monkeypatch.delenv(FAULTS_ENV)
    left = prepared_of(pg_url, sink)
    assert len(left) == 1 and len(ids_of(pg_url, table)) == 15
    wait_no_sessions(pg_url, sink)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "10")

    url = session_pool.url()
    code, doc, err = run_cli(capsys, "status", "--url", url, "--sink-id", sink)
    (status,) = doc["sinks"]
    assert [(p["gid"], p["decided"]) for p in status["prepared"]] == [(left[0], True)], err
    # its run was heard from moments ago: live by the registry until its runTimeout
    assert status["incomplete_batches"] == [1] and status["live"] is True

    code, doc, err = run_cli(capsys, "recover", "--url", url, "--sink-id", sink)
    assert code == 0, err
    mine = [(a["gid"], a["result"]) for a in doc["actions"] if a["sink_id"] == sink]
    assert mine == [(left[0], "committed")]
    assert ids_of(pg_url, table) == list(range(20))
    assert prepared_of(pg_url, sink) == []

    code, doc, err = run_cli(capsys, "status", "--url", url, "--sink-id", sink)
    assert code == 0, err
    assert doc["sinks"][0]["incomplete_batches"] == [] and doc["sinks"][0]["prepared"] == []


def server_pid(conn: psycopg.Connection[Any]) -> int:
    """The server session's pid (behind PgBouncer, ``info.backend_pid`` is PgBouncer's)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def session_alive(pg_url: str, pid: int) -> bool:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return (
            conn.execute("SELECT FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            is not None
        )


def test_a_killed_drivers_pooled_session_is_not_ended_as_its_runs_holder_for_recover(
    session_pool: Bouncer,
    pg_url: str,
    table: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 2026-11-26 attack1 D3. Run 1's driver takes the sink lock through PgBouncer
    (session mode) and records its server session S as the holder; the driver dies
    there. PgBouncer's reset (DISCARD ALL) lets the lock go but keeps S in its pool, same
    pid and backend start: the record stays. Run 2 supersedes run 1; the operator's
    ``sqlsink recover`` gets S next (LIFO) and holds the sink lock on it while run 2's
    task waits lockTimeout: the task ended S as run 1's zombie holder, and recover died
    with "lost the connection". Now a fresh take of the lock clears the records of the
    session: the task names the real holder and ends nobody; recover finishes."""
    make_table(pg_url, table)
    sink = new_sink()
    dead = Writer(pg_url, table, sink, query_id="q", run="run-0")
    dead.write(0, range(3))  # a dead run's leftover: something for recover to do
    url = session_pool.url()
    driver = connect(url, application_name=appnames.committer(sink))
    backend = PostgresBackend(driver, 5)
    Committer(backend, sink).register("run-1", holds_lock=False)
    assert locks.try_sink_lock(driver, sink)  # as sink_lock does, for run 1's commit
    Committer(backend, sink).register("run-1", holds_lock=True)
    held_by = server_pid(driver)
    driver.close()  # the driver dies holding the lock; PgBouncer resets and keeps S
    with psycopg.connect(pg_url, autocommit=True) as direct:
        deadline = time.monotonic() + 10
        while locks.sink_lock_holders(direct, sink):  # type: ignore[arg-type]
            assert time.monotonic() < deadline, "PgBouncer's reset never let the lock go"
            time.sleep(0.02)
        assert direct.execute(
            "SELECT lock_pid FROM sqlsink.runs WHERE sink_id = %s AND run_id = 'run-1'", (sink,)
        ).fetchone() == (held_by,)  # the stale record
    task_conn = connect(pg_url, application_name="sqlsink test task")
    task = Committer(PostgresBackend(task_conn, 2), sink)
    task.register("run-2", holds_lock=False)  # run 2 supersedes run 1
    seen: list[tuple[int, BaseException | None]] = []
    take_lock = Recovery._take_lock

    def take_lock_then_wait_beside(self: Recovery, *args: Any) -> bool:
        """recover holds the sink lock (a slow step, a Ctrl-Z) while run 2's task waits."""
        locked = take_lock(self, *args)
        assert locked and not seen
        pid = server_pid(self.conn.conn)  # type: ignore[attr-defined]  # PostgresAdmin's
        try:
            task.resolve_leftovers("run-2", 1)
            seen.append((pid, None))
        except BaseException as exc:
            seen.append((pid, exc))
        return locked

    monkeypatch.setattr(Recovery, "_take_lock", take_lock_then_wait_beside)
    try:
        code, doc, err = run_cli(capsys, "recover", "--url", url, "--sink-id", sink)
    finally:
        task_conn.close()
    assert [pid for pid, _ in seen] == [held_by], "recover did not get run 1's server session"
    error = seen[0][1]
    assert isinstance(error, TransientError), (
        f"run 2's task did not wait: {error!r}; recover said ({code}): {err[-300:]}"
    )
    assert f"held by session pid {held_by} 'sqlsink recover" in str(error)
    assert "ended session" not in err
    assert session_alive(pg_url, held_by)
    assert code == 0, err
    assert [a["result"] for a in doc["actions"] if a["sink_id"] == sink] == ["rolled back"]
    assert prepared_of(pg_url, sink) == []
    assert ids_of(pg_url, table) == []


# -- transaction pooling: refused before anything is written ------------------------------


def test_a_task_through_transaction_pooling_is_refused_before_writing(
    transaction_pool: Bouncer, pg_url: str, table: str
) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    writer = SinkWriter(transaction_pool.url(), table, sink, query_id="q")
    target = SinkWriter(pg_url, table, sink, query_id="q").target()
    with pytest.raises(ConfigError) as refused:
        write_partition(writer.options, target, writer.task(0, 0), rows(range(5)))
    message = str(refused.value)
    assert REFUSAL in message
    assert "session advisory lock" in message and "told by their sessions" in message
    assert "PostgreSQL directly" in message and "pool_mode = session" in message
    assert f"port={transaction_pool.port}" in message  # which url: the one given, shown
    assert ids_of(pg_url, table) == []
    assert prepared_of(pg_url, sink) == []
    assert pool_modes(transaction_pool) == {"transaction"}


def test_a_commit_through_transaction_pooling_is_refused_before_deciding(
    transaction_pool: Bouncer, pg_url: str, table: str
) -> None:
    make_table(pg_url, table)
    sink = new_sink()
    direct = SinkWriter(pg_url, table, sink, query_id="q")
    outcomes = [direct.write(0, range(5), 0), direct.write(0, range(5, 10), 1)]
    gids = sorted(o.gid for o in outcomes if o.gid)
    pooled = SinkWriter(transaction_pool.url(), table, sink, query_id="q", run=direct.run)
    with pytest.raises(ConfigError, match=REFUSAL):
        pooled.commit(0, list(outcomes))
    assert ids_of(pg_url, table) == []  # nothing decided, nothing committed
    assert prepared_of(pg_url, sink) == gids  # the tasks' work is untouched
    direct.commit(0, list(outcomes))  # and commits where the sink may connect
    assert ids_of(pg_url, table) == list(range(10))
    assert prepared_of(pg_url, sink) == []


def test_the_cli_through_transaction_pooling_says_why_and_what_to_do(
    transaction_pool: Bouncer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "10")
    for command in ("status", "recover"):
        code = cli.main([command, "--url", transaction_pool.url(), "--sink-id", new_sink()])
        err = capsys.readouterr().err
        assert code == 2
        assert REFUSAL in err and "pool_mode = session" in err


def test_transaction_pooling_is_found_on_busy_and_round_robin_pools(pg_server: PgServer) -> None:
    """The probe does not rely on a quiet pool or on PgBouncer's LIFO reuse: with FIFO
    reuse and idle server sessions to spare, the notifier gets another session than the
    listener's, and the listener waits in vain; other clients keeping the pool's
    sessions moving do not hide the mode either."""
    with pgbouncer(pg_server.url, "transaction", round_robin=True) as bouncer:
        warm = [psycopg.connect(bouncer.url(), autocommit=True) for _ in range(4)]
        for conn in warm:  # four server sessions, then idle in the pool
            conn.execute("BEGIN")
            conn.execute("SELECT 1")
        for conn in warm:
            conn.execute("COMMIT")
            conn.close()
        with pytest.raises(ConfigError, match=REFUSAL) as refused:
            connect(bouncer.url(), application_name="sqlsink test").close()
        assert "went back to the pool" in refused.value.context["evidence"]

        stop = threading.Event()

        def churn() -> None:
            with psycopg.connect(bouncer.url(), autocommit=True, prepare_threshold=None) as conn:
                while not stop.is_set():
                    with conn.transaction():
                        conn.execute("SELECT pg_sleep(0.002)")
                    conn.execute("SELECT 1")

        threads = [threading.Thread(target=churn) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            for _ in range(6):
                pooler.forget_verdicts()
                with pytest.raises(ConfigError, match=REFUSAL):
                    connect(bouncer.url(), application_name="sqlsink test").close()
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=10)


def test_statement_pooling_is_refused_too(pg_server: PgServer) -> None:
    with pgbouncer(pg_server.url, "statement") as bouncer, pytest.raises(ConfigError) as refused:
        connect(bouncer.url(), application_name="sqlsink test").close()
    assert REFUSAL in str(refused.value)
