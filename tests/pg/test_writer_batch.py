"""The foreachBatch writer's batch rules (sqlsink/core/writer_batch.py) on a real commit log,
without Spark: partition tasks are ``write_partition`` and the commits the committer's,
as the writer's Batch makes them (tests/pg/protocol.py).

F1: a second write of a batch by the run that decided it, or a replay naming a table
the decision lacks, is refused before any task runs; a new run's replay of a decided
table is a skip. C2: batches a run never handed to the writer are decided empty before
the next one, so the checkpoint check finds every batch Spark committed decided.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sqlsink.checkpoint.parse import checkpoint_policy
from sqlsink.core.checkpoint_check import CheckpointCheck, CheckpointMode, CheckpointPolicy
from sqlsink.core.committer import Committer
from sqlsink.core.model import NewDecision, PartitionOutcome
from sqlsink.core.writer_batch import (
    HandedBatches,
    PartStart,
    check_part,
    decide_empty,
    fill_gap,
    read_decision,
)
from sqlsink.errors import ConfigError, DataLossError
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.schema import migrations
from sqlsink.spark.identity import PROCESS_RUNS
from tests.fix_pg import PgServer
from tests.pg.protocol import Writer, ids_of, make_table, prepared_of
from tests.sim.test_backend_contract import Harness, harness, sinks

__all__ = ["harness", "sinks"]  # the contract's fixtures: memory and PostgreSQL


@pytest.fixture
def backend(pg_url: str) -> Iterator[PostgresBackend]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield PostgresBackend(conn)  # type: ignore[arg-type]


def commit(
    writer: Writer,
    batch: int,
    outcomes: list[PartitionOutcome | None],
    tables: list[str],
    policy: CheckpointPolicy | None = None,
) -> None:
    """The Batch's commit: one decision naming the batch's tables (and the checkpoint
    check, when the checkpoint is known)."""
    with writer.committer() as committer:
        committer.tables = tuple(tables)
        if policy is not None:
            committer.checkpoint_check = CheckpointCheck(committer.backend, policy)
        committer.commit_batch(batch, outcomes, query_id=writer.query_id, run_id=writer.run)


def decision_rows(url: str, sink: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT batch_id, run_id, rows, cardinality(gids), completed_at IS NOT NULL, tables "
            "FROM sqlsink.decisions WHERE sink_id = %s ORDER BY batch_id",
            (sink,),
        ).fetchall()


def test_a_second_write_by_the_same_run_is_refused_before_its_tasks_run(
    pg_url: str, sink: str, backend: PostgresBackend
) -> None:
    """r3 of the review: orders decided and committed by run R; the same run's write of
    order_lines for the same batch is refused, where its tasks used to find the batch
    decided and skip, and the commit only resolved (order_lines never got a row)."""
    orders, lines = f"o_{sink[2:]}", f"l_{sink[2:]}"
    make_table(pg_url, orders)
    make_table(pg_url, lines)
    shop = Writer(pg_url, orders, sink, query_id="q-shop")
    commit(shop, 0, [shop.write(0, range(0, 5))], [f"public.{orders}"])
    with pytest.raises(ConfigError) as refused:
        check_part(backend, sink, 0, shop.run, f"public.{lines}")
    assert str(refused.value).startswith(
        f"sink {sink!r}: batch 0 was already decided by this very run (its decision holds "
        f"'public.{orders}'): a second write of one batch id in one run"
    )
    # the same table again, same run: refused too (a retry of a committed write)
    with pytest.raises(ConfigError, match="already decided by this very run"):
        check_part(backend, sink, 0, shop.run, f"public.{orders}")
    # a restart (a new run) replays the batch: the decided table is skipped, the other
    # refused (its rows were never written for batch 0)
    assert check_part(backend, sink, 0, uuid.uuid4().hex, f"public.{orders}") is PartStart.REPLAY
    with pytest.raises(ConfigError, match=f"without 'public.{lines}': this replay would skip"):
        check_part(backend, sink, 0, uuid.uuid4().hex, f"public.{lines}")
    assert ids_of(pg_url, orders) == [0, 1, 2, 3, 4]
    assert ids_of(pg_url, lines) == []
    assert prepared_of(pg_url, sink) == []
    assert decision_rows(pg_url, sink) == [(0, shop.run, 5, 1, True, [f"public.{orders}"])]


def test_decisions_carry_their_tables_in_memory_and_in_postgres(
    harness: Harness, sinks: list[str]
) -> None:
    """What the rule reads, the same on the in-memory backend the simulation drives."""
    sink = sinks[0]
    b = harness.session()
    assert b.insert_decision(
        NewDecision(sink, 0, [], 0, "q1", "r1", tables=["public.a", "public.b"])
    )
    assert b.insert_decision(NewDecision(sink, 1, [], 0, "q1", "r1"))  # an empty batch: no table
    assert read_decision(b, sink, 0).tables == ("public.a", "public.b")
    assert read_decision(b, sink, 1).tables is None
    assert read_decision(b, sink, 2) is None
    assert check_part(b, sink, 2, "r1", "public.a") is PartStart.WRITE
    assert check_part(b, sink, 0, "r2", "public.b") is PartStart.REPLAY
    assert check_part(b, sink, 1, "r2", None) is PartStart.REPLAY  # empty again: a replay
    with pytest.raises(ConfigError, match="decided by an earlier run with no table"):
        check_part(b, sink, 1, "r2", "public.c")  # no transaction: it wrote no table
    for batch, table in ((0, "public.a"), (1, None), (0, "public.c")):
        with pytest.raises(ConfigError, match="already decided by this very run"):
            check_part(b, sink, batch, "r1", table)
    with pytest.raises(ConfigError, match="decided by an earlier run"):
        check_part(b, sink, 0, "r2", "public.c")


def test_a_log_before_version_8_reads_tables_as_unknown(pg_server: PgServer) -> None:
    """The upgrade that adds decisions.tables can be deferred: the rule still reads the
    log, and an old decision's tables are unknown (a new run's replay; the same run's
    second write refused)."""
    with pg_server.database("v7") as url, psycopg.connect(url, autocommit=True) as conn:
        for version, path in migrations():
            if version <= 7:
                conn.execute(path.read_text(encoding="utf-8").encode())
        conn.execute(
            "INSERT INTO sqlsink.sinks (sink_id, writer, query_id) VALUES ('old', 'stream', 'q')"
        )
        conn.execute(
            "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, query_id, run_id, "
            "completed_at) VALUES ('old', 4, '{sqlsink_old_4_0_run-old_1}', 5, 'q', "
            "'run-old', now())"
        )
        backend = PostgresBackend(conn)  # type: ignore[arg-type]
        decision = read_decision(backend, "old", 4)
        assert decision is not None and decision.tables is None
        assert check_part(backend, "old", 4, "run-new", "public.t") is PartStart.REPLAY
        with pytest.raises(ConfigError, match="already decided by this very run"):
            check_part(backend, "old", 4, "run-old", "public.t")
        # an old empty decision (no transaction) wrote no table: a write of one is refused
        conn.execute(
            "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, query_id, run_id, "
            "completed_at) VALUES ('old', 5, '{}', 0, 'q', 'run-old', now())"
        )
        assert check_part(backend, "old", 5, "run-new", None) is PartStart.REPLAY
        with pytest.raises(ConfigError, match="decided by an earlier run with no table"):
            check_part(backend, "old", 5, "run-new", "public.t")


def checkpoint(tmp_path: Path, query_id: str) -> Path:
    chk = tmp_path / "chk"
    (chk / "commits").mkdir(parents=True)
    (chk / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return chk


def spark_commits(chk: Path, *batches: int) -> None:
    """Spark writes commits/N when foreachBatch returned, whatever the function did."""
    for n in batches:
        (chk / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_batches_a_run_never_handed_over_are_decided_empty_before_the_next(
    pg_url: str, sink: str, keyed: str, tmp_path: Path
) -> None:
    """r4 of the review: batch 1 never reached the writer (the function returned early),
    Spark committed it; at batch 2 the checkpoint check stopped the query with a false
    data-loss error, and again at every restart. Now batch 2's hand-over finds the gap
    and decides batch 1 empty first; the restart's check finds every batch decided."""
    query = str(uuid.uuid4())
    chk = checkpoint(tmp_path, query)
    policy = checkpoint_policy(str(chk), CheckpointMode.WARN)
    run = Writer(pg_url, keyed, sink, query_id=query)
    handed = HandedBatches()
    assert handed.hand(sink, run.run, 0) == range(0)
    commit(run, 0, [run.write(0, range(0, 3))], [f"public.{keyed}"], policy)
    spark_commits(chk, 0, 1)  # batch 1: the function returned early
    gap = handed.hand(sink, run.run, 2)
    assert gap == range(1, 2)
    with run.committer() as committer:
        committer.checkpoint_check = CheckpointCheck(committer.backend, policy)
        assert fill_gap(committer, gap, query_id=query, run_id=run.run) == range(1, 2)
    commit(run, 2, [run.write(2, range(3, 6))], [f"public.{keyed}"], policy)
    spark_commits(chk, 2)
    restart = Writer(pg_url, keyed, sink, query_id=query)  # a new run: its first commit checks
    commit(restart, 3, [restart.write(3, range(6, 9))], [f"public.{keyed}"], policy)
    assert ids_of(pg_url, keyed) == list(range(9))
    assert prepared_of(pg_url, sink) == []
    table = [f"public.{keyed}"]
    assert decision_rows(pg_url, sink) == [
        (0, run.run, 3, 1, True, table),
        (1, run.run, 0, 0, True, None),
        (2, run.run, 3, 1, True, table),
        (3, restart.run, 3, 1, True, table),
    ]


def test_a_last_batch_never_handed_over_stops_the_restart_until_it_is_skipped(
    pg_url: str, sink: str, keyed: str, tmp_path: Path
) -> None:
    """What the writer cannot see (the run's last batch not handed over, then a stop):
    the restart's check reports it; ``decide_empty`` of that batch (writer.skip from a
    writer that knows the checkpoint) decides it, though commits/ already holds it."""
    query = str(uuid.uuid4())
    chk = checkpoint(tmp_path, query)
    policy = checkpoint_policy(str(chk), CheckpointMode.WARN)
    first = Writer(pg_url, keyed, sink, query_id=query)
    commit(first, 0, [first.write(0, range(0, 3))], [f"public.{keyed}"], policy)
    spark_commits(chk, 0, 1)
    restart = Writer(pg_url, keyed, sink, query_id=query)
    outcomes: list[PartitionOutcome | None] = [restart.write(2, range(3, 6))]
    with pytest.raises(DataLossError, match="checkpoint records batch 1 as committed"):
        commit(restart, 2, outcomes, [f"public.{keyed}"], policy)
    restart.abort(2, outcomes)
    operator = Writer(pg_url, keyed, sink, query_id=query)
    with operator.committer() as committer:
        committer.checkpoint_check = CheckpointCheck(committer.backend, policy)
        assert decide_empty(committer, 1, query_id=query, run_id=operator.run) is not None
        with pytest.raises(ConfigError, match="batch 1 was already decided by this very run"):
            decide_empty(committer, 1, query_id=query, run_id=operator.run)
        # a new run's empty hand-over of a decided batch decides nothing
        assert decide_empty(committer, 1, query_id=query, run_id="another") is None
    again = Writer(pg_url, keyed, sink, query_id=query)
    commit(again, 2, [again.write(2, range(3, 6))], [f"public.{keyed}"], policy)
    assert ids_of(pg_url, keyed) == list(range(6))
    assert prepared_of(pg_url, sink) == []
    assert [row[:5] for row in decision_rows(pg_url, sink)] == [
        (0, first.run, 3, 1, True),
        (1, operator.run, 0, 0, True),
        (2, again.run, 3, 1, True),
    ]


def test_a_gap_below_the_highest_decided_is_not_decided_late(
    pg_url: str, sink: str, keyed: str
) -> None:
    run = Writer(pg_url, keyed, sink, query_id="q-gap")
    commit(run, 3, [run.write(3, range(0, 3))], [f"public.{keyed}"])
    with run.committer() as committer:
        assert isinstance(committer, Committer)
        assert fill_gap(committer, range(1, 5), query_id="q-gap", run_id=run.run) == range(4, 5)
    assert [row[0] for row in decision_rows(pg_url, sink)] == [3, 4]


def test_a_skip_outside_the_stream_decides_only_a_batch_spark_committed_with_nothing_prepared(
    pg_url: str, sink: str, keyed: str, tmp_path: Path
) -> None:
    """An operator's ``writer.skip(N)`` in a plain Python process (no stream): found by
    the review of this change. Batch 1 was the batch the query was in when it stopped
    (offsets/1, no commits/1); skip(1) decided it empty, and the restart's replay of
    batch 1 found it decided and skipped its rows: silent loss. Now refused unless the
    checkpoint records batch 1 as committed and nothing of it is prepared."""
    from sqlsink import ForeachBatchWriter

    query = str(uuid.uuid4())
    chk = checkpoint(tmp_path, query)
    policy = checkpoint_policy(str(chk), CheckpointMode.WARN)
    first = Writer(pg_url, keyed, sink, query_id=query)
    commit(first, 0, [first.write(0, range(0, 3))], [f"public.{keyed}"], policy)
    spark_commits(chk, 0)  # batch 1 planned and running when the query stopped
    where = f"sink {sink!r}: writer.skip(1) outside the stream"

    no_checkpoint = ForeachBatchWriter(url=pg_url, sink_id=sink, query_id=query)
    with pytest.raises(ConfigError) as refused:
        no_checkpoint.skip(1)
    assert str(refused.value).startswith(
        f"{where}: no checkpoint_location was given, so nothing shows that Spark committed batch 1"
    )
    operator = ForeachBatchWriter(url=pg_url, sink_id=sink, checkpoint_location=str(chk))
    with pytest.raises(ConfigError) as refused:
        operator.skip(1)
    assert str(refused.value).startswith(
        f"{where}: Spark's checkpoint {chk} does not record batch 1 as committed "
        "(no commits/1): Spark runs it (again) with its rows"
    )
    assert [row[0] for row in decision_rows(pg_url, sink)] == [0]  # nothing decided

    # batch 1's rows prepared and Spark committed it: a lost decision, not a skip
    lost = Writer(pg_url, keyed, sink, query_id=query)
    lost_outcome = lost.write(1, range(10, 13))
    spark_commits(chk, 1)
    with pytest.raises(ConfigError) as refused:
        operator.skip(1)
    assert f"batch 1 has prepared transactions ({lost_outcome.gid})" in str(refused.value)
    assert "--commit-lost 1 --checkpoint DIR" in str(refused.value)
    assert prepared_of(pg_url, sink) == [lost_outcome.gid]
    assert [row[0] for row in decision_rows(pg_url, sink)] == [0]

    # the restart replays batch 1 with its rows: written, not skipped
    (chk / "commits" / "1").unlink()
    restart = Writer(pg_url, keyed, sink, query_id=query)
    commit(restart, 1, [restart.write(1, range(10, 13))], [f"public.{keyed}"], policy)
    assert ids_of(pg_url, keyed) == [0, 1, 2, 10, 11, 12]
    assert prepared_of(pg_url, sink) == []

    # a batch Spark committed with nothing prepared (the last batch, not handed over)
    spark_commits(chk, 1, 2)
    operator.skip(2)
    assert [row[:3] for row in decision_rows(pg_url, sink)][-1][0] == 2
    assert ids_of(pg_url, keyed) == [0, 1, 2, 10, 11, 12]


def test_two_writer_objects_of_one_sink_in_one_process_are_one_run(
    pg_url: str, sink: str, keyed: str, tmp_path: Path
) -> None:
    """The run id a process makes (Spark Connect, outside the stream) is one per (process,
    sink, query): a second writer object's hand-over of a batch the first one decided is
    the same run's second hand-over, refused, where it used to be a new run's replay
    (skipped silently)."""
    from sqlsink import ForeachBatchWriter

    query = str(uuid.uuid4())
    chk = checkpoint(tmp_path, query)
    policy = checkpoint_policy(str(chk), CheckpointMode.WARN)
    first = Writer(pg_url, keyed, sink, query_id=query)
    commit(first, 0, [first.write(0, range(0, 3))], [f"public.{keyed}"], policy)
    spark_commits(chk, 0, 1)
    one = ForeachBatchWriter(url=pg_url, sink_id=sink, checkpoint_location=str(chk))
    two = ForeachBatchWriter(url=pg_url, sink_id=sink, checkpoint_location=str(chk))
    one.skip(1)
    with pytest.raises(ConfigError) as refused:
        two.skip(1)
    assert str(refused.value).startswith(
        f"sink {sink!r}: batch 1 was already decided by this very run (its decision holds "
        "no table (an empty batch)): a second write of one batch id in one run"
    )
    runs = {row[0]: row[1] for row in decision_rows(pg_url, sink)}
    assert runs == {0: first.run, 1: one.process_run_id(query)}
    assert one.process_run_id(query) == two.process_run_id(query)
    assert prepared_of(pg_url, sink) == []


def test_several_skipped_last_batches_are_skipped_in_order_outside_the_stream(
    pg_url: str, sink: str, keyed: str, tmp_path: Path
) -> None:
    """A run handed batch 0, returned early for batches 1 and 2 and stopped. The
    documented advice, writer.skip(N) for each in order, used to fail at skip(1): its
    checkpoint check counted batch 2 as lost. A skip outside the stream does not count
    later batches Spark committed with nothing prepared; the next real commit still
    reports one left undecided."""
    from sqlsink import ForeachBatchWriter

    query = str(uuid.uuid4())
    chk = checkpoint(tmp_path, query)
    policy = checkpoint_policy(str(chk), CheckpointMode.WARN)
    first = Writer(pg_url, keyed, sink, query_id=query)
    commit(first, 0, [first.write(0, range(0, 3))], [f"public.{keyed}"], policy)
    spark_commits(chk, 0, 1, 2, 3)  # 1, 2 and 3: the function returned early
    operator = ForeachBatchWriter(url=pg_url, sink_id=sink, checkpoint_location=str(chk))
    operator.skip(1)
    operator.skip(2)
    assert [row[:4] for row in decision_rows(pg_url, sink)][1:] == [
        (1, operator.process_run_id(query), 0, 0),
        (2, operator.process_run_id(query), 0, 0),
    ]
    # batch 3 not skipped: the restart's first commit still reports it
    restart = Writer(pg_url, keyed, sink, query_id=query)
    outcomes: list[PartitionOutcome | None] = [restart.write(4, range(3, 6))]
    with pytest.raises(DataLossError) as lost:
        commit(restart, 4, outcomes, [f"public.{keyed}"], policy)
    assert "Spark's checkpoint records batch 3 as committed" in str(lost.value)
    assert list(lost.value.context["lost"]) == [3]
    restart.abort(4, outcomes)
    PROCESS_RUNS.clear()  # the operator's new script: a new process, a new run
    operator.skip(3)
    again = Writer(pg_url, keyed, sink, query_id=query)
    commit(again, 4, [again.write(4, range(3, 6))], [f"public.{keyed}"], policy)
    assert ids_of(pg_url, keyed) == list(range(6))
    assert [row[0] for row in decision_rows(pg_url, sink)] == [0, 1, 2, 3, 4]
    assert ids_of(pg_url, keyed) == list(range(6))
    assert prepared_of(pg_url, sink) == []


def test_a_skip_outside_the_stream_still_refuses_a_later_batch_with_prepared_rows(
    pg_url: str, sink: str, keyed: str, tmp_path: Path
) -> None:
    """Batch 2's decision was lost with its rows prepared: skip(1) outside the stream
    does not pass over it (a lost decision, not a skipped batch)."""
    from sqlsink import ForeachBatchWriter

    query = str(uuid.uuid4())
    chk = checkpoint(tmp_path, query)
    policy = checkpoint_policy(str(chk), CheckpointMode.WARN)
    first = Writer(pg_url, keyed, sink, query_id=query)
    commit(first, 0, [first.write(0, range(0, 3))], [f"public.{keyed}"], policy)
    lost = first.write(2, range(10, 13))
    spark_commits(chk, 0, 1, 2)
    operator = ForeachBatchWriter(url=pg_url, sink_id=sink, checkpoint_location=str(chk))
    with pytest.raises(DataLossError) as refused:
        operator.skip(1)
    assert list(refused.value.context["lost"]) == [2]
    assert "Batch 1 is not decided" in str(refused.value)
    assert [row[0] for row in decision_rows(pg_url, sink)] == [0]
    assert prepared_of(pg_url, sink) == [lost.gid]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"ROLLBACK PREPARED '{lost.gid}'")
