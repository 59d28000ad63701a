"""The foreachBatch writer end to end, in the shared SparkSession against a real PostgreSQL."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import sqlsink
from sqlsink.core.gid import Gid
from sqlsink.embedded import EmbeddedPostgres
from sqlsink.errors import ConfigError, SinkBindingError
from sqlsink.spark.identity import PROCESS_RUNS
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.fb_windows import WINDOWS, TwoTables, killed_at, restarted
from tests.spark.streams import SCHEMA, decided_batches, run_foreach_batch, table_ids, write_source

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]


def stream(spark: Any, source: Path, checkpoint: Path, function: Any) -> Any:
    """Run a foreachBatch query over ``source`` (two round-robin partitions) until drained;
    raise its error if it failed."""
    return run_foreach_batch(spark, source, checkpoint, function, partitions=2)


def sink_prepared(server: PgServer) -> list[str]:
    return [gid for gid, _ in prepared_transactions(server.admin_url)]


def test_stream_writes_every_record_once_under_spark_identity(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}", createTable="true")
    write_source(tmp_path / "src", [range(0, 40), range(40, 90), range(90, 100)])
    query = stream(spark, tmp_path / "src", tmp_path / "chk", writer.to(table))
    assert table_ids(pg_url, table) == list(range(100))
    assert decided_batches(pg_url, writer.sink_id) == {0: True, 1: True, 2: True}
    assert sink_prepared(pg_server) == []
    with psycopg.connect(pg_url) as conn:
        bound = conn.execute(
            "SELECT query_id FROM sqlsink.sinks WHERE sink_id = %s", (writer.sink_id,)
        ).fetchall()
        runs = conn.execute(
            "SELECT run_id, checkpoint_location FROM sqlsink.runs WHERE sink_id = %s",
            (writer.sink_id,),
        ).fetchall()
    # the identity is Spark's own: the query's id, its run id, its checkpoint
    assert bound == [(str(query.id),)]
    assert [r[0] for r in runs] == [str(query.runId)]
    assert runs[0][1] is not None and "chk" in runs[0][1]


def test_replay_of_a_batch_id_writes_nothing_twice(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}", createTable="true")
    write_source(tmp_path / "src", [range(0, 30), range(30, 60)])
    stream(spark, tmp_path / "src", tmp_path / "chk", writer.to(table))
    for name in ("1", ".1.crc"):  # as if the driver died after the commit, before commits/1
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    query = stream(spark, tmp_path / "src", tmp_path / "chk", writer.to(table))
    assert [p["batchId"] for p in query.recentProgress] == [1]  # Spark did run batch 1 again
    assert table_ids(pg_url, table) == list(range(60))
    assert sink_prepared(pg_server) == []


def test_direct_calls_with_a_given_query_id_replay_once(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """Outside a stream (or where Spark's local properties are hidden), query_id= names
    the writer; the run identity is then the writer object's own."""
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", query_id="given-query", createTable="true"
    )
    write = writer.to(table)
    df = spark.range(0, 25).repartition(3)
    write(df, 0)
    with pytest.raises(ConfigError, match="batch 0 was already decided by this very run"):
        write(df, 0)  # the same batch id again, same run: a second write, not a replay
    write(spark.range(25, 30), 1)
    first_run = writer.process_run_id("given-query")
    PROCESS_RUNS.clear()  # as in a new process: a new run
    again = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=writer.sink_id, query_id="given-query")
    again.to(table)(spark.range(25, 30), 1)  # another process, another run: a replay
    assert table_ids(pg_url, table) == list(range(30))
    assert sink_prepared(pg_server) == []
    with psycopg.connect(pg_url) as conn:
        runs = conn.execute(
            "SELECT run_id FROM sqlsink.runs WHERE sink_id = %s", (writer.sink_id,)
        ).fetchall()
    assert sorted(runs) == sorted([(first_run,), (again.process_run_id("given-query"),)])
    with pytest.raises(Exception, match="already decided"):  # forward only: 0 is behind 1
        write(spark.range(100, 105), 0)


def test_task_failing_after_prepare_commits_exactly_once(
    spark: Any, tmp_path: Path, pg_url: str, table: str, faults: Any, pg_server: PgServer
) -> None:
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}", createTable="true")
    write_source(tmp_path / "src", [range(0, 20), range(20, 40)])
    faults(
        [{"point": "after_prepare", "batch": 1, "partition": 0, "attempt": 0, "action": "raise"}]
    )
    stream(spark, tmp_path / "src", tmp_path / "chk", writer.to(table))
    assert [(f["batch"], f["partition"]) for f in faults.fired()] == [(1, 0)]
    assert table_ids(pg_url, table) == list(range(40))
    assert sink_prepared(pg_server) == []
    with psycopg.connect(pg_url) as conn:
        (gids,) = conn.execute(
            "SELECT gids FROM sqlsink.decisions WHERE sink_id = %s AND batch_id = 1",
            (writer.sink_id,),
        ).fetchone()
    assert len(gids) == 2  # the retry adopted the first attempt's transaction


@pytest.mark.crash
@pytest.mark.parametrize("point", list(WINDOWS))
def test_killed_in_a_window_then_restarted_holds_both_tables_exactly_once(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, point: str
) -> None:
    """The driver SIGKILLed before the decision, between the two COMMIT PREPAREDs of a
    two-table batch (one table has it, the other's transaction is prepared), and after
    the commit before Spark's commits/1; the restart (the shared session) recovers or
    replays: both tables hold every record once, nothing is left prepared."""
    from tests.spark.foreach_batch_driver import run, two_tables

    tables = TwoTables.create(pg_url, pg_server.admin_url, uuid.uuid4().hex[:10], tmp_path)
    try:
        killed_at(tables, point, sys.executable, tmp_path)
        function = two_tables(pg_url, tables.sink_id, tables.orders, tables.lines)
        run(spark, tables.source, tables.checkpoint, function)
        restarted(tables)
    finally:
        tables.drop()


def test_gids_of_a_two_table_batch_carry_their_part(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", query_id="parts-query", createTable="true"
    )
    with writer.batch(0) as b:
        b.append(spark.range(0, 4).coalesce(1), table)
        b.append(spark.range(4, 8).coalesce(1), table)
    assert table_ids(pg_url, table) == list(range(8))
    with psycopg.connect(pg_url) as conn:
        (gids,) = conn.execute(
            "SELECT gids FROM sqlsink.decisions WHERE sink_id = %s", (writer.sink_id,)
        ).fetchone()
    parsed = sorted((g.part, g.partition_id) for g in map(Gid.parse, gids) if g is not None)
    assert parsed == [(0, 0), (1, 0)]


def test_a_failing_part_aborts_the_whole_batch(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", query_id="abort-query", createTable="true"
    )
    with pytest.raises(RuntimeError, match="the job's own error"), writer.batch(0) as b:
        b.append(spark.range(0, 4), table)
        raise RuntimeError("the job's own error")
    assert table_ids(pg_url, table) == []
    assert sink_prepared(pg_server) == []
    assert decided_batches(pg_url, writer.sink_id) == {}
    # retried in the same process (no Spark run id here): a new run, and it commits
    writer.to(table)(spark.range(0, 4), 0)
    assert table_ids(pg_url, table) == [0, 1, 2, 3]


def test_no_identity_is_refused(spark: Any, pg_url: str, table: str) -> None:
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")
    with pytest.raises(ConfigError, match=r"no streaming query id.*query_id="):
        writer.to(table)(spark.range(3), 0)


def test_two_writers_on_one_sink_id_are_refused(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    sink_id = f"fb-{table[2:]}"
    first = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id, createTable="true")
    write_source(tmp_path / "src", [range(0, 10)])
    stream(spark, tmp_path / "src", tmp_path / "chk-a", first.to(table))
    second = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id, createTable="true")
    with pytest.raises(Exception, match="is bound to streaming query"):
        stream(spark, tmp_path / "src", tmp_path / "chk-b", second.to(table))
    with pytest.raises(SinkBindingError):
        sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id, query_id="other").to(table)(
            spark.range(3), 1
        )
    assert table_ids(pg_url, table) == list(range(10))


def test_options_are_checked_when_the_writer_is_made(pg_url: str) -> None:
    with pytest.raises(ConfigError, match="unknown option 'tabel'"):
        sqlsink.ForeachBatchWriter(url=pg_url, sink_id="x", tabel="t")
    with pytest.raises(ConfigError, match="not an option here"):
        sqlsink.ForeachBatchWriter(url=pg_url, sink_id="x", table="t")
    with pytest.raises(ConfigError, match="checkpoint_location="):
        sqlsink.ForeachBatchWriter(url=pg_url, sink_id="x", checkpointLocation="/c")
    with pytest.raises(ConfigError, match="invalid sinkId"):
        sqlsink.ForeachBatchWriter(url=pg_url, sink_id="a_b")


def test_update_mode_example_with_a_replay(spark: Any, pg_url: str, tmp_path: Path) -> None:
    from examples import foreach_batch_counts

    verdict = foreach_batch_counts.run(spark, pg_url, tmp_path)
    assert verdict == {
        "batches_run_1": 3,
        "totals_right_after_run_1": True,
        "replayed_batch": 2,
        "replayed_input_rows": 20,  # Spark did run batch 2 again...
        "rows_rewritten_by_replay": [],  # ...and the writer wrote nothing
        "pages_expected": 4,
        "pages_found": 4,
        "wrong_totals": [],
        "prepared_left": 0,
        "ok": True,
    }


def test_a_wrong_batch_id_or_query_id_inside_foreach_batch_is_refused(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}", createTable="true")
    wrong = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}", query_id="nope")
    errors: list[str] = []

    def write(batch_df: Any, batch_id: int) -> None:
        for call in (
            lambda: writer.to(table)(batch_df, batch_id + 1),
            lambda: wrong.to(table)(batch_df, batch_id),
        ):
            try:
                call()
            except ConfigError as exc:
                errors.append(str(exc))
        writer.to(table)(batch_df, batch_id)

    write_source(tmp_path / "src", [range(0, 10)])
    stream(spark, tmp_path / "src", tmp_path / "chk", write)
    assert len(errors) == 2
    assert "called with batch id 1, but Spark is running batch 0" in errors[0]
    assert "query_id='nope' was given" in errors[1]
    assert table_ids(pg_url, table) == list(range(10))


@pytest.fixture(scope="module")
def four_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with only four prepared-transaction slots."""
    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("slots")), settings={"max_prepared_transactions": 4}
    )
    with server:
        yield server.url()


def test_a_batch_with_more_partitions_than_slots_is_refused_before_writing(
    spark: Any, four_slots: str
) -> None:
    """Issue 12 item 12: the foreachBatch writer knows the partition count before the
    tasks run, so a batch that could never commit is refused before any slot is taken."""
    writer = sqlsink.ForeachBatchWriter(
        url=four_slots, sink_id="fb-slots", query_id="q-slots", createTable="true"
    )
    write = writer.to("slots")
    write(spark.range(0, 12).repartition(3), 0)  # 3 partitions: fits
    again = sqlsink.ForeachBatchWriter(url=four_slots, sink_id="fb-slots", query_id="q-slots")
    with pytest.raises(ConfigError) as refused, again.batch(1) as batch:  # batch inside: aborts
        batch.append(spark.range(100, 112).repartition(3), "slots")
        batch.append(spark.range(200, 212).repartition(2), "slots")  # 5 in all: too many
    message = str(refused.value)
    assert message.startswith(
        "batch 1: 5 partitions planned (this DataFrame's 2, after 3 of the batch's earlier "
        "DataFrames), nothing written:"
    )
    assert "max_prepared_transactions = 4 is fewer than the 5 partitions" in message
    assert "batch_df.coalesce(n)" in message
    assert table_ids(four_slots, "slots") == list(range(12))
    with psycopg.connect(four_slots, autocommit=True) as conn:
        left = conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
    assert left == []


def test_a_shuffled_input_is_computed_once(spark: Any, pg_url: str, table: str) -> None:
    """A DataFrame after repartition(n), as a stream's batch often is: the writer needs its
    partition count before the write. Asking Spark's RDD for it ran the shuffle's stage (an
    adaptive plan builds its RDD by running it), and the write then ran it again: a UDF
    before the shuffle counted each row twice. Now the count is read from the plan and
    every row is computed once; the slot check still knows the batch's 3 partitions."""
    from pyspark.sql import functions as F

    computed = spark.sparkContext.accumulator(0)
    # a lambda: PySpark reads a def's type hints as an Arrow UDF's
    counted = F.udf(lambda value: (computed.add(1), value)[1], "bigint")
    frame = spark.range(0, 3000, 1, 4).select(counted("id").alias("id")).repartition(3)
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", query_id="q-once", createTable="true"
    )
    with writer.batch(0) as batch:
        batch.append(frame, table)
        assert batch.planned == 3
    assert table_ids(pg_url, table) == list(range(3000))
    assert computed.value == 3000


def test_complete_mode_replaces_the_table_with_each_batch_and_replays_nothing(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """Complete output mode through mode="replace": after every batch the table is the
    aggregation's whole result (not the sum of batches); a replay of the last batch id
    rewrites nothing; an empty result empties the table (one partition, still prepared)."""
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (bucket bigint PRIMARY KEY, n bigint)").format(
                sql.Identifier(table)
            )
        )
    write_source(tmp_path / "src", [range(0, 40), range(40, 90), range(90, 100)])
    events = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "src"))
    )
    counts = events.groupBy((events.id % 4).alias("bucket")).count().withColumnRenamed("count", "n")
    function = writer.to(table, mode="replace")
    seen: list[int] = []

    def write(batch_df: Any, batch_id: int) -> None:
        seen.append(batch_id)
        function(batch_df, batch_id)

    query = (
        counts.writeStream.foreachBatch(write)
        .outputMode("complete")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    assert seen == [0, 1, 2]

    def stored() -> list[tuple[int, int]]:
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(
                sql.SQL("SELECT bucket, n, xmin::text FROM {} ORDER BY bucket").format(
                    sql.Identifier(table)
                )
            ).fetchall()
        return [(int(b), int(n), str(x)) for b, n, x in rows]

    after = stored()
    assert [(b, n) for b, n, _ in after] == [(0, 25), (1, 25), (2, 25), (3, 25)]
    assert len({x for _, _, x in after}) == 1  # one transaction wrote the whole result
    # outside the query, the writer knows the query from its checkpoint (its metadata file)
    function = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=writer.sink_id, checkpoint_location=str(tmp_path / "chk")
    ).to(table, mode="replace")
    # a replay of batch 2 (same id, other rows) writes nothing
    function(spark.createDataFrame([(9, 9)], "bucket bigint, n bigint"), 2)
    assert stored() == after
    # an empty result in the next batch empties the table
    function(spark.createDataFrame([], "bucket bigint, n bigint"), 3)
    assert stored() == []
    assert decided_batches(pg_url, writer.sink_id) == {0: True, 1: True, 2: True, 3: True}
    assert sink_prepared(pg_server) == []


def test_replace_is_refused_by_the_data_source(spark: Any, pg_url: str, table: str) -> None:
    with pytest.raises(Exception, match=r"mode=replace is the foreachBatch writer's"):
        (
            spark.range(3)
            .write.format("sqlsink")
            .option("url", pg_url)
            .option("table", table)
            .option("mode", "replace")
            .mode("append")
            .save()
        )


@pytest.mark.parametrize("semantic", ["at_least_once", "none"])
def test_the_weaker_semantics_through_the_writer_commit_each_partition_alone(
    spark: Any, pg_url: str, table: str, pg_server: PgServer, semantic: str
) -> None:
    """semantic=at_least_once (or none): each partition commits on its own, nothing is
    prepared; a replayed batch id is still skipped once the batch is decided."""
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url,
        sink_id=f"fb-{table[2:]}",
        query_id="q-weak",
        createTable="true",
        semantic=semantic,
    )
    frame = spark.range(0, 50).repartition(3)
    writer.to(table)(frame, 0)
    assert table_ids(pg_url, table) == list(range(50))
    assert sink_prepared(pg_server) == []
    assert decided_batches(pg_url, writer.sink_id) == {0: True}
    PROCESS_RUNS.clear()  # as in a new process: a new run
    again = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=writer.sink_id, query_id="q-weak", semantic=semantic
    )
    again.to(table)(frame, 0)  # the same batch id again, a new run: decided, skipped
    assert table_ids(pg_url, table) == list(range(50))
