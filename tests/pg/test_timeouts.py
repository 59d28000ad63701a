"""Flink's transaction-timeout scenarios, with an injectable clock (no sleeps)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.committer import Committer
from sqlsink.core.model import NewDecision
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.errors import DataLossError
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import forget_sink
from tests.pg.test_committer import RUN, prepare

POLICY = TimeoutPolicy(timeout_s=100, warning_ratio=0.8)


@pytest.fixture
def setup(
    pg_url: str, table: str
) -> Iterator[tuple[str, str, psycopg.Connection[tuple[object, ...]]]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(sql.Identifier(table))
        )
        sink = f"s-{uuid.uuid4().hex[:8]}"
        yield sink, table, conn
    forget_sink(pg_url, sink)


def server_time(conn: psycopg.Connection[tuple[object, ...]]) -> float:
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(str(row[0]))


def test_timeout_almost_reached_warns_during_commit(
    pg_url: str,
    setup: tuple[str, str, psycopg.Connection[tuple[object, ...]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink, table, conn = setup
    outcome = prepare(pg_url, table, sink, 0, 0, range(3))
    started = 1_000.0
    fresh = Committer(PostgresBackend(conn), sink, timeouts=POLICY, clock=lambda: started + 79)
    old = [outcome.__class__(**{**outcome.__dict__, "started_at": started})]
    with caplog.at_level(logging.WARNING, logger="sqlsink"):
        fresh.commit_batch(0, old, query_id="q1", run_id=RUN)
    assert "over 80% of transactionTimeout" not in caplog.text
    late = prepare(pg_url, table, sink, 1, 0, range(3, 6))
    slow = Committer(PostgresBackend(conn), sink, timeouts=POLICY, clock=lambda: started + 81)
    with caplog.at_level(logging.WARNING, logger="sqlsink"):
        slow.commit_batch(
            1,
            [late.__class__(**{**late.__dict__, "started_at": started})],
            query_id="q1",
            run_id=RUN,
        )
    assert f"transaction {late.gid} was open 81.0 s" in caplog.text
    assert "over 80% of transactionTimeout (100.0 s)" in caplog.text


def test_timeout_almost_reached_warns_during_recovery(
    pg_url: str,
    setup: tuple[str, str, psycopg.Connection[tuple[object, ...]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink, table, conn = setup
    outcome = prepare(pg_url, table, sink, 0, 0, range(3))
    assert outcome.gid is not None
    PostgresBackend(conn).insert_decision(NewDecision(sink, 0, [outcome.gid], 3, "q1", RUN))
    now = server_time(conn)
    committer = Committer(PostgresBackend(conn), sink, timeouts=POLICY, clock=lambda: now + 90)
    with caplog.at_level(logging.WARNING, logger="sqlsink"):
        _, report = committer.recover()
    assert report.committed == [outcome.gid]
    assert f"transaction {outcome.gid} was open" in caplog.text


def test_ignore_commit_failure_after_timeout(
    pg_url: str,
    setup: tuple[str, str, psycopg.Connection[tuple[object, ...]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink, table, conn = setup
    outcome = prepare(pg_url, table, sink, 0, 0, range(3))
    assert outcome.gid is not None
    PostgresBackend(conn).insert_decision(NewDecision(sink, 0, [outcome.gid], 3, "q1", RUN))
    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(outcome.gid)))  # lost
    policy = TimeoutPolicy(timeout_s=100, ignore_commit_failures_after_timeout=True)
    # before the timeout: the restore fails, loudly
    early = Committer(PostgresBackend(conn), sink, timeouts=policy)
    with pytest.raises(DataLossError, match="batch 0 partition 0"):
        early.recover()
    # after it (on the server's clock): logged as probable data loss, counted, and skipped
    age_decision(conn, sink, 0, seconds=150)
    late = Committer(PostgresBackend(conn), sink, timeouts=policy)
    with caplog.at_level(logging.ERROR, logger="sqlsink"):
        _, report = late.recover()
    assert report.lost == [(0, outcome.gid)]
    assert "probable data loss: batch 0" in caplog.text
    _, again = late.recover()  # the batch is settled now: no endless failure
    assert again.lost == []


def test_a_driver_clock_running_ahead_forgives_nothing(
    pg_url: str,
    setup: tuple[str, str, psycopg.Connection[tuple[object, ...]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 12 item 19: the decision's age is measured on the server's clock, which
    stamped it; a driver whose clock runs 150 s ahead does not see a fresh loss as old."""
    sink, table, conn = setup
    outcome = prepare(pg_url, table, sink, 0, 0, range(3))
    assert outcome.gid is not None
    PostgresBackend(conn).insert_decision(NewDecision(sink, 0, [outcome.gid], 3, "q1", RUN))
    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(outcome.gid)))  # lost
    policy = TimeoutPolicy(timeout_s=100, ignore_commit_failures_after_timeout=True)
    ahead = server_time(conn) + 150
    committer = Committer(PostgresBackend(conn), sink, timeouts=policy, clock=lambda: ahead)
    with (
        caplog.at_level(logging.ERROR, logger="sqlsink"),
        pytest.raises(DataLossError, match="batch 0 partition 0"),
    ):
        committer.recover()
    assert "probable data loss" not in caplog.text


def age_decision(
    conn: psycopg.Connection[tuple[object, ...]], sink: str, batch: int, *, seconds: float
) -> None:
    """Move a decision into the past on the server's own clock (no sleeping)."""
    conn.execute(
        "UPDATE sqlsink.decisions SET decided_at = decided_at - make_interval(secs => %s) "
        "WHERE sink_id = %s AND batch_id = %s",
        (seconds, sink, batch),
    )


def test_the_option_is_off_by_default(
    pg_url: str, setup: tuple[str, str, psycopg.Connection[tuple[object, ...]]]
) -> None:
    sink, table, conn = setup
    outcome = prepare(pg_url, table, sink, 0, 0, range(3))
    assert outcome.gid is not None
    PostgresBackend(conn).insert_decision(NewDecision(sink, 0, [outcome.gid], 3, "q1", RUN))
    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(outcome.gid)))
    committer = Committer(
        PostgresBackend(conn), sink, timeouts=TimeoutPolicy(timeout_s=1), clock=lambda: 10**12
    )
    with pytest.raises(DataLossError):
        committer.recover()
