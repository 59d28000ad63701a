"""One live run per sink, aborts that stay in their run, retries that make progress
(docs/DESIGN.md invariants 10 and 12; issue 12 items 8, 9, 10, 16): each
interleaving run for real against PostgreSQL with the sink's own code."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.core.model import Binding, NewDecision, PartitionOutcome
from sqlsink.errors import FencedError, SinkBindingError, TransientError
from sqlsink.postgres.partition import write_partition
from sqlsink.spark.driver_token import run_token
from tests.fix_pg import forget_sink
from tests.pg.protocol import Writer, ids_of, new_sink, prepared_of, rows
from tests.programs import REPO


def test_a_resumed_zombie_driver_is_fenced_and_touches_nothing_of_the_new_run(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 9: the zombie's commit(5) rolled back the new run's batch 6; B then failed."""
    zombie = Writer(pg_url, keyed, sink, query_id="q", run="run-a")
    zombie.batch(4, range(40, 50))
    paused = [zombie.write(5, range(50, 55))]  # ... and the driver pauses before commit(5)
    new = Writer(pg_url, keyed, sink, query_id="q", run="run-b")  # same checkpoint, restarted
    new.batch(5, range(50, 60))  # Spark re-runs batch 5
    in_flight = [new.write(6, range(60, 70))]
    with pytest.raises(FencedError) as fenced:
        zombie.commit(5, paused)  # the zombie wakes up
    message = str(fenced.value)
    assert "run-a" in message and "superseded by run run-b" in message
    assert prepared_of(pg_url, sink) == [in_flight[0].gid]  # the new run's batch is intact
    with pytest.raises(FencedError):  # nor can its tasks write or resolve anything
        zombie.write(7, range(70, 75))
    with pytest.raises(FencedError):
        zombie.abort(6, [None])
    new.commit(6, in_flight)
    assert ids_of(pg_url, keyed) == list(range(40, 70))
    assert prepared_of(pg_url, sink) == []


def test_a_load_superseded_by_another_load_of_its_sink_id_says_so_and_writes_nothing(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Two named loads of different data under one sinkId at once: the one that started
    first is fenced, and its error speaks of loads, not of a checkpoint or a query."""
    first = Writer(pg_url, keyed, sink, query_id=None, run="run-a")
    paused = [first.write(0, range(0, 5), 0), first.write(0, range(5, 10), 1)]
    second = Writer(pg_url, keyed, sink, query_id=None, run="run-b")
    in_flight = [second.write(0, range(100, 105), 0)]
    said = (
        f"sink {sink!r}: run run-a was superseded by run run-b: another load of this sinkId "
        "started after this one, so this load stops. Nothing of this load was written: it "
        "decides nothing, and its prepared parts are rolled back (by the other load's "
        f"commit, or by sqlsink recover --sink-id {sink}). Fix: loads of different data "
        "need different sinkIds; a re-run of the same load waits for the other one to "
        "finish, then runs again (and writes nothing if that one committed)"
    )
    with pytest.raises(FencedError) as fenced:
        first.commit(0, paused)
    assert str(fenced.value) == said
    with pytest.raises(FencedError) as fenced:
        first.abort(0, paused)
    assert str(fenced.value) == said
    with pytest.raises(FencedError) as fenced:
        first.write(0, range(10, 15), 2)
    assert str(fenced.value) == said
    second.commit(0, in_flight)
    assert ids_of(pg_url, keyed) == list(range(100, 105))
    assert prepared_of(pg_url, sink) == []  # the first load's parts were rolled back


def test_a_load_fenced_in_its_abort_after_its_own_decision_says_its_rows_are_in(
    pg_url: str, keyed: str, sink: str
) -> None:
    """A load whose commit failed after its decision, fenced by another load before its
    abort: its rows are committed, and its error says so (not "nothing written")."""
    first = Writer(pg_url, keyed, sink, query_id=None, run="run-a")
    parts: list[PartitionOutcome | None] = [first.write(0, range(0, 5), 0)]
    with first.committer() as committer:  # decided, then the commit fails
        gids = [o.gid for o in parts if o is not None and o.gid]
        committer.backend.bind(sink, Binding("load"))
        committer.backend.insert_decision(NewDecision(sink, 0, gids, 5, None, first.run))
    second = Writer(pg_url, keyed, sink, query_id=None, run="run-b")
    skipped = [second.write(0, range(100, 105), 0)]  # its task: decided, skips
    with pytest.raises(FencedError) as fenced:
        first.abort(0, parts)
    assert str(fenced.value) == (
        f"sink {sink!r}: run run-a was superseded by run run-b: another load of this sinkId "
        "started after this one, so this load stops. Its batch was decided before, so its "
        "rows are committed all the same (by the other load's commit, or by sqlsink "
        f"recover --sink-id {sink}). Fix: loads of different data need different sinkIds; a re-run "
        "of the same load waits for the other one to finish, then runs again (and writes "
        "nothing if that one committed)"
    )
    second.commit(0, skipped)
    assert ids_of(pg_url, keyed) == list(range(5))
    assert prepared_of(pg_url, sink) == []


def test_a_superseded_run_never_becomes_the_newest_again(
    pg_url: str, keyed: str, sink: str
) -> None:
    first = Writer(pg_url, keyed, sink, query_id="q", run="run-a")
    first.batch(0, range(5))
    Writer(pg_url, keyed, sink, query_id="q", run="run-b").batch(1, range(5, 10))
    with pytest.raises(FencedError, match="superseded by run run-b"):
        first.write(2, range(10, 15))
    assert ids_of(pg_url, keyed) == list(range(10))


DRIVER = "0123456789abcdef0123456789abcdef"  # driver_token(sink): one JVM, one sink id


def checkpoint_of(path: Path, query_id: str | None) -> Path:
    """A checkpoint directory whose metadata names ``query_id`` (None: no metadata)."""
    path.mkdir(parents=True)
    if query_id is not None:
        (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return path


def spark_abort(writer: Writer, checkpoint: Path, batch: int, messages: int = 1) -> None:
    """What Spark's commit/abort worker (pyspark's python_streaming_sink_runner) does
    when every task of a stream's batch failed or still ran: ``streamWriter()`` of the
    query's data source, then ``abort([None, ...], batch)``. The driver token is the
    one thing set by hand: this process has no JVM ancestor."""
    from pyspark.sql.types import LongType, StructField, StructType

    from sqlsink.spark.datasource import SqlsinkDataSource

    options = {
        "url": writer.url,
        "table": writer.table,
        "sinkId": writer.sink,
        "checkpointLocation": str(checkpoint),
        **writer.extra,
    }
    source = SqlsinkDataSource(options)
    stream = source.streamWriter(StructType([StructField("id", LongType())]), False)
    stream.writer_token = DRIVER
    stream.abort([None] * messages, batch)


def task_token(query_id: str) -> str | None:
    """The token a stream's task of this driver records (SqlsinkStreamWriter._write)."""
    return run_token(DRIVER, query_id)


def runs_aborted(url: str, sink: str) -> list[tuple[str, int | None]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT run_id, aborted_batch FROM sqlsink.runs WHERE sink_id = %s ORDER BY first_seen",
            (sink,),
        ).fetchall()
    return [(str(r), None if b is None else int(b)) for r, b in rows]


def test_a_refused_queries_abort_leaves_the_first_querys_batch_alone(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 8; review 2026-11-26 R1. A second query (another checkpoint, the same
    sinkId) in the same driver is refused; Spark aborts its batch with no message, and
    the abort found "its" run by the driver's token, shared by every query of that
    driver: the first query's. It marked that run aborted and rolled back its in-flight
    batch. The abort here is Spark's own call (no run id, no message), and the token
    the first query's tasks recorded is what the data source's tasks record."""
    first = Writer(pg_url, keyed, sink, query_id="query-A", token=task_token("query-A"))
    first.batch(0, range(5))
    in_flight = [first.write(1, range(5, 10), 0), first.write(1, range(10, 15), 1)]
    second = Writer(pg_url, keyed, sink, query_id="query-B", token=task_token("query-B"))
    with pytest.raises(SinkBindingError):
        second.write(7, range(100, 105))  # its checkpoint is at batch 7
    caplog.set_level(logging.WARNING, logger="sqlsink")
    spark_abort(second, checkpoint_of(tmp_path / "chk-b", "query-B"), 7, messages=2)
    assert prepared_of(pg_url, sink) == sorted(o.gid for o in in_flight if o.gid)
    assert runs_aborted(pg_url, sink) == [(first.run, None)]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "batch 7 aborted before any task reported; no run of streaming query " in warned
    assert "query-B registered from this driver" in warned and "touches nothing" in warned
    assert f"sqlsink recover --sink-id {sink}" in warned
    first.commit(1, in_flight)
    assert ids_of(pg_url, keyed) == list(range(15))
    assert prepared_of(pg_url, sink) == []


def test_an_abort_that_cannot_name_its_query_touches_nothing(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review 2026-11-26 R1 (its r11): the arguments the data source's abort passed,
    run_id None, no query id, all-None messages and the driver's token, found the
    owner's run and rolled back its batch. An abort that cannot name its query cannot
    prove which run of the driver is its own: it touches nothing, and says what stays
    prepared and who resolves it. Both at the core (those very arguments) and through
    the data source with a checkpoint whose metadata it cannot read."""
    owner = Writer(pg_url, keyed, sink, query_id="query-A", token=task_token("query-A"))
    owner.batch(0, range(5))
    in_flight = [owner.write(1, range(5, 10))]
    caplog.set_level(logging.WARNING, logger="sqlsink")
    with owner.committer() as committer:
        report = committer.abort_batch(
            7, [None], run_id=None, query_id=None, load=False, writer_token=task_token("query-A")
        )
    assert report.rolled_back == []
    spark_abort(owner, checkpoint_of(tmp_path / "chk-unreadable", None), 7)
    assert prepared_of(pg_url, sink) == [in_flight[0].gid]
    assert runs_aborted(pg_url, sink) == [(owner.run, None)]
    warned = [r.getMessage() for r in caplog.records]
    assert (
        "its streaming query is unknown (no run can be proved its own), so this abort" in warned[0]
    )
    assert "stays prepared until the query starts again" in warned[0]
    assert "cannot tell its streaming query" in warned[1]
    assert f"{tmp_path / 'chk-unreadable'}/metadata is not readable from the driver" in warned[1]
    assert f"sqlsink recover --sink-id {sink}" in warned[1]
    owner.commit(1, in_flight)
    assert ids_of(pg_url, keyed) == list(range(10))
    assert prepared_of(pg_url, sink) == []


def test_an_abort_without_any_task_result_acts_on_nothing(
    pg_url: str, keyed: str, sink: str
) -> None:
    first = Writer(pg_url, keyed, sink, query_id="q1")
    in_flight = [first.write(0, range(5))]
    report = Writer(pg_url, keyed, sink, query_id="q1").abort(0, [None], run=None)
    assert report.rolled_back == []
    first.commit(0, in_flight)
    assert ids_of(pg_url, keyed) == list(range(5))


def test_a_retry_after_a_failure_past_prepare_makes_progress(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 10: the retry waited on its own earlier attempt's row locks until lockTimeout,
    and the error blamed "another partition"."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra={"lockTimeout": "2s"})
    faults = tmp_path / "faults.json"
    failure = {"point": "after_prepare", "batch": 3, "attempt": 0, "action": "raise"}
    faults.write_text(json.dumps([failure]))
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    with pytest.raises(RuntimeError, match="injected fault"):  # attempt 0 prepared, then died
        write_partition(writer.options, writer.target(), writer.task(3, 0, 0), rows(range(5)))
    left = prepared_of(pg_url, sink)
    assert len(left) == 1
    retry = write_partition(writer.options, writer.target(), writer.task(3, 0, 1), rows(range(5)))
    assert retry.gid == left[0] and retry.rows == 5  # the prepared attempt is adopted
    writer.commit(3, [retry])
    assert ids_of(pg_url, keyed) == list(range(5))
    assert prepared_of(pg_url, sink) == []


def test_a_speculative_pair_never_fails_the_decision(pg_url: str, keyed: str, sink: str) -> None:
    """Both attempts reach PREPARE in either order; Spark commits either one's message."""
    writer = Writer(pg_url, keyed, sink, query_id="q")
    for chosen in (0, 1):
        batch = 10 + chosen
        ids = range(batch * 10, batch * 10 + 5)
        original = write_partition(
            writer.options, writer.target(), writer.task(batch, 0, 0), rows(ids)
        )
        copy = write_partition(writer.options, writer.target(), writer.task(batch, 0, 1), rows(ids))
        assert original.gid == copy.gid  # the copy adopted the prepared original
        writer.commit(batch, [(original, copy)[chosen]])
    assert ids_of(pg_url, keyed) == [*range(100, 105), *range(110, 115)]
    assert prepared_of(pg_url, sink) == []


def test_a_task_that_prepares_after_its_batch_was_aborted_rolls_itself_back(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 16: after query.stop() a late task stayed prepared (forever, for a retired
    query): abort's sweep had run before its PREPARE."""
    writer = Writer(pg_url, keyed, sink, query_id="q")
    writer.batch(0, range(5))
    writer.abort(1, [None])  # the query stops while a task of batch 1 still runs ...
    with pytest.raises(TransientError, match="batch 1 was aborted"):
        writer.write(1, range(5, 10))  # ... and reaches PREPARE afterwards
    assert prepared_of(pg_url, sink) == []
    assert ids_of(pg_url, keyed) == list(range(5))


def test_a_lock_timeout_names_the_prepared_transaction_and_how_to_resolve_it(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Items 10 and 11: a sink whose checkpoint was deleted gets a new sink id; the old
    sink's leftover holds the keys, and the new sink waited on it forever."""
    old = Writer(pg_url, keyed, sink, query_id="q-old")
    leftover: PartitionOutcome = old.write(0, range(5))  # the old query died before commit
    fresh = new_sink()
    try:
        new = Writer(pg_url, keyed, fresh, query_id="q-new", extra={"lockTimeout": "1s"})
        with pytest.raises(TransientError) as timed_out:
            new.write(0, range(5))
        message = str(timed_out.value)
        assert f"prepared transaction {leftover.gid}" in message
        assert f"sqlsink recover --sink-id {sink}" in message
        assert "another partition" not in message
        assert prepared_of(pg_url, fresh) == []
    finally:
        forget_sink(pg_url, fresh)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"ROLLBACK PREPARED '{leftover.gid}'")


KILLED_TASK = """\
import sys
from tests.pg.protocol import Writer
url, table, sink, query_id, run = sys.argv[1:6]
Writer(url, table, sink, query_id=query_id, run=run).write(1, range(5, 10))
"""


def test_a_task_killed_between_its_prepare_and_its_own_check_is_rolled_back_by_the_abort(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A failing job's abort() and Spark's kill of the stage's other tasks race: a task
    still loading when abort's sweep read the prepared transactions PREPAREs afterwards,
    and Spark's kill (spark.python.task.killTimeout) ends its Python worker before its
    own check after PREPARE (test_a_task_that_prepares_after...) can roll it back. Its
    transaction stayed prepared, holding its row locks and a slot, until the next run
    or a recover. The abort waits for the batch's task sessions to end, then sweeps
    again."""
    writer = Writer(pg_url, keyed, sink, query_id="q")
    writer.batch(0, range(5))
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps(
            [
                {"point": "mid_copy", "batch": 1, "action": "sleep", "seconds": 3},
                {"point": "after_prepare", "batch": 1, "action": "kill"},
            ]
        )
    )
    task = subprocess.Popen(
        [sys.executable, "-c", KILLED_TASK, pg_url, keyed, sink, "q", writer.run],
        cwd=REPO,
        env={**os.environ, FAULTS_ENV: str(faults)},
        start_new_session=True,  # the kill fault kills its own session: this process only
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        fired = Path(f"{faults}.fired")
        deadline = time.monotonic() + 60
        while not fired.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fired.exists(), "the task never reached mid-COPY"
        report = writer.abort(1, [None])  # the job failed while the task still loads ...
        task.wait(timeout=60)  # ... which then prepared, and was killed before its check
    finally:
        if task.poll() is None:
            task.kill()
            task.wait()
    assert task.returncode == -signal.SIGKILL, task.stderr.read() if task.stderr else ""
    points = [json.loads(line)["point"] for line in fired.read_text().splitlines()]
    assert points == ["mid_copy", "after_prepare"]
    assert prepared_of(pg_url, sink) == []
    assert len(report.rolled_back) == 1 and "_1_0_" in report.rolled_back[0]
    assert ids_of(pg_url, keyed) == list(range(5))


def test_an_abort_no_task_reported_to_finds_its_run_by_the_drivers_token(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """Spark aborts a failed job's batch with the messages of the tasks that finished:
    none, when the others failed and one still ran. A stream's run id is only in its
    tasks' local properties, so the abort did nothing ("its run is unknown"): the task
    that prepared stayed prepared, its run live, for runTimeout (and item 16's late
    task, which needs the batch marked aborted, with it). The tasks record their
    driver's token with their run (with their query id); the abort reads its query id
    from its checkpoint and finds the run by it."""
    writer = Writer(pg_url, keyed, sink, query_id="q", token=task_token("q"))
    writer.batch(0, range(5))
    in_flight = writer.write(1, range(5, 10))  # prepared; its message never reached Spark
    assert prepared_of(pg_url, sink) == [in_flight.gid]
    spark_abort(writer, checkpoint_of(tmp_path / "chk", "q"), 1)  # no message, no run id
    assert prepared_of(pg_url, sink) == []
    assert runs_aborted(pg_url, sink) == [(writer.run, 1)]
    with pytest.raises(TransientError, match="batch 1 was aborted"):
        writer.write(1, range(10, 15), partition=1)  # a late task of it rolls itself back
    assert prepared_of(pg_url, sink) == []
    assert ids_of(pg_url, keyed) == list(range(5))


def test_a_zombie_drivers_abort_without_messages_leaves_the_new_runs_batch_alone(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Its token finds its own run, fenced by the new driver's: it touches nothing."""
    zombie = Writer(pg_url, keyed, sink, query_id="q", run="run-a", token="driver-a")
    zombie.batch(0, range(5))
    new = Writer(pg_url, keyed, sink, query_id="q", run="run-b", token="driver-b")
    in_flight = [new.write(1, range(5, 10))]
    with pytest.raises(FencedError, match="superseded by run run-b"):
        zombie.abort(1, [None], run=None)
    assert prepared_of(pg_url, sink) == [in_flight[0].gid]
    new.commit(1, in_flight)
    assert ids_of(pg_url, keyed) == list(range(10))
    assert prepared_of(pg_url, sink) == []
