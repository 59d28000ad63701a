"""Retention of the commit log (issue 12 item 21; docs/DESIGN.md 4.2).

The log grew by one decision per batch forever. The committer now keeps the newest
``keepBatches`` decisions (pruning once every hundred batches), every incomplete one,
and the highest (what invariant 9 and a replay need); ``sinks.pruned_through`` says
how far it pruned.
"""

from __future__ import annotations

import psycopg
import pytest

from sqlsink.core.committer import PRUNE_EVERY
from sqlsink.core.model import NewDecision
from sqlsink.errors import CheckpointError, ConfigError
from sqlsink.options import SinkOptions
from sqlsink.postgres import commit_log, retention
from tests.pg.protocol import Writer, ids_of, prepared_of


def decided(url: str, sink: str) -> tuple[list[int], int | None]:
    with psycopg.connect(url, autocommit=True) as conn:
        batches = conn.execute(
            "SELECT batch_id FROM sqlsink.decisions WHERE sink_id = %s ORDER BY batch_id", (sink,)
        ).fetchall()
        row = conn.execute(
            "SELECT pruned_through FROM sqlsink.sinks WHERE sink_id = %s", (sink,)
        ).fetchone()
    assert row is not None
    return [int(str(b[0])) for b in batches], None if row[0] is None else int(str(row[0]))


def test_old_complete_decisions_are_pruned_and_the_newest_kept(
    pg_url: str, keyed: str, sink: str
) -> None:
    stream = Writer(pg_url, keyed, sink, query_id="q1", extra={"keepBatches": "3"})
    for batch in range(5):
        stream.batch(batch, range(batch * 10, batch * 10 + 5))
    assert decided(pg_url, sink) == ([0, 1, 2, 3, 4], None)  # not a pruning batch yet
    stream.batch(PRUNE_EVERY, range(1000, 1005))  # prunes through PRUNE_EVERY - 3
    assert decided(pg_url, sink) == ([PRUNE_EVERY], 4)
    # what the protocol needs still holds: a replay of the highest batch writes nothing
    replay = Writer(pg_url, keyed, sink, query_id="q1")
    outcome = replay.write(PRUNE_EVERY, range(2000, 2005))
    assert outcome.skipped
    replay.commit(PRUNE_EVERY, [outcome])
    # and a pruned batch asked again is refused, not skipped as decided
    with pytest.raises(CheckpointError, match=f"batch 3 .*{PRUNE_EVERY}"):
        replay.write(3, range(3000, 3005))
    expected = [i for b in range(5) for i in range(b * 10, b * 10 + 5)] + list(range(1000, 1005))
    assert ids_of(pg_url, keyed) == expected
    assert prepared_of(pg_url, sink) == []


def test_an_incomplete_decision_is_never_pruned(pg_url: str, keyed: str, sink: str) -> None:
    stream = Writer(pg_url, keyed, sink, query_id="q1")
    stream.batch(0, range(5))
    outcome = stream.write(1, range(5, 10))  # prepared, decided, not committed
    assert outcome.gid is not None
    with psycopg.connect(pg_url, autocommit=True) as conn:
        commit_log.insert_decision(conn, NewDecision(sink, 1, [outcome.gid], 5, "q1", stream.run))  # type: ignore[arg-type]
        assert retention.prune_decisions(conn, sink, 1) == 1  # type: ignore[arg-type]
    assert decided(pg_url, sink) == ([1], 0)
    stream.commit(1, [outcome])  # the incomplete decision still commits its batch
    assert ids_of(pg_url, keyed) == list(range(10))
    assert prepared_of(pg_url, sink) == []


@pytest.mark.parametrize("text", ["0", "-1", "many", "1.5"])
def test_keep_batches_must_be_a_whole_number_of_at_least_one(text: str) -> None:
    with pytest.raises(ConfigError, match=f"option keepBatches: {text!r}"):
        SinkOptions.parse({"url": "postgresql://x/y", "table": "t", "keepBatches": text})
