"""``sqlsink forget`` where the log knows a sink only partly: prepared transactions with no
registration, a live run with no decision yet (from a review's attacks: both refuse)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from sqlsink.core.gid import Gid
from tests.pg.protocol import Writer, make_table, prepare_by_hand, prepared_of
from tests.pg.test_cli import sqlsink


def test_forget_of_a_sink_with_prepared_transactions_but_no_registration_refuses(
    pg_url: str, keyed: str, sink: str
) -> None:
    gid = Gid(sink, 3, 0, "r-hand", 0)
    prepare_by_hand(pg_url, keyed, gid, range(3))
    try:
        result = sqlsink("forget", "--url", pg_url, "--sink-id", sink)
        assert result.code == 1, result.out + result.err
        assert prepared_of(pg_url, sink) == [str(gid)]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(str(gid))))


def test_forget_of_a_live_run_without_a_decision_refuses(
    pg_url: str, keyed: str, sink: str
) -> None:
    writer = Writer(pg_url, keyed, sink, query_id="q-live")
    outcome = writer.write(0, range(3))  # registered, prepared, no decision
    result = sqlsink("forget", "--url", pg_url, "--sink-id", sink)
    print(result.code, result.out)
    assert result.code == 1 and prepared_of(pg_url, sink) == [outcome.gid]
    writer.abort(0, [outcome])
    # after the abort the run no longer counts as live: forget removes the registration
    # (it did at 436233f too, then saying "nothing to forget"); the query's next batch
    # registers again
    result = sqlsink("forget", "--url", pg_url, "--sink-id", sink)
    assert result.code == 0, result.out
    _ = make_table
