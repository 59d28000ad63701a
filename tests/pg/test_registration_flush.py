"""A run's registration is committed without waiting for its WAL flush (issue 16, the
per-batch cost; docs/DESIGN.md 4.3): the flush of the next durable step (a PREPARE,
a decision, a COMMIT or ROLLBACK PREPARED) carries it. Shown here: a registration
leaves the flush behind it, a decision after it is never durable without it, and a
crash that loses a registration is harmless: the run registers again, the batch is
written exactly once, nothing stays prepared."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from sqlsink.core.committer import Committer
from sqlsink.core.model import Binding, PartitionOutcome
from sqlsink.errors import FencedError
from sqlsink.postgres.backend import PostgresBackend
from tests.fix_pg import PgServer, forget_sink
from tests.pg.protocol import Writer, ids_of, make_table, new_sink, prepared_of


def _runs(url: str, sink: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT run_id FROM sqlsink.runs WHERE sink_id = %s ORDER BY first_seen", (sink,)
        )
        return [str(r[0]) for r in found]


@contextmanager
def _two_runs(server: PgServer) -> Iterator[tuple[Writer, Writer]]:
    """On a server this run may crash: a table, run-old having written batch 0, and
    run-new of the same query (its writer); the sink's log is forgotten afterwards."""
    url, sink, table = server.url, new_sink(), f"t_{new_sink().replace('-', '_')}"
    make_table(url, table)
    try:
        old = Writer(url, table, sink, query_id="q", run="run-old")
        old.batch(0, range(5))
        yield old, Writer(url, table, sink, query_id="q", run="run-new")
    finally:
        forget_sink(url, sink)


def _fenced_and_exactly(old: Writer, rows: int) -> None:
    """The old run may not write any more, the table holds ids 0 .. rows - 1 once each,
    and nothing of the sink is left prepared."""
    with pytest.raises(FencedError, match="superseded by run run-new"):
        old.write(2, range(rows, rows + 3))
    assert ids_of(old.url, old.table) == list(range(rows))
    assert prepared_of(old.url, old.sink) == []


def test_a_registration_does_not_wait_for_the_wal_flush(pg_url: str, keyed: str, sink: str) -> None:
    """Before: every registration flushed (the flush LSN passed its commit at once).
    The WAL writer flushes in the background every 200 ms, so one of ten back-to-back
    registrations may find its commit flushed by it; not all of them. Through the
    committer's own call, as a commit and a task register (the binding admitted)."""
    Writer(pg_url, keyed, sink, query_id="q", run="run-a").batch(0, range(3))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        committer = Committer(PostgresBackend(conn, 5.0), sink)  # type: ignore[arg-type]
        behind = 0
        for number in range(10):
            for holds_lock in (False, True):
                committer.register(f"run-{number}", holds_lock=holds_lock, writer=Binding.of("q"))
                row = conn.execute(
                    "SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()"
                ).fetchone()
                behind += bool(row and row[0])
    assert behind >= 10, f"only {behind} of 20 registrations left the WAL flush behind"
    assert _runs(pg_url, sink)[-1] == "run-9"


def test_a_decision_is_never_durable_without_the_registration_before_it(
    own_server: PgServer,
) -> None:
    with _two_runs(own_server) as (old, new):
        new.batch(1, range(5, 10))  # registers (no flush of its own), then decides (flushed)
        own_server.crash_and_restart()
        assert _runs(new.url, new.sink) == ["run-old", "run-new"]
        _fenced_and_exactly(old, 10)


def test_a_registration_a_crash_lost_is_made_again_and_the_batch_lands_once(
    own_server: PgServer,
) -> None:
    """The new run registers, the server crashes before anything flushes it: the
    registration is lost (or, when the WAL writer got to it first, kept). Either way the
    run's next step registers it again, the old run is fenced from then on, and the batch
    is written exactly once."""
    with _two_runs(own_server) as (old, new):
        url, sink = new.url, new.sink
        with psycopg.connect(url, autocommit=True) as conn:
            committer = Committer(PostgresBackend(conn, 5.0), sink)  # type: ignore[arg-type]
            committer.register(new.run, holds_lock=False, writer=Binding.of("q"))
        own_server.crash_and_restart()
        assert _runs(url, sink) in (["run-old"], ["run-old", "run-new"])
        outcomes: list[PartitionOutcome | None] = [
            new.write(1, range(5, 10), 0),
            new.write(1, range(10, 12), 1),
        ]
        new.commit(1, outcomes)
        assert _runs(url, sink) == ["run-old", "run-new"]
        _fenced_and_exactly(old, 12)
