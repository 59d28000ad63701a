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
from sqlsink.core.committer import Committer
from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.errors import ConfigError
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
