"""Who may write a sink, and in which order (docs/DESIGN.md invariants 8 and 9).

Issue 12, items 1-3: each interleaving that lost rows silently, really executed.
"""

from __future__ import annotations

import psycopg
import pytest

from sqlsink.core.model import NewDecision
from sqlsink.errors import CheckpointError, SinkBindingError
from tests.pg.protocol import Writer, ids_of, prepared_of


def test_a_stream_reusing_a_backfills_sink_id_is_refused_before_writing(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 2: the stream skipped its batch 0 as "already decided"; its rows were lost."""
    Writer(pg_url, keyed, sink, query_id=None).batch(0, range(5))
    stream = Writer(pg_url, keyed, sink, query_id="q-stream")
    with pytest.raises(SinkBindingError) as refused:
        stream.write(0, range(100, 105))
    assert "a named batch load" in str(refused.value)
    assert "streaming query q-stream" in str(refused.value)
    with pytest.raises(SinkBindingError):  # and in the commit, under the lock
        stream.commit(0, [])
    assert ids_of(pg_url, keyed) == list(range(5))
    assert prepared_of(pg_url, sink) == []


def test_a_backfill_reusing_a_streams_sink_id_is_refused_before_writing(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 2, the other order: the load found batch 0 decided and wrote nothing."""
    stream = Writer(pg_url, keyed, sink, query_id="q-stream")
    stream.batch(0, range(5))
    stream.batch(1, range(5, 10))
    load = Writer(pg_url, keyed, sink, query_id=None)
    with pytest.raises(SinkBindingError, match="bound to streaming query q-stream"):
        load.write(0, range(100, 105))
    with pytest.raises(SinkBindingError):
        load.commit(0, [])
    assert ids_of(pg_url, keyed) == list(range(10))
    assert prepared_of(pg_url, sink) == []


def test_a_named_load_run_again_writes_nothing_twice(pg_url: str, keyed: str, sink: str) -> None:
    Writer(pg_url, keyed, sink, query_id=None).batch(0, range(5))
    again = Writer(pg_url, keyed, sink, query_id=None)
    outcome = again.write(0, range(5))
    assert outcome.skipped
    again.commit(0, [outcome])
    assert ids_of(pg_url, keyed) == list(range(5))


def test_a_checkpoint_gone_back_in_time_is_refused_in_tasks_and_commit(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 3: batches 2 and 3 re-planned with other rows were skipped as replays."""
    first = Writer(pg_url, keyed, sink, query_id="q1")
    for batch in range(4):
        first.batch(batch, range(batch * 10, batch * 10 + 10))
    restored = Writer(pg_url, keyed, sink, query_id="q1")  # a new run, same checkpoint
    with pytest.raises(CheckpointError) as refused:
        restored.write(2, range(20, 60))
    message = str(refused.value)
    assert "batch 2" in message and "batch 3" in message
    assert "checkpoint" in message and "sqlsink forget" in message
    with pytest.raises(CheckpointError, match="batch 2"):
        restored.commit(2, [])
    # the last batch is a replay (Spark re-runs it after a crash): skipped, not refused
    assert restored.write(3, range(30, 40)).skipped
    assert ids_of(pg_url, keyed) == list(range(40))
    assert prepared_of(pg_url, sink) == []


def test_the_binding_errors_advice_cannot_erase_an_incomplete_decision(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 1: the advised DELETE cascaded to the incomplete decision; the new query then
    rolled back the rest of the batch as undecided: half a batch, no error."""
    old = Writer(pg_url, keyed, sink, query_id="q-old")
    outcomes = [old.write(1, range(0, 5), 0), old.write(1, range(5, 10), 1)]
    with old.committer() as committer:  # decided, first gid committed, then the driver dies
        committer.backend.insert_decision(
            NewDecision(sink, 1, [o.gid for o in outcomes if o.gid], 10, "q-old", old.run)
        )
        assert outcomes[0].gid is not None
        committer.backend.commit_prepared(outcomes[0].gid)
    new = Writer(pg_url, keyed, sink, query_id="q-new")
    with pytest.raises(SinkBindingError) as refused:
        new.write(0, range(100, 105))
    advice = str(refused.value)
    assert "DELETE" not in advice and "sqlsink forget" in advice
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in (
            "DELETE FROM sqlsink.sinks WHERE sink_id = %s",
            "DELETE FROM sqlsink.decisions WHERE sink_id = %s",
        ):
            with pytest.raises(psycopg.errors.DatabaseError, match="sqlsink forget"):
                conn.execute(statement, (sink,))
        with pytest.raises(psycopg.errors.DatabaseError, match="incomplete"):
            conn.execute("TRUNCATE sqlsink.decisions CASCADE")
        left = conn.execute(
            "SELECT completed_at IS NULL FROM sqlsink.decisions WHERE sink_id = %s", (sink,)
        ).fetchall()
    assert left == [(True,)]  # the decision survived every plain statement
    assert ids_of(pg_url, keyed) == list(range(5))
    with old.committer() as committer:  # recovery still finishes the batch
        report = committer.recover()
    assert report[1].committed == [outcomes[1].gid]
    assert ids_of(pg_url, keyed) == list(range(10))


def test_a_foreign_look_alike_gid_with_a_huge_number_is_left_alone(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 14: 'bigint out of range' in every task, commit and recover of the sink."""
    look_alike = f"sqlsink_{sink}_9999999999999999999_0_run_1"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute(f"PREPARE TRANSACTION '{look_alike}'")
    try:
        stream = Writer(pg_url, keyed, sink, query_id="q1")
        stream.batch(0, range(5), range(5, 10))
        with stream.committer() as committer:
            _, report = committer.recover()
        assert report.left == [look_alike]
        assert ids_of(pg_url, keyed) == list(range(10))
        assert prepared_of(pg_url, sink) == [look_alike]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"ROLLBACK PREPARED '{look_alike}'")
