"""How a foreachBatch function hands its batches to the writer, with a real Spark stream.

A batch is written by one hand-over: a second write of a batch id in the same run (two
``to()`` calls, two ``batch()`` blocks, two writers with one sink id) is refused before
anything of it is written, where it used to be skipped as a replay (its rows lost
silently). A batch the function hands nothing (an empty ``batch()`` block,
``writer.skip``, or no call at all) is decided empty, where it used to stop the query
with a false data-loss error at the next batch, and again at every restart.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sqlsink
from sqlsink.errors import ConfigError
from sqlsink.spark.identity import PROCESS_RUNS
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

FIX = (
    "Fix: write every DataFrame of a batch in one `with writer.batch(batch_id)` block — one "
    "decision for all — or give each writer its own sink_id"
)


def decisions(url: str, sink_id: str) -> dict[int, tuple[Any, ...]]:
    """batch -> (rows, gids, complete, tables) of its decision."""
    return commit_log(
        url, sink_id, "rows", "cardinality(gids)", "completed_at IS NOT NULL", "tables"
    )


def lines_of(df: Any) -> Any:
    return df.selectExpr("id + 1000 AS id", "payload", "ts", "amount")


@pytest.fixture
def two_tables(pg_url: str, table: str) -> tuple[str, str]:
    orders, lines = table, f"{table}_lines"
    keyed_table(pg_url, orders)
    keyed_table(pg_url, lines)
    yield orders, lines
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{lines}"')


def second_writes(
    url: str, sink_id: str, orders: str, lines: str
) -> dict[str, Callable[[Any, int], None]]:
    """The three ways a function writes one batch id twice in one run."""
    writer = sqlsink.ForeachBatchWriter(url=url, sink_id=sink_id)
    to_orders, to_lines = writer.to(orders), writer.to(lines)
    other = sqlsink.ForeachBatchWriter(url=url, sink_id=sink_id)

    def two_to_calls(df: Any, batch_id: int) -> None:
        to_orders(df, batch_id)
        to_lines(lines_of(df), batch_id)

    def two_blocks(df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as b:
            b.append(df, orders)
        with writer.batch(batch_id) as b:
            b.append(lines_of(df), lines)

    def two_writers(df: Any, batch_id: int) -> None:
        writer.to(orders)(df, batch_id)
        other.to(lines)(lines_of(df), batch_id)

    return {"two to() calls": two_to_calls, "two blocks": two_blocks, "two writers": two_writers}


@pytest.mark.parametrize("way", ["two to() calls", "two blocks", "two writers"])
def test_a_second_write_of_a_batch_in_one_run_stops_the_query_before_writing(
    spark: Any,
    tmp_path: Path,
    pg_url: str,
    pg_server: PgServer,
    two_tables: tuple[str, str],
    way: str,
) -> None:
    orders, lines = two_tables
    sink_id = f"fb-{orders[2:]}"
    write_source(tmp_path / "src", [range(0, 5), range(5, 10)])
    function = second_writes(pg_url, sink_id, orders, lines)[way]
    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", function)
    text = str(stopped.value)
    print(f"{way}: the query stopped with: {text[text.find('sink ') :][:400]}")
    assert (
        f"sink {sink_id!r}: batch 0 was already decided by this very run (its decision "
        f"holds 'public.{orders}'): a second write of one batch id in one run"
    ) in text
    assert f"Nothing of 'public.{lines}' was written for batch 0. {FIX}" in text
    assert table_ids(pg_url, orders) == list(range(5))  # the first write, committed
    assert table_ids(pg_url, lines) == []  # nothing of the second
    assert prepared_in_test_db(pg_server) == []
    assert decisions(pg_url, sink_id) == {0: (5, 1, True, [f"public.{orders}"])}


def test_one_block_for_both_tables_writes_both_and_a_restart_replays_nothing(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, two_tables: tuple[str, str]
) -> None:
    """The fix the error names; and the restart's replay of a batch decided with both
    tables (a new run) is still a silent skip of both."""
    orders, lines = two_tables
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{orders[2:]}")

    def both(df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as b:
            b.append(df, orders)
            b.append(lines_of(df), lines)

    write_source(tmp_path / "src", [range(0, 5), range(5, 10)])
    run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", both)
    for name in ("1", ".1.crc"):  # as if the driver died after the commit, before commits/1
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    query = run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", both)
    assert [p["batchId"] for p in query.recentProgress] == [1]  # Spark ran batch 1 again
    assert table_ids(pg_url, orders) == list(range(10))
    assert table_ids(pg_url, lines) == list(range(1000, 1010))
    assert prepared_in_test_db(pg_server) == []
    both_tables = [f"public.{orders}", f"public.{lines}"]
    assert decisions(pg_url, writer.sink_id) == {
        0: (10, 2, True, both_tables),
        1: (10, 2, True, both_tables),
    }


def skipping_function(
    writer: sqlsink.ForeachBatchWriter, table: str, how: str
) -> Callable[[Any, int], None]:
    """A function that writes nothing for an empty micro-batch, in one of three ways."""

    def function(df: Any, batch_id: int) -> None:
        if how == "return early":
            if df.isEmpty():
                return
            with writer.batch(batch_id) as b:
                b.append(df, table)
        elif how == "empty block":
            with writer.batch(batch_id) as b:
                if not df.isEmpty():
                    b.append(df, table)
        else:  # "skip"
            if df.isEmpty():
                writer.skip(batch_id)
                return
            writer.to(table)(df, batch_id)

    return function


@pytest.mark.parametrize("how", ["return early", "empty block", "skip"])
def test_a_batch_the_function_does_not_write_is_decided_empty_and_restarts_run(
    spark: Any,
    tmp_path: Path,
    pg_url: str,
    pg_server: PgServer,
    table: str,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")
    function = skipping_function(writer, table, how)
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(0, 3), [], range(3, 6), [], [], range(6, 9)])
    caplog.set_level(logging.WARNING, logger="sqlsink")
    run_foreach_batch(spark, source, checkpoint, function)
    assert table_ids(pg_url, table) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    empty = (0, 0, True, None)
    assert decisions(pg_url, writer.sink_id) == {
        0: (3, 1, True, [f"public.{table}"]),
        1: empty,
        2: (3, 1, True, [f"public.{table}"]),
        3: empty,
        4: empty,
        5: (3, 1, True, [f"public.{table}"]),
    }
    warned = [r.getMessage() for r in caplog.records if "handed batch" in r.getMessage()]
    if how == "return early":  # the gaps, one warning each, naming them and the fix
        assert [w[w.find("handed") :].split(":")[0] for w in warned] == [
            "handed batch 2 to the writer, but not batch 1",
            "handed batch 5 to the writer, but not batches 3..4",
        ]
        assert "Fix: hand every batch to the writer, writer.batch(batch_id) or " in warned[0]
    else:
        assert warned == []
    # a restart of the query (a new run, whose first commit checks the checkpoint)
    add_source_file(source, 6, range(9, 12))
    query = run_foreach_batch(spark, source, checkpoint, function)
    assert [p["batchId"] for p in query.recentProgress] == [6]
    assert table_ids(pg_url, table) == list(range(12))
    assert sorted(decisions(pg_url, writer.sink_id)) == list(range(7))
    assert prepared_in_test_db(pg_server) == []


def test_an_empty_block_and_skip_outside_a_stream(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """Outside a stream an empty decision is for batches Spark's checkpoint records as
    committed only (an operator's skip of a batch Spark runs again would make that run
    skip its rows); a second hand-over by the same run is refused either way."""
    keyed_table(pg_url, table)
    checkpoint = tmp_path / "chk"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"q-e"}\n')
    sink_id = f"fb-{table[2:]}"
    blind = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id, query_id="q-e")
    with pytest.raises(ConfigError, match="no checkpoint_location was given"), blind.batch(0):
        pass
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=sink_id, checkpoint_location=str(checkpoint)
    )
    with pytest.raises(ConfigError, match=r"does not record batch 0 as committed"):
        writer.skip(0)
    assert commit_log(pg_url, sink_id, "rows") == {}
    for batch in (0, 1):
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    with writer.batch(0):
        pass
    writer.skip(1)
    with pytest.raises(ConfigError) as twice:  # the same run hands batch 1 again
        writer.skip(1)
    assert str(twice.value) == (
        f"sink {sink_id!r}: batch 1 was already decided by this very run (its decision "
        "holds no table (an empty batch)): a second write of one batch id in one run (two "
        "to() calls, two `with writer.batch(batch_id)` blocks, or two writers with one "
        "sink_id) finds the batch decided, and this second hand-over of the batch (an empty "
        "one) would change nothing as if it were Spark's replay. Nothing was written. "
        f"{FIX}"
    )
    writer.to(table)(spark.range(0, 3, 1, 1), 2)
    with pytest.raises(ConfigError, match="batch 2 was already decided by this very run"):
        writer.skip(2)
    with pytest.raises(ConfigError, match="batch 2 was already decided by this very run"):
        writer.to(table)(spark.range(10, 13, 1, 1), 2)
    # another writer object of the sink in this process is the same run: refused too
    other = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=sink_id, checkpoint_location=str(checkpoint)
    )
    with pytest.raises(ConfigError, match="batch 2 was already decided by this very run"):
        other.to(table)(spark.range(10, 13, 1, 1), 2)
    # a writer object in a new process (a Spark Connect restart) is a new run: its
    # hand-over of batch 2 is Spark's replay, which writes nothing
    PROCESS_RUNS.clear()  # what a new process starts with
    again = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=sink_id, checkpoint_location=str(checkpoint)
    )
    again.to(table)(spark.range(0, 3, 1, 1), 2)
    again.skip(2)
    assert table_ids(pg_url, table) == [0, 1, 2]
    assert decisions(pg_url, sink_id) == {
        0: (0, 0, True, None),
        1: (0, 0, True, None),
        2: (3, 1, True, [f"public.{table}"]),
    }
    assert prepared_in_test_db(pg_server) == []


def test_an_empty_block_without_any_identity_is_refused(
    spark: Any, pg_url: str, table: str
) -> None:
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")
    with pytest.raises(ConfigError, match=r"no streaming query id.*query_id="), writer.batch(0):
        pass
    with pytest.raises(ConfigError, match=r"no streaming query id.*query_id="):
        writer.skip(0)
    assert commit_log(pg_url, writer.sink_id, "rows") == {}


def test_a_last_batch_skipped_before_a_stop_is_skipped_afterwards_with_writer_skip(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """What the writer cannot see: the run's last batch not handed to it, then the query
    stops; the restart's first commit finds commits/1 without a decision. An operator
    who knows the batch had nothing for the sink skips it (the query stopped), and the
    restart runs."""
    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")
    function = skipping_function(writer, table, "return early")
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(0, 3), []])
    run_foreach_batch(spark, source, checkpoint, function)
    add_source_file(source, 2, range(3, 6))
    with pytest.raises(Exception, match=r"checkpoint records batch 1 as committed") as stopped:
        run_foreach_batch(spark, source, checkpoint, function)
    assert "writer.wrap(function)" in str(stopped.value)  # the way that is always safe
    assert table_ids(pg_url, table) == [0, 1, 2]
    operator = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=writer.sink_id, checkpoint_location=str(checkpoint)
    )
    operator.skip(1)
    run_foreach_batch(spark, source, checkpoint, function)
    assert table_ids(pg_url, table) == list(range(6))
    assert decisions(pg_url, writer.sink_id) == {
        0: (3, 1, True, [f"public.{table}"]),
        1: (0, 0, True, None),
        2: (3, 1, True, [f"public.{table}"]),
    }
    assert prepared_in_test_db(pg_server) == []


@pytest.mark.parametrize("group", ["nightly", "uuid"])
def test_a_job_group_set_inside_foreach_batch_is_refused_before_writing(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str, group: str
) -> None:
    """The run id is Spark's job group of the micro-batch thread: a user's setJobGroup
    inside foreachBatch replaced it by the user's string (the same at every restart: a
    restart looked like the same run). Refused before anything is written."""
    import uuid

    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")
    name = "nightly" if group == "nightly" else str(uuid.uuid4())

    def function(df: Any, batch_id: int) -> None:
        df.sparkSession.sparkContext.setJobGroup(name, "the nightly load")
        writer.to(table)(df, batch_id)

    write_source(tmp_path / "src", [range(0, 3)])
    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", function)
    text = str(stopped.value)
    print(f"{group}: the query stopped with: {text[text.find('sink ') :][:600]}")
    said = f"sink {writer.sink_id!r}: Spark's job group on this foreachBatch thread is {name!r}"
    assert said in text
    assert "Fix: don't call setJobGroup on the foreachBatch thread" in text
    assert table_ids(pg_url, table) == []
    assert decisions(pg_url, writer.sink_id) == {}
    assert prepared_in_test_db(pg_server) == []


def test_a_wrapped_function_that_returns_early_decides_its_batch_empty(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """writer.wrap(function): a batch the function returns from without handing it to the
    writer is decided empty when the function returns, so a run that stops right after
    it (its last batch, or before its first hand-over) leaves nothing for the restart to
    stop on; the same function unwrapped stops the restart with the honest error."""
    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")

    def early(df: Any, batch_id: int) -> None:
        if df.isEmpty():
            return
        writer.to(table)(df, batch_id)

    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(0, 3), []])  # the run stops right after batch 1
    run_foreach_batch(spark, source, checkpoint, writer.wrap(early))
    assert decisions(pg_url, writer.sink_id)[1] == (0, 0, True, None)
    add_source_file(source, 2, [])
    # a restart whose first batch returns early, and stops before its next: the same
    run_foreach_batch(spark, source, checkpoint, writer.wrap(early))
    add_source_file(source, 3, range(3, 6))
    add_source_file(source, 4, range(6, 9))
    query = run_foreach_batch(spark, source, checkpoint, writer.wrap(early))
    assert [p["batchId"] for p in query.recentProgress] == [3, 4]
    assert table_ids(pg_url, table) == list(range(9))
    rows = (3, 1, True, [f"public.{table}"])
    empty = (0, 0, True, None)
    assert decisions(pg_url, writer.sink_id) == {0: rows, 1: empty, 2: empty, 3: rows, 4: rows}
    assert prepared_in_test_db(pg_server) == []


def test_a_wrapped_function_that_raises_decides_nothing(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")

    def failing(df: Any, batch_id: int) -> None:
        raise ValueError("the user's code failed")

    write_source(tmp_path / "src", [range(0, 3)])
    with pytest.raises(Exception, match="the user's code failed"):
        run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", writer.wrap(failing))
    assert decisions(pg_url, writer.sink_id) == {}
    assert table_ids(pg_url, table) == []
    assert prepared_in_test_db(pg_server) == []


def off_thread_text(sink_id: str, query_id: str, batch_id: int) -> str:
    return (
        f"sink {sink_id!r}: the writer was called for batch {batch_id} on thread "
        "'pool_0', which does not carry Spark's thread-local properties "
        "(sql.streaming.queryId, spark.jobGroup.id, streaming.sql.batchId), while its "
        f"streaming query {query_id} is running in this Spark session: a thread started "
        "inside the foreachBatch function (a concurrent.futures.ThreadPoolExecutor, a "
        "threading.Thread) does not inherit them, so the writer cannot tell the query's "
        "run (it would take the call for an operator's from outside the stream). Nothing "
        f"was written for batch {batch_id}. Fix: call the writer on foreachBatch's own "
        "thread, or run the thread's target through pyspark.inheritable_thread_target "
        "(pool.submit(inheritable_thread_target(target), ...)) or a "
        "pyspark.InheritableThread; an operator's writer.skip outside the stream waits "
        "until the query is stopped"
    )


@pytest.mark.parametrize("call", ["to", "skip"])
def test_the_writer_called_on_a_plain_thread_pool_inside_foreach_batch_is_refused(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str, call: str
) -> None:
    """A plain ThreadPoolExecutor thread does not carry Spark's local properties: the
    writer took the call for an operator's outside the stream, with the process-made
    run id (the same at a restart of the query in this process: a restart after a crash
    was refused for ever as "already decided by this very run"; a skip was refused with
    the outside-the-stream text). Refused at batch 0, nothing written, nothing
    prepared."""
    from concurrent.futures import ThreadPoolExecutor

    keyed_table(pg_url, table)
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", checkpoint_location=str(checkpoint)
    )
    target = writer.to(table) if call == "to" else (lambda df, batch_id: writer.skip(batch_id))
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:

        def function(df: Any, batch_id: int) -> None:
            pool.submit(target, df, batch_id).result()

        write_source(source, [range(0, 3)])
        with pytest.raises(Exception) as stopped:
            run_foreach_batch(spark, source, checkpoint, function)
    text = str(stopped.value)
    print(f"{call}: the query stopped with: {text[text.find('sink ') :][:900]}")
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    assert off_thread_text(writer.sink_id, query_id, 0) in text
    assert table_ids(pg_url, table) == []
    with psycopg.connect(pg_url) as conn:  # refused before the schema is even made
        made = conn.execute("SELECT to_regclass('sqlsink.decisions')").fetchone()
    assert made is not None
    assert made[0] is None or decisions(pg_url, writer.sink_id) == {}
    assert prepared_in_test_db(pg_server) == []


def test_the_writer_on_an_inheritable_thread_inside_foreach_batch_writes(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """pyspark.inheritable_thread_target copies Spark's local properties to the pool
    thread: the writer knows the query's run there, and a restart replays nothing."""
    from concurrent.futures import ThreadPoolExecutor

    from pyspark import inheritable_thread_target

    keyed_table(pg_url, table)
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", checkpoint_location=str(checkpoint)
    )
    with ThreadPoolExecutor(1) as pool:

        def function(df: Any, batch_id: int) -> None:
            with warnings.catch_warnings():  # PySpark 4 warns that job tags are not copied
                warnings.simplefilter("ignore", UserWarning)
                target = inheritable_thread_target(writer.to(table))
            pool.submit(target, df, batch_id).result()

        write_source(source, [range(0, 3)])
        run_foreach_batch(spark, source, checkpoint, function)
        add_source_file(source, 1, range(3, 6))
        run_foreach_batch(spark, source, checkpoint, function)
    assert table_ids(pg_url, table) == list(range(6))
    rows = (3, 1, True, [f"public.{table}"])
    assert decisions(pg_url, writer.sink_id) == {0: rows, 1: rows}


def test_a_failed_write_the_function_swallowed_stops_the_next_batch_of_the_run(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """A function (not wrapped) catches the writer's error of batch 0 and returns: Spark
    records batch 0 committed. A fresh sink's first batch is not behind any decided one,
    so the checkpoint check sees nothing: the run's next hand-over refuses, naming batch
    0 (it used to write batch 1 and lose batch 0's rows silently)."""
    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(0, 5), range(5, 10)])

    def swallowing(df: Any, batch_id: int) -> None:
        try:
            with writer.batch(batch_id) as b:
                b.append(df, table)
                if batch_id == 0:
                    raise RuntimeError("a transient failure inside batch 0")
        except RuntimeError:
            pass  # "keep the stream alive"

    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, source, checkpoint, swallowing)
    text = str(stopped.value)
    print(f"the query stopped with: {text[text.find('sink ') :][:600]}")
    assert (
        f"data loss: sink {sink_id!r}: this run's write of batch 0 failed (it was aborted, "
        "nothing of it is committed), but the foreachBatch function returned normally"
    ) in text
    assert "Nothing of batch 1 was written" in text
    assert "--mark-skipped 0" in text
    assert table_ids(pg_url, table) == []
    assert decisions(pg_url, sink_id) == {}
    assert prepared_in_test_db(pg_server) == []


def test_a_wrapped_function_that_swallows_a_failed_write_stops_the_query(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str
) -> None:
    """``wrap(f)``, ``f`` catches the writer's error of a fresh sink's first batch: the
    wrapper used to return (the batch handed over), Spark recorded batch 0 committed and
    its rows were lost silently. Now the wrapper raises, and the restart writes batch 0."""
    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    source, checkpoint, flag = tmp_path / "src", tmp_path / "chk", tmp_path / "flag"
    write_source(source, [range(0, 5), range(5, 10)])
    flag.touch()

    def swallowing(df: Any, batch_id: int) -> None:
        try:
            with writer.batch(batch_id) as b:
                b.append(df, table)
                if batch_id == 0 and flag.exists():
                    flag.unlink()
                    raise RuntimeError("a transient failure inside batch 0")
        except RuntimeError:
            pass  # "keep the stream alive"

    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, source, checkpoint, writer.wrap(swallowing))
    text = str(stopped.value)
    print(f"the query stopped with: {text[text.find('sink ') :][:500]}")
    assert (
        f"sink {sink_id!r}: the foreachBatch function returned normally although the "
        "writer's write of batch 0 failed (RuntimeError: a transient failure inside batch 0)"
    ) in text
    assert table_ids(pg_url, table) == []
    assert prepared_in_test_db(pg_server) == []
    run_foreach_batch(spark, source, checkpoint, writer.wrap(swallowing))  # the restart
    assert table_ids(pg_url, table) == list(range(10))
    assert prepared_in_test_db(pg_server) == []
