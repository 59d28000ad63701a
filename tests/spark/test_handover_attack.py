"""Attacks on the commit log's record of hand-overs (sql/011_handovers.sql, the check in
spark/batch.py ``_check_writer``): real Spark, real PostgreSQL. What an operator does after
the data-loss error (``recover --mark-skipped`` as the error advises, then a restart), and
sequences that must raise no alarm (a query stopped or killed mid-batch, then restarted)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import sqlsink
from tests.fix_pg import PgServer, prepared_in_test_db
from tests.spark.streams import (
    add_source_file,
    commit_log,
    keyed_table,
    run_foreach_batch,
    table_ids,
    write_source,
)

pytestmark = pytest.mark.spark
log = logging.getLogger(__name__)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqlsink", *args], capture_output=True, text=True, timeout=120
    )


def decided(url: str, sink_id: str) -> list[int]:
    return sorted(commit_log(url, sink_id, "rows"))


def catching_all(writer: sqlsink.ForeachBatchWriter, table: str, failing: int) -> Any:
    """ "Keep the stream alive": every error of the writer is caught, the writer's refusals
    of later batches too."""

    def function(df: Any, batch_id: int) -> None:
        try:
            with writer.batch(batch_id) as b:
                b.append(df, table)
                if batch_id == failing:
                    raise RuntimeError(f"a transient failure inside batch {batch_id}")
        except Exception as exc:
            log.info("caught in batch %d: %s", batch_id, exc)

    return function


def plain(writer: sqlsink.ForeachBatchWriter, table: str) -> Any:
    def function(df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as b:
            b.append(df, table)

    return function


def test_mark_skipped_as_advised_then_a_restart_names_the_other_swallowed_batches(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """Batch 1 fails and is caught; the writer refuses batches 2 and 3 in that process
    (nothing written) and the function catches that too: Spark committed 1, 2 and 3
    without rows. The restart's error names batch 1 only; the operator does what it says
    (``recover --mark-skipped 1 --checkpoint DIR``) and restarts: batches 2 and 3 were
    never recorded as handed (refused before the record), so the next restart must still
    not write batch 4 over their loss in silence."""
    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(5 * b, 5 * b + 5) for b in range(4)])
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    run_foreach_batch(spark, source, checkpoint, catching_all(writer, table, 1))
    assert table_ids(pg_url, table) == list(range(5))
    assert decided(pg_url, sink_id) == [0]
    assert all((checkpoint / "commits" / str(b)).exists() for b in range(4))

    add_source_file(source, 4, range(100, 105))

    def fresh() -> sqlsink.ForeachBatchWriter:
        return sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)

    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, source, checkpoint, plain(fresh(), table))
    assert "batch 1 was handed to the writer" in str(stopped.value)

    # as the error says (its --checkpoint may be left out: the query's runs recorded it)
    done = cli("recover", "--url", pg_url, "--sink-id", sink_id, "--mark-skipped", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert decided(pg_url, sink_id) == [0, 1]

    # the restart: batches 2 and 3 were committed by Spark without rows too; they were
    # refused before their hand-over was recorded, and the commit's checkpoint check
    # names them: batch 4 is not written over their loss in silence
    with pytest.raises(Exception) as again:
        run_foreach_batch(spark, source, checkpoint, plain(fresh(), table))
    text = str(again.value)
    assert "checkpoint records batches 2, 3 as committed" in text, text[-3000:]
    assert table_ids(pg_url, table) == list(range(5))
    assert decided(pg_url, sink_id) == [0, 1]
    assert prepared_in_test_db(pg_server) == []


def test_a_query_stopped_mid_batch_then_restarted_raises_no_alarm(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """query.stop() while batch 1's function is inside the writer's block: Spark does not
    commit batch 1; the restart runs it again (handed by a new run) then batch 2: no
    data-loss error, every row once."""
    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(5 * b, 5 * b + 5) for b in range(2)])
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    inside = tmp_path / "inside"

    def slow(df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as b:
            b.append(df, table)
            if batch_id == 1:
                inside.touch()
                time.sleep(8)

    events = spark.readStream.schema("id long, payload string, ts timestamp, amount double")
    stream = (
        events.option("maxFilesPerTrigger", 1).json(str(source)).writeStream.foreachBatch(slow)
        .option("checkpointLocation", str(checkpoint)).start()
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not inside.exists():
        assert time.monotonic() < deadline, "batch 1 never began"
        time.sleep(0.2)
    stream.stop()
    add_source_file(source, 2, range(100, 105))
    restarted = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    run_foreach_batch(spark, source, checkpoint, plain(restarted, table))
    assert table_ids(pg_url, table) == [*range(10), *range(100, 105)]
    assert decided(pg_url, sink_id) == [0, 1, 2]
    assert prepared_in_test_db(pg_server) == []


def test_a_failover_that_lost_the_newest_decision_is_not_blamed_on_the_function(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """The database went back in time (an asynchronous failover): batch 2's hand-over
    reached the standby, its decision and rows did not; Spark's checkpoint has commits/2.
    The restart hands batch 3 past the recorded hand-over of 2: the refusal must not say
    only that the function caught the writer's error (it did not: the function is plain)
    and tell the operator to change it; the database going back in time is the other
    cause, as the checkpoint check says of the same state."""
    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(5 * b, 5 * b + 5) for b in range(3)])
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    run_foreach_batch(spark, source, checkpoint, plain(writer, table))
    assert decided(pg_url, sink_id) == [0, 1, 2]
    # the failover: what batch 2 committed is gone, its hand-over stayed
    import psycopg
    from psycopg import sql

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM sqlsink.decisions WHERE sink_id = %s AND batch_id = 2", (sink_id,)
        )
        conn.execute(sql.SQL("DELETE FROM {} WHERE id >= 10").format(sql.Identifier(table)))
        handed = conn.execute(
            "SELECT max(batch_id) FROM sqlsink.handovers WHERE sink_id = %s", (sink_id,)
        ).fetchone()
    assert handed is not None and handed[0] == 2
    add_source_file(source, 3, range(100, 105))
    with pytest.raises(Exception) as stopped:
        run_foreach_batch(
            spark,
            source,
            checkpoint,
            plain(sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id), table),
        )
    text = str(stopped.value)
    assert "data loss" in text and "batch 2" in text, text[-2000:]
    message = text[text.find("data loss") :].split("\n")[0]  # the writer's, not Spark's
    assert "back in time" in message, message
    assert "--commit-lost 2" in message, message
    assert table_ids(pg_url, table) == list(range(10))
    assert prepared_in_test_db(pg_server) == []


def test_writer_skip_outside_the_stream_clears_the_handed_loss(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """The other way DESIGN names to accept a lost batch: ``writer.skip(N)`` from a writer
    given ``checkpoint_location=``, the query stopped. After it, the restart goes on: no
    permanent alarm."""
    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(5 * b, 5 * b + 5) for b in range(2)])
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    run_foreach_batch(spark, source, checkpoint, catching_all(writer, table, 1))
    add_source_file(source, 2, range(100, 105))

    def fresh() -> sqlsink.ForeachBatchWriter:
        return sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)

    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, source, checkpoint, plain(fresh(), table))
    assert "batch 1 was handed to the writer" in str(stopped.value)
    operator = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=sink_id, checkpoint_location=str(checkpoint)
    )
    operator.skip(1)
    assert decided(pg_url, sink_id) == [0, 1]
    run_foreach_batch(spark, source, checkpoint, plain(fresh(), table))
    assert table_ids(pg_url, table) == [*range(5), *range(100, 105)]
    assert decided(pg_url, sink_id) == [0, 1, 2]
    assert prepared_in_test_db(pg_server) == []


def test_a_swallowed_failure_whose_abort_failed_too_then_the_advice(
    spark: Any,
    tmp_path: Path,
    pg_url: str,
    pg_server: PgServer,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batch 1's block fails after its parts prepared, and its abort fails too (the
    server unreachable a moment: faked in the committer's abort only), the function
    catches the error: batch 1's transactions stay prepared and Spark commits it. The
    restart is refused naming batch 1; the operator follows the error (mark it skipped),
    is refused (the batch has prepared rows) and does what recover says instead
    (--commit-lost): the restart goes on, nothing stays prepared, every row is in."""
    from sqlsink.core.committer import Committer

    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(5 * b, 5 * b + 5) for b in range(2)])
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)

    def unreachable(self: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError("the server is unreachable (faked)")

    monkeypatch.setattr(Committer, "abort_batch", unreachable)
    run_foreach_batch(spark, source, checkpoint, catching_all(writer, table, 1))
    monkeypatch.undo()
    left = [g for g, _ in prepared_in_test_db(pg_server)]
    assert left, "batch 1's transactions stay prepared"
    add_source_file(source, 2, range(100, 105))

    def fresh() -> sqlsink.ForeachBatchWriter:
        return sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)

    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, source, checkpoint, plain(fresh(), table))
    assert "batch 1 was handed to the writer" in str(stopped.value)
    skipped = cli("recover", "--url", pg_url, "--sink-id", sink_id, "--mark-skipped", "1")
    said = skipped.stdout + skipped.stderr
    # refused: batch 1 is not without rows; recover names --commit-lost, which commits
    # the batch's prepared rows (the whole batch here: its block failed after its parts)
    assert skipped.returncode != 0 and "--commit-lost 1" in said, said
    lost = cli("recover", "--url", pg_url, "--sink-id", sink_id, "--commit-lost", "1")
    assert lost.returncode == 0, lost.stdout + lost.stderr
    done = cli("recover", "--url", pg_url, "--sink-id", sink_id)
    assert done.returncode == 0, done.stdout + done.stderr
    run_foreach_batch(spark, source, checkpoint, plain(fresh(), table))
    assert table_ids(pg_url, table) == [*range(10), *range(100, 105)]
    assert decided(pg_url, sink_id) == [0, 1, 2]
    assert prepared_in_test_db(pg_server) == []
