"""The database behind the checkpoint (issue 12 item 4), without Spark: the commit's
check of the checkpoint's commits/ against the commit log (docs/DESIGN.md invariant 9).

The checkpoint is built by hand in Spark's format; a failover or restore that lost
the newest decisions is played by deleting them (complete decisions may be deleted;
tests/spark/test_failover.py loses them with a real standby).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlsink.checkpoint.parse import checkpoint_policy
from sqlsink.core.checkpoint_check import (
    CheckpointCheck,
    CheckpointMode,
    CheckpointPolicy,
    EntryPoint,
    Unreadable,
)
from sqlsink.core.committer import Committer
from sqlsink.core.model import PartitionOutcome, ResolutionReport
from sqlsink.errors import CheckpointError, DataLossError
from sqlsink.postgres import checkpoint_records, retention
from sqlsink.postgres.backend import PostgresBackend
from tests.pg.protocol import Writer, ids_of, prepared_of

QUERY = "q-failover"
WARN = CheckpointMode.WARN


def make_checkpoint(root: Path, offsets: range, commits: range) -> Path:
    """What Spark leaves (metadata, offsets/N, commits/N, .crc and temporary files)."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": QUERY}) + "\n")
    for n in offsets:
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + n, "conf": {}}
        (root / "offsets" / str(n)).write_text(f'v1\n{json.dumps(meta)}\n{{"logOffset":{n}}}')
        (root / "offsets" / f".{n}.crc").write_bytes(b"crc")
    for n in commits:
        (root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (root / "commits" / f".{n}.crc").write_bytes(b"crc")
    (root / "commits" / f".{offsets[-1]}.{uuid.uuid4()}.tmp").write_text("v1\n")
    return root


@contextmanager
def checked(writer: Writer, policy: CheckpointPolicy) -> Iterator[Committer]:
    """The committer as the stream's commit() builds it: with the checkpoint check."""
    with psycopg.connect(writer.url, autocommit=True) as conn:
        backend = PostgresBackend(conn, 10)  # type: ignore[arg-type]
        yield Committer(backend, writer.sink, checkpoint_check=CheckpointCheck(backend, policy))


def commit(writer: Writer, batch: int, policy: CheckpointPolicy) -> ResolutionReport:
    """One task of the batch, then the checked commit; on failure Spark's abort()."""
    outcomes: list[PartitionOutcome | None] = [
        writer.write(batch, range(batch * 10, batch * 10 + 3))
    ]
    try:
        with checked(writer, policy) as committer:
            return committer.commit_batch(batch, outcomes, query_id=QUERY, run_id=writer.run)
    except Exception:
        writer.abort(batch, outcomes)
        raise


def lose_decisions(url: str, sink: str, *batches: int) -> None:
    """What a failover to a standby that lacked them does to complete decisions."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM sqlsink.decisions WHERE sink_id = %s AND batch_id = ANY(%s)",
            (sink, list(batches)),
        )


def decided(url: str, sink: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT batch_id FROM sqlsink.decisions WHERE sink_id = %s ORDER BY 1", (sink,)
        ).fetchall()
    return [int(str(r[0])) for r in rows]


def checks(url: str, sink: str) -> list[checkpoint_records.CheckpointCheckRow]:
    with psycopg.connect(url, autocommit=True) as conn:
        return checkpoint_records.checkpoint_checks(conn, sink)  # type: ignore[arg-type]


def status(url: str, sink: str) -> tuple[int, dict[str, Any], str]:
    """``sqlsink status --json`` for the sink, as the person on call runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "sqlsink", "status", "--url", url, "--sink-id", sink, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def new_run(writer: Writer) -> Writer:
    """The same query restarted from its checkpoint: a new Spark run id."""
    return replace(writer, run=uuid.uuid4().hex)


def test_batches_spark_committed_that_the_log_lacks_stop_the_commit(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    first = Writer(pg_url, keyed, sink, QUERY)
    for batch in range(5):
        first.batch(batch, range(batch * 10, batch * 10 + 3))
    lose_decisions(pg_url, sink, 3, 4)  # the database went back in time
    location = str(make_checkpoint(tmp_path / "chk", range(6), range(5)))
    policy = replace(checkpoint_policy(location, WARN), entry=EntryPoint.DATA_SOURCE)

    restarted = new_run(first)
    with pytest.raises(DataLossError) as lost:
        commit(restarted, 5, policy)
    message = str(lost.value)
    assert message.startswith(
        f"data loss: sink {sink!r}: Spark's checkpoint records batches 3, 4 as committed, "
        "but the commit log has no decision for them: the database went back in time"
    )
    assert "Batch 5 is not decided" in message
    assert (
        f"delete commits/3 onward and offsets/4 onward (with their .N.crc files) from {location}"
        in message
    )
    assert f"sqlsink recover --sink-id {sink}, then sqlsink forget --sink-id {sink}" in message
    assert lost.value.context["lost"] == [3, 4]
    # nothing of batch 5: not decided, rolled back by the abort
    assert decided(pg_url, sink) == [0, 1, 2]
    assert prepared_of(pg_url, sink) == []
    assert 50 not in ids_of(pg_url, keyed)
    [row] = checks(pg_url, sink)
    assert (row.run_id, row.newest, row.verdict, row.lost, row.batch_id) == (
        restarted.run,
        True,
        "loss",
        (3, 4),
        5,
    )
    assert row.location == location and "batches 3, 4 in commits/" in row.detail

    # sqlsink status says it too: an error, exit 3 (data loss), and the JSON fields
    code, doc, _ = status(pg_url, sink)
    assert code == 3
    assert doc["sinks"][0]["checkpoint_check"]["verdict"] == "loss"
    assert doc["sinks"][0]["checkpoint_check"]["lost"] == [3, 4]
    [error] = [w for w in doc["warnings"] if w["level"] == "error"]
    assert (
        "records batch(es) 3, 4 as committed, but this database has no decision"
        in (error["message"])
    )
    assert f"sqlsink forget --sink-id {sink}" in error["fix"]

    # every restart stops the same way until someone acts
    with pytest.raises(DataLossError, match="batches 3, 4 as committed"):
        commit(new_run(first), 5, policy)


def test_a_failover_in_the_middle_of_a_run_is_caught_at_the_next_commit(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    writer = Writer(pg_url, keyed, sink, QUERY)
    policy = checkpoint_policy(str(make_checkpoint(chk, range(1), range(0))), CheckpointMode.WARN)
    for batch in range(4):  # one run; Spark writes commits/N after each commit
        commit(writer, batch, policy)
        (chk / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    [row] = checks(pg_url, sink)
    assert (row.verdict, row.batch_id) == ("verified", 0)  # once per run while all is well
    lose_decisions(pg_url, sink, 2, 3)  # the database failed over between two batches
    with pytest.raises(DataLossError, match="records batches 2, 3 as committed"):
        commit(writer, 4, policy)
    assert decided(pg_url, sink) == [0, 1]
    assert prepared_of(pg_url, sink) == []


def test_a_gap_below_decided_batches_is_not_repaired_by_rewinding_the_checkpoint(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    writer = Writer(pg_url, keyed, sink, QUERY)
    for batch in range(5):
        writer.batch(batch, range(batch * 10, batch * 10 + 3))
    lose_decisions(pg_url, sink, 2)  # a complete decision deleted by hand
    policy = checkpoint_policy(str(make_checkpoint(tmp_path / "c", range(6), range(5))), WARN)
    with pytest.raises(DataLossError) as lost:
        commit(new_run(writer), 5, policy)
    message = str(lost.value)
    assert "records batch 2 as committed" in message
    assert "delete commits/" not in message and "must not be rewound" in message


def test_a_new_sink_on_an_existing_checkpoint_is_not_loss(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A new sink id (or the log after sqlsink forget): Spark's earlier batches are not its."""
    chk = make_checkpoint(tmp_path / "chk", range(11), range(10))
    writer = Writer(pg_url, keyed, sink, QUERY)
    commit(writer, 10, checkpoint_policy(str(chk), WARN))
    (chk / "commits" / "10").write_text("v1\n{}")
    commit(writer, 11, checkpoint_policy(str(chk), WARN))
    assert decided(pg_url, sink) == [10, 11]
    [row] = checks(pg_url, sink)
    assert (row.verdict, row.batch_id) == ("verified", 10)
    assert row.detail.startswith("the sink has no decision before batch 10 (a new sink)")
    # and a later run does not count batches 0..9 as its own
    restarted = new_run(writer)
    commit(restarted, 12, checkpoint_policy(str(chk), WARN))
    assert checks(pg_url, sink)[0].verdict == "verified"


def test_retention_pruned_decisions_are_not_loss(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    writer = Writer(pg_url, keyed, sink, QUERY)
    for batch in range(10):
        writer.batch(batch, range(batch * 10, batch * 10 + 3))
    with psycopg.connect(pg_url, autocommit=True) as conn:  # what retention leaves
        conn.execute("DELETE FROM sqlsink.decisions WHERE sink_id = %s AND batch_id <= 5", (sink,))
        conn.execute("UPDATE sqlsink.sinks SET pruned_through = 5 WHERE sink_id = %s", (sink,))
    chk = str(make_checkpoint(tmp_path / "chk", range(11), range(10)))
    commit(new_run(writer), 10, checkpoint_policy(chk, WARN))
    assert checks(pg_url, sink)[0].verdict == "verified"
    # a tail lost above what retention pruned is still loss, and only that tail
    (tmp_path / "chk" / "commits" / "10").write_text("v1\n{}")
    lose_decisions(pg_url, sink, 9, 10)
    with pytest.raises(DataLossError, match="records batches 9, 10 as committed"):
        commit(new_run(writer), 11, checkpoint_policy(chk, WARN))


def test_an_unreadable_checkpoint_is_unverified_a_warning_or_with_require_an_error(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = Writer(pg_url, keyed, sink, QUERY)
    missing = str(tmp_path / "not-there")
    with caplog.at_level(logging.WARNING, logger="sqlsink"):
        commit(writer, 0, checkpoint_policy(missing, WARN))
    assert decided(pg_url, sink) == [0]  # warn: the batch goes on
    [row] = checks(pg_url, sink)
    assert row.verdict == "unverified" and "is not a directory" in row.detail
    assert "the checkpoint was not compared with the commit log" in caplog.text
    assert "checkpointCheck=require" in caplog.text
    code, doc, _ = status(pg_url, sink)
    assert code == 1 and doc["sinks"][0]["checkpoint_check"]["verdict"] == "unverified"
    assert any("could not be compared" in w["message"] for w in doc["warnings"])

    # require: the commit stops before deciding, and the abort rolls the batch back
    required = checkpoint_policy(missing, CheckpointMode.REQUIRE)
    with pytest.raises(CheckpointError) as refused:
        commit(new_run(writer), 1, required)
    assert "checkpointCheck=require, but the checkpoint could not be compared" in str(refused.value)
    assert "Batch 1 is not decided" in str(refused.value)
    assert decided(pg_url, sink) == [0]
    assert prepared_of(pg_url, sink) == []
    assert checks(pg_url, sink)[0].verdict == "unverified"

    # no checkpointLocation at all, and a scheme pyarrow.fs cannot open
    for location in (None, "nosuchfs://bucket/chk"):
        with pytest.raises(CheckpointError):
            commit(new_run(writer), 1, checkpoint_policy(location, CheckpointMode.REQUIRE))
    assert "pyarrow.fs does not open it" in checks(pg_url, sink)[0].detail
    assert prepared_of(pg_url, sink) == []


def test_a_checkpoint_read_that_hangs_is_bounded(pg_url: str, keyed: str, sink: str) -> None:
    """The read runs under the sink lock: it waits at most read_timeout_s (invariant 11)."""

    def hangs() -> frozenset[int] | Unreadable:
        time.sleep(5)
        return frozenset()

    policy = CheckpointPolicy("s3://bucket/chk", hangs, WARN, read_timeout_s=0.2)
    started = time.monotonic()
    commit(Writer(pg_url, keyed, sink, QUERY), 0, policy)
    assert time.monotonic() - started < 4
    row = checks(pg_url, sink)[0]
    assert row.verdict == "unverified" and "took over 0.2 s" in row.detail


def test_off_reads_nothing_and_says_so(pg_url: str, keyed: str, sink: str) -> None:
    def never() -> frozenset[int] | Unreadable:
        raise AssertionError("checkpointCheck=off must not read the checkpoint")

    writer = Writer(pg_url, keyed, sink, QUERY)
    policy = CheckpointPolicy("/chk", never, CheckpointMode.OFF)
    commit(writer, 0, policy)
    lose_decisions(pg_url, sink, 0)
    commit(writer, 2, policy)  # a gap, and still nothing is read
    [row] = checks(pg_url, sink)
    assert (row.verdict, row.batch_id) == ("off", 0)


def test_accepting_the_loss_with_forget_as_the_error_says(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    writer = Writer(pg_url, keyed, sink, QUERY)
    for batch in range(3):
        writer.batch(batch, range(batch * 10, batch * 10 + 3))
    lose_decisions(pg_url, sink, 2)
    policy = checkpoint_policy(str(make_checkpoint(tmp_path / "chk", range(4), range(3))), WARN)
    stopped = new_run(writer)
    with pytest.raises(DataLossError, match="records batch 2 as committed"):
        commit(stopped, 3, policy)
    with checked(stopped, policy) as committer:
        committer.recover()  # sqlsink recover --sink-id
    with psycopg.connect(pg_url, autocommit=True) as conn:
        retention.forget_sink(conn, sink)  # type: ignore[arg-type]
    # the restarted query re-runs batch 3; the sink's new log starts there
    commit(new_run(writer), 3, policy)
    assert decided(pg_url, sink) == [3]
    assert checks(pg_url, sink)[0].verdict == "verified"


# -- a missing batch without transactions: which entry point wrote the sink ---------------


def skipped_batch_1(
    pg_url: str, keyed: str, sink: str, chk: Path, entry: EntryPoint
) -> tuple[Writer, CheckpointPolicy]:
    """Batch 0 decided; batch 1 in commits/ without a decision, nothing of it prepared
    (a foreachBatch function that returned without calling the writer, or a lost
    decision of a batch whose partitions were all committed)."""
    make_checkpoint(chk, range(3), range(2))
    policy = replace(checkpoint_policy(str(chk), WARN), entry=entry)
    writer = Writer(pg_url, keyed, sink, QUERY)
    commit(writer, 0, policy)
    return writer, policy


def test_foreach_batch_a_batch_not_handed_to_the_writer_is_told_apart_and_can_be_accepted(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    writer, policy = skipped_batch_1(pg_url, keyed, sink, chk, EntryPoint.FOREACH_BATCH)
    with pytest.raises(DataLossError) as lost:
        commit(writer, 2, policy)
    message = str(lost.value)
    assert message.startswith(
        f"data loss: sink {sink!r}: Spark's checkpoint records batch 1 as committed, but the "
        "commit log has no decision for it, and nothing of it is prepared. Either the "
        "foreachBatch function returned without handing batch 1 to the writer: then nothing "
        "is lost."
    ), message
    assert "`with writer.batch(batch_id)` decides an empty batch" in message
    assert "`writer.skip(batch_id)` marks a batch that has nothing for this sink" in message
    assert f"sqlsink recover --sink-id {sink} --mark-skipped 1" in message
    assert "Or the database went back in time" in message
    assert "delete commits/1 onward and offsets/2 onward (with their .N.crc files)" in message
    assert lost.value.context["lost"] == [1] and lost.value.context["prepared"] == {}
    assert decided(pg_url, sink) == [0] and prepared_of(pg_url, sink) == []

    # a checkpoint that does not record batch 1 is refused; a batch with transactions too
    behind = tmp_path / "behind"
    make_checkpoint(behind, range(2), range(1))
    refused = sqlsink_recover(pg_url, sink, "--checkpoint", str(behind), "--mark-skipped", "1")
    assert refused.code == 2 and "no commits/1" in refused.json["error"]["message"]
    not_empty = sqlsink_recover(pg_url, sink, "--mark-skipped", "0")
    assert (
        not_empty.code == 2 and "batch 0 is decided already" in not_empty.json["error"]["message"]
    )

    # the command the error gives: batch 1 gets an empty decision, and the check passes
    done = sqlsink_recover(pg_url, sink, "--mark-skipped", "1")
    assert done.code == 0, done.out + done.err
    assert done.json["mark_skipped"] == [1]
    assert done.json["sinks"][0]["decided_batches"] == [1]
    assert decided(pg_url, sink) == [0, 1]
    restarted = new_run(writer)  # the query, restarted, re-runs batch 2: the check passes
    commit(restarted, 2, policy)
    commit(restarted, 3, policy)
    assert decided(pg_url, sink) == [0, 1, 2, 3]
    assert checks(pg_url, sink)[0].verdict == "verified"
    assert ids_of(pg_url, keyed) == [0, 1, 2, 20, 21, 22, 30, 31, 32]
    assert prepared_of(pg_url, sink) == []


def test_foreach_batch_mark_skipped_with_the_checkpoint(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    writer, policy = skipped_batch_1(pg_url, keyed, sink, chk, EntryPoint.FOREACH_BATCH)
    with pytest.raises(DataLossError, match="--mark-skipped 1"):
        commit(writer, 2, policy)
    # a batch that still has prepared transactions is not skipped: commit-lost is for it
    other = new_run(writer)
    pending = other.write(1, range(100, 103))
    with_gids = sqlsink_recover(pg_url, sink, "--checkpoint", str(chk), "--mark-skipped", "1")
    assert with_gids.code == 2, with_gids.out + with_gids.err
    assert "batch 1 has 1 prepared transaction(s)" in with_gids.json["error"]["message"]
    assert "--commit-lost 1" in with_gids.json["error"]["message"]
    other.abort(1, [pending])
    done = sqlsink_recover(pg_url, sink, "--checkpoint", str(chk), "--mark-skipped", "1")
    assert done.code == 0, done.out + done.err
    restarted = new_run(writer)
    commit(restarted, 2, policy)
    assert decided(pg_url, sink) == [0, 1, 2]
    assert ids_of(pg_url, keyed) == [0, 1, 2, 20, 21, 22]


def test_format_sqlsink_a_missing_batch_without_transactions_is_loss_and_re_delivery_works(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    writer, policy = skipped_batch_1(pg_url, keyed, sink, chk, EntryPoint.DATA_SOURCE)
    with pytest.raises(DataLossError) as lost:
        commit(writer, 2, policy)
    message = str(lost.value)
    assert message.startswith(
        f"data loss: sink {sink!r}: Spark's checkpoint records batch 1 as committed, but the "
        "commit log has no decision for it: the database went back in time"
    ), message
    assert "format('sqlsink') has Spark call the sink's commit for every batch" in message
    assert "foreachBatch" not in message and "--mark-skipped" not in message
    # following the advice: delete commits/1 onward and offsets/2 onward, restart
    for name in ("commits/1", "commits/.1.crc", "offsets/2", "offsets/.2.crc"):
        (chk / name).unlink(missing_ok=True)
    assert "delete commits/1 onward and offsets/2 onward" in message
    rerun = new_run(writer)  # Spark re-runs batch 1 from its recorded offsets
    commit(rerun, 1, policy)
    (chk / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}')
    commit(rerun, 2, policy)
    assert decided(pg_url, sink) == [0, 1, 2]
    assert ids_of(pg_url, keyed) == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert checks(pg_url, sink)[0].verdict == "verified"


def test_an_unknown_entry_point_says_both(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    writer, policy = skipped_batch_1(pg_url, keyed, sink, tmp_path / "c", EntryPoint.UNKNOWN)
    with pytest.raises(DataLossError) as lost:
        commit(writer, 2, policy)
    message = str(lost.value)
    assert "Either a foreachBatch function that writes this sink returned without" in message
    assert "format('sqlsink') hands every batch to the sink" in message
    assert "Or the database went back in time" in message


def test_the_committer_session_tells_the_check_which_entry_point_it_serves(
    pg_url: str, sink: str
) -> None:
    from sqlsink.options import SinkOptions
    from sqlsink.spark.plan import CommitterSession

    options = SinkOptions.parse(
        {"url": pg_url, "table": "t", "sinkId": sink, "checkpointLocation": "/nowhere"}
    )
    with CommitterSession(options, sink, check_checkpoint=True) as committer:  # datasource.py
        assert committer.checkpoint_check.policy.entry is EntryPoint.DATA_SOURCE
    with CommitterSession(  # the foreachBatch writer's commit (spark/batch.py)
        options, sink, check_checkpoint=True, tables=["public.t"], views=[]
    ) as committer:
        assert committer.checkpoint_check.policy.entry is EntryPoint.FOREACH_BATCH


def sqlsink_recover(pg_url: str, sink: str, *args: str) -> Any:
    from tests.pg.test_cli import sqlsink

    return sqlsink("recover", "--url", pg_url, "--sink-id", sink, *args, "--json")
