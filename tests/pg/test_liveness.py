"""A run is live while it is working (docs/DESIGN.md invariant 10): ``sqlsink recover``
never rolls back a batch that is still being written, however long the gap between its
registrations, and a commit that finds its transaction gone says who can have done it.

Each case runs the real ``sqlsink recover`` (in process, so that its start does not eat
into a timeout of seconds) beside the sink's own tasks and commit, on a real server.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sqlsink import cli
from sqlsink.core.model import PartitionOutcome, TaskIdentity
from sqlsink.errors import CommitError
from sqlsink.postgres import run_registry
from sqlsink.postgres.partition import write_partition
from sqlsink.spark import heartbeat
from sqlsink.spark.heartbeat import Heartbeat
from tests.pg.protocol import Writer, ids_of, prepared_of, rows
from tests.pg.test_recover_runs import checkpoint_recorded


def write_part(
    writer: Writer, batch: int, ids: range, partition: int, part: int
) -> PartitionOutcome:
    """A task of part ``part`` of a foreachBatch batch (its second DataFrame: part 1)."""
    task = writer.task(batch, partition)
    task = TaskIdentity(
        task.sink_id,
        task.batch_id,
        task.partition_id,
        task.run_id,
        task.attempt_id,
        task.attempt_number,
        task.query_id,
        part=part,
    )
    return write_partition(writer.options, writer.target(), task, rows(ids))


def recover(url: str, sink: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """``sqlsink recover --sink-id SINK --json`` (no --force): its JSON document."""
    capsys.readouterr()
    cli.main(["recover", "--url", url, "--sink-id", sink, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def prepared_age(url: str, gids: list[str]) -> float:
    """Seconds since the youngest of these transactions prepared (the server's clock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - max(prepared))::float8 "
            "FROM pg_prepared_xacts WHERE gid = ANY(%s)",
            (gids,),
        ).fetchone()
    assert row is not None and row[0] is not None, f"not prepared: {gids}"
    return float(row[0])


def run_of(url: str, sink: str, run: str) -> run_registry.RunInfo:
    with psycopg.connect(url, autocommit=True) as conn:
        (info,) = [r for r in run_registry.runs(conn, sink) if r.run_id == run]  # type: ignore[arg-type]
    return info


def test_a_task_that_prepares_after_writing_longer_than_run_timeout_keeps_its_run_live(
    pg_url: str,
    keyed: str,
    sink: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The data source's case: a run registers at each task's start and at its commit.
    A batch whose second task writes for longer than runTimeout (the first batch of a
    backlog) was heard from last when that task started; its first task's transaction
    was prepared long before the commit. A transaction of the run prepared within its
    runTimeout shows the batch at work: recover leaves it, and the commit goes through."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra={"runTimeout": "3s"})
    writer.batch(0, range(5))
    first = writer.write(1, range(5, 10), 0)
    faults = tmp_path / "faults.json"  # the second task writes for 4.5 s (> runTimeout)
    faults.write_text(
        json.dumps(
            [{"point": "mid_copy", "batch": 1, "partition": 1, "action": "sleep", "seconds": 4.5}]
        )
    )
    monkeypatch.setenv("SQLSINK_FAULTS_FILE", str(faults))
    second = writer.write(1, range(10, 15), 1)
    monkeypatch.delenv("SQLSINK_FAULTS_FILE")
    assert faults.with_name("faults.json.fired").exists()
    gids = sorted(o.gid for o in (first, second) if o.gid)
    run = run_of(pg_url, sink, writer.run)
    print(
        f"heartbeat {run.heartbeat_age_s:.1f} s ago, timeout {run.timeout_s} s, state {run.state}"
    )

    doc = recover(pg_url, sink, capsys)
    left = prepared_of(pg_url, sink)
    print("sqlsink recover: live runs", doc["sinks"][0]["live_runs"], "-> still prepared:", left)  # type: ignore[index]
    assert left == gids
    assert run.state == "live" and run.heartbeat_age_s < run.timeout_s  # heard from: the prepare
    writer.commit(1, [first, second])
    assert ids_of(pg_url, keyed) == list(range(15))
    assert prepared_of(pg_url, sink) == []


def test_a_run_heard_from_by_neither_heartbeat_nor_prepare_within_its_timeout_is_dead(
    pg_url: str, keyed: str, sink: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Liveness stays bounded: a driver gone after its task prepared leaves a run that
    is dead once both its registration and its prepare are older than runTimeout;
    recover rolls its batch back, and were the driver only slow, its commit says who
    can have rolled the transaction back and what to change."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra={"runTimeout": "1s"})
    writer.batch(0, range(5))
    outcome = writer.write(1, range(5, 10), 0)
    assert outcome.gid is not None
    deadline = time.monotonic() + 15
    while run_of(pg_url, sink, writer.run).live:  # bounded: the timeout is 1 s
        assert time.monotonic() < deadline, "the run stayed live"
        time.sleep(0.1)
    assert prepared_age(pg_url, [outcome.gid]) >= 1.0  # not before its prepare aged
    # the stream's checkpoint check recorded its checkpoint, which recover reads: no
    # commits/1, so batch 1 is a dead run's leftover (not a lost decision's last copy)
    checkpoint_recorded(pg_url, sink, tmp_path / "chk", range(1))
    doc = recover(pg_url, sink, capsys)
    assert doc["sinks"][0]["rolled_back"] == 1  # type: ignore[index]
    assert prepared_of(pg_url, sink) == []
    with pytest.raises(CommitError) as failed:
        writer.commit(1, [outcome])
    message = str(failed.value)
    print(message)
    assert f"batch 1, partition 0: transaction {outcome.gid} is no longer prepared" in message
    assert "another run" not in message
    assert "sqlsink recover" in message and "runTimeout" in message
    assert f"run {writer.run}" in message
    assert ids_of(pg_url, keyed) == list(range(5))


def test_a_commit_whose_transaction_an_abort_of_its_run_rolled_back_names_the_abort(
    pg_url: str, keyed: str, sink: str
) -> None:
    writer = Writer(pg_url, keyed, sink, query_id="q")
    writer.batch(0, range(5))
    outcome = writer.write(1, range(5, 10), 0)
    writer.abort(1, [outcome])  # Spark's abort of batch 1 of this run
    assert prepared_of(pg_url, sink) == []
    with pytest.raises(CommitError) as failed:
        writer.commit(1, [outcome])
    message = str(failed.value)
    print(message)
    assert f"transaction {outcome.gid} is no longer prepared" in message
    assert "another run" not in message
    assert f"an abort of run {writer.run}" in message
    assert ids_of(pg_url, keyed) == list(range(5))


def test_a_multi_part_batch_stays_live_while_its_next_part_computes(
    pg_url: str, keyed: str, sink: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The foreachBatch case (review r7): part 0's partitions are prepared while part 1's
    Spark job computes its input (a join, an aggregation), for longer than runTimeout:
    no task starts, nothing prepares. The batch's heartbeat registers the run from the
    driver while the batch is open: recover leaves part 0, and the batch commits."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra={"runTimeout": "3s"})
    writer.commit(
        0, [write_part(writer, 0, range(3), 0, 0), write_part(writer, 0, range(3, 6), 0, 1)]
    )
    beating = Heartbeat(writer.options, sink, writer.run, writer.query_id).start()
    try:
        part0 = [
            write_part(writer, 1, range(10, 13), 0, 0),
            write_part(writer, 1, range(13, 16), 1, 0),
        ]
        gids = sorted(o.gid for o in part0 if o.gid)
        # part 1's job computes its input: twice runTimeout without a task of the batch
        deadline = time.monotonic() + 30
        while prepared_age(pg_url, gids) < 6.0:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        doc = recover(pg_url, sink, capsys)
        left = prepared_of(pg_url, sink)
        print(
            "sqlsink recover: live runs", doc["sinks"][0]["live_runs"], "-> still prepared:", left
        )  # type: ignore[index]
        assert left == gids
        part1 = [write_part(writer, 1, range(20, 23), 0, 1)]
    finally:
        beating.stop()
    assert not beating.running
    writer.commit(1, part0 + part1)
    assert ids_of(pg_url, keyed) == [0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 20, 21, 22]
    assert prepared_of(pg_url, sink) == []


def wait_until(condition: Callable[[], bool], what: str, bound_s: float = 10) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound_s} s: {what}"
        time.sleep(0.05)


def test_the_heartbeat_ends_with_its_block_with_its_batch_and_with_its_run(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Registered every runTimeout / 3 while the block is open and at each part after the
    first (``before_job``); it ends at the block's exit (``end``), when the batch is
    dropped without exiting, and by itself when its run is fenced (``sqlsink recover
    --force``)."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra={"runTimeout": "1s"})
    block = Batchlike()
    beating = heartbeat.before_job(block, writer.options, sink, writer.run, "q")
    assert beating.interval_s == heartbeat.MIN_INTERVAL_S  # runTimeout / 3, at least that
    wait_until(lambda: beating.beats >= 2, "two beats")  # every interval
    info = run_of(pg_url, sink, writer.run)
    assert info.live and info.run_timeout_s == 1 and info.heartbeat_age_s < 1
    assert heartbeat.before_job(block, writer.options, sink, writer.run, "q") is beating
    heartbeat.end(block)
    wait_until(lambda: not beating.running, "the heartbeat ends with its block")
    assert beating.ended_by is None

    dropped = Batchlike()
    orphan = heartbeat.before_job(dropped, writer.options, sink, writer.run, "q")
    wait_until(lambda: orphan.beats >= 1, "a beat")
    del dropped
    gc.collect()
    wait_until(lambda: not orphan.running, "the dropped batch's heartbeat ends")

    fenced = Heartbeat(writer.options, sink, writer.run, "q").start()
    wait_until(lambda: fenced.beats >= 1, "a beat")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert run_registry.fence_runs(conn, sink, [writer.run]) == [writer.run]  # type: ignore[arg-type]
    wait_until(lambda: not fenced.running, "the fenced run's heartbeat ends")
    assert fenced.ended_by is not None and "operator" in fenced.ended_by
    fenced.stop()


def test_a_one_part_batch_pays_no_beat_and_its_exit_never_waits_on_one(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Part 0's tasks register the run themselves: the heartbeat's first beat comes an
    interval after part 0 starts, or at once before part 1. So a one-part block shorter
    than the interval registers nothing of its own, and the block's exit returns at once
    even while a beat is in progress (here one waiting on the sink's row lock): the beat
    finishes on its own."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra={"runTimeout": "30s"})
    one_part = Batchlike()
    beating = heartbeat.before_job(one_part, writer.options, sink, writer.run, "q")
    writer.commit(0, [write_part(writer, 0, range(3), 0, 0)])  # part 0's task and commit
    time.sleep(0.3)
    started = time.monotonic()
    heartbeat.end(one_part)
    exit_s = time.monotonic() - started
    print(f"one part: {beating.beats} beats, block exit {exit_s * 1000:.1f} ms")
    assert beating.beats == 0 and exit_s < 0.5
    wait_until(lambda: not beating.running, "the heartbeat ends with its block")

    two_parts = Batchlike()
    beating = heartbeat.before_job(two_parts, writer.options, sink, writer.run, "q")
    with psycopg.connect(pg_url) as holder:  # holds the row every registration locks
        holder.execute("SELECT 1 FROM sqlsink.sinks WHERE sink_id = %s FOR UPDATE", (sink,))
        assert heartbeat.before_job(two_parts, writer.options, sink, writer.run, "q") is beating
        wait_until(lambda: waiting_on_the_sink_row(pg_url, sink), "part 1's beat waits")
        started = time.monotonic()
        heartbeat.end(two_parts)
        exit_s = time.monotonic() - started
        print(f"a beat in progress: block exit {exit_s * 1000:.1f} ms")
        assert exit_s < 0.5 and beating.running and beating.beats == 0
    wait_until(lambda: not beating.running, "the beat finishes on its own")
    assert beating.beats == 1 and beating.ended_by is None
    assert ids_of(pg_url, keyed) == [0, 1, 2] and prepared_of(pg_url, sink) == []


def waiting_on_the_sink_row(url: str, sink: str) -> bool:
    """Whether the heartbeat's registration of ``sink`` waits on a lock."""
    waiting = "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            f"{waiting} AND application_name = %s)", (f"sqlsink {sink} heartbeat",)
        )
        return found.fetchone() == (True,)


class Batchlike:
    """What ``before_job`` keys a heartbeat by: the open batch (any object)."""
