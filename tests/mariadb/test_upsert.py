"""mode=upsert on a real MariaDB (sqlsink/mariadb/upsert.py through partition.py): the
last row of a key in the partition wins, deleteColumn removes a key, every value of the
type table round-trips, a retry and a replay change nothing, bad input leaves nothing
visible or prepared, and a task killed after XA PREPARE is adopted: the exact table.

Run as a module, it is a partition task of its own (the crash test SIGKILLs it):
    python -m tests.mariadb.test_upsert '{"url":..,"table":..,"sink":..,"run":..,...}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sqlsink.core.model import PartitionOutcome, TaskIdentity
from sqlsink.errors import WriteError
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.partition import LoadTarget, write_partition
from sqlsink.mariadb.schema import ensure_schema
from sqlsink.mariadb.upsert import UpsertPlan
from tests.fix_mariadb import MariaServer
from tests.mariadb.protocol import Writer, forget_sink, make_table, new_sink, prepared_of
from tests.mariadb.test_partition import TYPES, typed_batch, with_nulls

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = "id bigint PRIMARY KEY, v varchar(20) NOT NULL, note varchar(20) DEFAULT 'kept'"
FLAG = "gone"


@dataclass
class Upserter(Writer):
    """A Writer whose tasks upsert by ``id``, with the delete flag ``gone``."""

    delete_column: str | None = FLAG

    @property
    def target(self) -> LoadTarget:
        plan = UpsertPlan(("id",), self.delete_column)
        return LoadTarget(
            self.url, self.table, self.lock_timeout_s, run_timeout_s=self.live_s, upsert=plan
        )


def rows_of(ids: list[int], values: list[str], gone: list[bool] | None = None) -> pa.RecordBatch:
    data: dict[str, Any] = {"id": pa.array(ids, pa.int64()), "v": pa.array(values)}
    if gone is not None:
        data[FLAG] = pa.array(gone, pa.bool_())
    return pa.RecordBatch.from_pydict(data)


def table_of(url: str, table: str) -> list[tuple[Any, ...]]:
    conn = connect(url)
    try:
        return rows(conn, f"SELECT id, v, note FROM `{table}` ORDER BY id")
    finally:
        conn.close()


@pytest.fixture
def writer(mariadb_server: MariaServer) -> Iterator[Upserter]:
    url = mariadb_server.url()
    w = Upserter(url, f"u_{uuid.uuid4().hex[:8]}", new_sink())
    make_table(url, w.table, COLUMNS)
    conn = connect(url)
    try:  # rows before the batch: 1 and 2 are updated, 3 deleted, 4 untouched
        execute(conn, f"INSERT INTO `{w.table}` VALUES (1,'old1','n1'), (2,'old2','n2'), "
                      f"(3,'old3','n3'), (4,'old4','n4')")  # fmt: skip
    finally:
        conn.close()
    yield w
    forget_sink(url, w.sink)


BEFORE = [(1, "old1", "n1"), (2, "old2", "n2"), (3, "old3", "n3"), (4, "old4", "n4")]
# two record batches of one partition: the last row of each key decides, across them
PARTITION = [
    rows_of([1, 5, 3, 6, 7], ["a1", "a5", "a3", "a6", "a7"], [False, False, False, False, True]),
    rows_of([5, 1, 3, 2, 6, 7, 5], ["b5", "b1", "b3", "b2", "b6", "b7", "c5"],
            [False, False, True, False, True, False, False]),
]  # fmt: skip
AFTER = [(1, "b1", "n1"), (2, "b2", "n2"), (4, "old4", "n4"), (5, "c5", "kept"), (7, "b7", "kept")]


def test_last_row_of_a_key_wins_and_the_delete_flag_removes_a_key(writer: Upserter) -> None:
    outcome = writer.write(0, PARTITION)
    assert outcome.rows == 12  # the rows sent, as PostgreSQL's counts them
    assert table_of(writer.url, writer.table) == BEFORE  # prepared: not visible yet
    writer.commit(0, [outcome])
    # 1, 2 updated (note kept: ON DUPLICATE KEY UPDATE sets the written columns only);
    # 3 deleted by its last row; 6 inserted then deleted; 7 deleted then inserted
    assert table_of(writer.url, writer.table) == AFTER
    assert prepared_of(writer.url, writer.sink) == []


def test_a_retry_of_the_partition_and_a_replay_of_the_decided_batch_change_nothing(
    writer: Upserter,
) -> None:
    first = writer.write(0, PARTITION)  # attempt 1: prepared, then its task "fails"
    second = writer.write(0, PARTITION)  # attempt 2 of the same partition
    assert second.gid == first.gid  # adopted: the same branch, written once
    writer.commit(0, [second])
    assert table_of(writer.url, writer.table) == AFTER
    replay = writer.write(0, [rows_of([1], ["replayed"], [True])])
    assert replay.skipped and replay.gid is None
    assert table_of(writer.url, writer.table) == AFTER
    assert prepared_of(writer.url, writer.sink) == []


def test_a_not_null_violation_names_the_column_nothing_visible_nothing_prepared(
    writer: Upserter,
) -> None:
    bad = pa.RecordBatch.from_pydict(
        {"id": pa.array([1, 9], pa.int64()), "v": pa.array(["x", None]),
         FLAG: pa.array([False, False])}
    )  # fmt: skip
    with pytest.raises(WriteError) as err:
        writer.write(2, [bad], partition=1)
    text = str(err.value)
    assert "column 'v'" in text and "batch 2" in text and "partition 1" in text, text
    assert "Fix:" in text
    assert table_of(writer.url, writer.table) == BEFORE
    assert prepared_of(writer.url, writer.sink) == []


def test_every_value_of_the_type_table_round_trips_through_upsert(
    mariadb_server: MariaServer,
) -> None:
    url = mariadb_server.url()
    w = Upserter(url, f"u_{uuid.uuid4().hex[:8]}", new_sink(), delete_column=None)
    make_table(url, w.table, TYPES)
    given = typed_batch()
    nulls = with_nulls(given)
    placeholder = pa.RecordBatch.from_pylist(
        [{"id": r["id"]} | {k: None for k in given.schema.names if k != "id"}
         for r in given.to_pylist()], schema=given.schema,
    )  # fmt: skip
    try:
        w.commit(0, [w.write(0, [placeholder, nulls])])  # rows there: the upsert updates them
        w.commit(1, [w.write(1, [given, nulls])])
        conn = connect(url)
        try:
            found = rows(conn, f"SELECT * FROM `{w.table}` ORDER BY id")
        finally:
            conn.close()
        assert len(found) == given.num_rows + 1
        for row, want in zip(found, given.to_pylist(), strict=False):
            got = dict(zip(given.schema.names, row, strict=True))
            for name in ("id", "s", "t", "d", "big", "day", "small", "f", "r"):
                assert got[name] == want[name], name
            assert bytes(got["b"]) == want["b"]
            assert bool(got["ok"]) is want["ok"]
            assert got["ts"] == want["ts"].replace(tzinfo=None)
            assert got["tz"] == want["tz"].replace(tzinfo=None)
        assert found[-1] == (given.num_rows, *([None] * (given.num_columns - 1)))
        assert found[0][1] == ""  # empty is not NULL
        assert prepared_of(url, w.sink) == []
    finally:
        forget_sink(url, w.sink)


def test_a_task_killed_after_prepare_is_adopted_the_exact_table(
    writer: Upserter, tmp_path: Path
) -> None:
    """The killed attempt's session ended after XA PREPARE (its staging table with it):
    the branch stays prepared, complete; the retry adopts it; the commit gives the table
    the partition's last rows."""
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "after_prepare", "batch": 0, "action": "kill"}]))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SQLSINK_FAULTS_FILE": str(faults)}
    args = {"url": writer.url, "table": writer.table, "sink": writer.sink, "run": writer.run}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.mariadb.test_upsert", json.dumps(args)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=90,
        start_new_session=True, check=False,
    )  # fmt: skip
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-3000:])
    orphan = prepared_of(writer.url, writer.sink)
    assert len(orphan) == 1 and table_of(writer.url, writer.table) == BEFORE
    retry = writer.write(0, PARTITION)
    assert retry.gid == orphan[0]
    writer.commit(0, [retry])
    assert table_of(writer.url, writer.table) == AFTER
    assert prepared_of(writer.url, writer.sink) == []


def _task(args: dict[str, Any]) -> PartitionOutcome:
    plan = UpsertPlan(("id",), FLAG)
    target = LoadTarget(args["url"], args["table"], 10.0, upsert=plan)
    task = TaskIdentity(args["sink"], 0, 0, args["run"], 50, 0, "q1")
    conn = connect(args["url"])
    ensure_schema(conn)
    conn.close()
    return write_partition(target, task, PARTITION)


if __name__ == "__main__":
    print(_task(json.loads(sys.argv[1])))


def test_planning_finds_the_key_and_refuses_every_upsert_problem_in_one_message(
    mariadb_server: MariaServer,
) -> None:
    from pyspark.sql import types as T

    from sqlsink.errors import ConfigError
    from sqlsink.options import SinkOptions
    from sqlsink.spark.plan import plan_write

    url = mariadb_server.url()
    table = f"p_{uuid.uuid4().hex[:8]}"
    make_table(url, table, "ID bigint PRIMARY KEY, v varchar(20), w int")
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("v", T.StringType()),
         T.StructField("gone", T.BooleanType())]
    )  # fmt: skip
    options = {"url": url, "table": table, "mode": "upsert", "deleteColumn": "gone"}
    plan = plan_write(SinkOptions.parse(options), schema, "t")
    assert plan.key == ("id",)  # the primary key, in the DataFrame's spelling
    assert getattr(plan, "upsert") == UpsertPlan(("ID",), "gone")  # noqa: B009
    assert getattr(plan, "columns") == ("ID", "v", "gone")  # noqa: B009
    flag = T.StructType([*schema.fields[:2], T.StructField("gone", T.StringType())])
    with pytest.raises(ConfigError) as caught:
        plan_write(SinkOptions.parse({**options, "keyColumns": "v"}), flag, "t")
    text = str(caught.value)
    assert "deleteColumn 'gone' has Arrow type string: it must be a boolean" in text
    assert "no unique index of the table is on exactly (`v`)" in text
    assert text.endswith("Nothing was written")


def test_the_server_killed_with_an_upsert_branch_prepared_keeps_it(
    mariadb_server: MariaServer, writer: Upserter
) -> None:
    """The branch used a temporary table (gone with its session, and with the server):
    after mariadbd's SIGKILL and restart it is prepared still, and its commit gives the
    partition's last rows."""
    if mariadb_server.process is None:
        pytest.skip("only a server this run started can be crashed")
    outcome = writer.write(0, PARTITION)
    mariadb_server.kill_and_restart()
    assert prepared_of(writer.url, writer.sink) == [outcome.gid]
    writer.commit(0, [outcome])
    assert table_of(writer.url, writer.table) == AFTER
    assert prepared_of(writer.url, writer.sink) == []


def test_two_partitions_of_a_batch_with_interleaved_keys_never_wait_on_each_other(
    mariadb_server: MariaServer,
) -> None:
    """A prepared branch keeps its exclusive row locks until its commit: a statement of
    another partition that locked rows it does not write (a DELETE that scans the
    table, as the optimizer chose for an empty one) would wait for the decision, which
    waits for it. Interleaved keys into an empty table, a delete in the second."""
    url = mariadb_server.url()
    w = Upserter(url, f"u_{uuid.uuid4().hex[:8]}", new_sink(), lock_timeout_s=2.0)
    make_table(url, w.table, COLUMNS)
    try:
        first = w.write(0, [rows_of([1, 3, 5], ["p1", "p3", "p5"], [False] * 3)], 0)
        second = w.write(0, [rows_of([2, 4, 6], ["q2", "q4", "q6"], [False, True, False])], 1)
        w.commit(0, [first, second])
        assert table_of(url, w.table) == [
            (1, "p1", "kept"), (2, "q2", "kept"), (3, "p3", "kept"), (5, "p5", "kept"),
            (6, "q6", "kept"),
        ]  # fmt: skip
        assert prepared_of(url, w.sink) == []
    finally:
        forget_sink(url, w.sink)
