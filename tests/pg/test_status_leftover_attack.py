"""``sqlsink status``'s warning for partitions a stopped run left prepared
(``status_state.leftover_notice``), attacked: the query's restart, a new run with its own
batch in flight, must neither be warned about nor hidden behind the old run's end."""

from __future__ import annotations

import uuid

import psycopg

from sqlsink.postgres import run_registry
from tests.fix_pg import PgServer, forget_sink, prepared_in_test_db, rollback_all_prepared
from tests.pg.protocol import Writer, make_table, new_sink
from tests.pg.test_status_attack import status_of


def test_the_restarts_batch_in_flight_is_not_called_a_leftover(
    pg_url: str, pg_server: PgServer, table: str
) -> None:
    """Run 1 stopped mid-batch 1 (a partition prepared, its end recorded). The restart,
    run 2, writes batch 1 again: its first task rolls run 1's partition back (what the
    warning says a restart does), and while run 2's partitions wait for their decision
    status shows run 2 live and warns about nothing left behind."""
    make_table(pg_url, table)
    sink = new_sink()
    query = str(uuid.uuid4())
    first = Writer(pg_url, table, sink, query)
    try:
        first.batch(0, range(3))
        first.write(1, range(3, 6))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            run_registry.record_end(conn, sink, first.run, "stopped", None)
        _, human = status_of(pg_url, sink)
        assert f"run {first.run} of sink {sink} left batch 1" in human, human

        second = Writer(pg_url, table, sink, query)
        second.write(1, range(3, 6), 0)
        second.write(1, range(6, 9), 1)
        mine = {g for g, _ in prepared_in_test_db(pg_server) if sink in g}
        assert mine and all(second.run in g for g in mine), mine  # run 1's rolled back
        _, human = status_of(pg_url, sink)
        assert "prepared and undecided" not in human, human
        assert "stopped at" not in human, human
    finally:
        rollback_all_prepared(pg_server)
        forget_sink(pg_url, sink)
