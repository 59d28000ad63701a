"""Attacks on mode=upsert on MariaDB (sqlsink/mariadb/upsert.py through partition.py), on a
real private mariadbd: keys two partitions or two streams write at once, keys the
collation folds, NULL keys and flags, a second unique index, a key 0 in an AUTO_INCREMENT
column, triggers, gap locks across prepared branches, a task killed mid-load, binary log
formats, a user without the privileges upsert needs. Each asserts the exact rows, that
nothing of the sink is left in XA RECOVER, and the error text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sqlsink.errors import ConfigError, SqlsinkError, TransientError, WriteError
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.partition import LoadTarget
from sqlsink.mariadb.upsert import UpsertPlan
from tests.fix_mariadb import TARGET_DB, MariaServer
from tests.mariadb.protocol import forget_sink, make_table, new_sink, prepared_of
from tests.mariadb.test_upsert import AFTER, BEFORE, COLUMNS, FLAG, PARTITION, Upserter, rows_of

ROOT = Path(__file__).resolve().parents[2]


class KeyedUpserter(Upserter):
    """An Upserter on another key than ``id``."""

    keys: tuple[str, ...] = ("id",)

    @property
    def target(self) -> LoadTarget:
        plan = UpsertPlan(self.keys, self.delete_column)
        return LoadTarget(
            self.url, self.table, self.lock_timeout_s, run_timeout_s=self.live_s, upsert=plan
        )


def q(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = connect(url)
    try:
        return rows(conn, sql)
    finally:
        conn.close()


def run(url: str, *sql: str) -> None:
    conn = connect(url)
    try:
        for s in sql:
            execute(conn, s)
    finally:
        conn.close()


@pytest.fixture
def url(mariadb_server: MariaServer) -> str:
    return mariadb_server.url()


@pytest.fixture
def sinks(url: str) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for sink in made:
        forget_sink(url, sink)


def upserter(url: str, sinks: list[str], columns: str = COLUMNS, **kw: Any) -> Upserter:
    w = Upserter(url, f"a_{uuid.uuid4().hex[:8]}", new_sink(), **kw)
    sinks.append(w.sink)
    make_table(url, w.table, columns)
    return w


def batch(
    data: dict[str, list[Any]], types: dict[str, pa.DataType] | None = None
) -> pa.RecordBatch:
    types = types or {}
    return pa.RecordBatch.from_pydict({k: pa.array(v, types.get(k)) for k, v in data.items()})


# -- a key in two partitions of one batch, and in two streams ---------------------------


def test_a_key_in_two_partitions_of_a_batch_waits_lock_timeout_and_says_the_fix(
    url: str, sinks: list[str]
) -> None:
    """As on PostgreSQL: the second partition waits on the first's prepared branch; after
    lockTimeout it is a TransientError naming the fix; nothing of it is left prepared."""
    w = upserter(url, sinks, lock_timeout_s=1.0)
    run(url, f"INSERT INTO `{w.table}` (id, v) VALUES (1, 'old')")
    first = w.write(0, [rows_of([1, 2], ["p1", "p2"], [False, False])], 0)
    with pytest.raises(TransientError) as caught:
        w.write(0, [rows_of([3, 1], ["q3", "q1"], [False, False])], 1)
    text = str(caught.value)
    assert "Lock wait timeout exceeded" in text, text
    assert "partition 1" in text and "the batch is retried" in text, text
    assert "repartition(n, key)" in text, text
    assert prepared_of(url, w.sink) == [first.gid]
    w.commit(0, [first])
    assert q(url, f"SELECT id, v FROM `{w.table}` ORDER BY id") == [(1, "p1"), (2, "p2")]
    assert prepared_of(url, w.sink) == []


def test_two_streams_upserting_one_key_the_second_waits_then_succeeds_after_the_first(
    url: str, sinks: list[str]
) -> None:
    a = upserter(url, sinks, lock_timeout_s=1.0)
    b = Upserter(url, a.table, new_sink(), lock_timeout_s=1.0)
    sinks.append(b.sink)
    first = a.write(0, [rows_of([1, 2], ["a1", "a2"], [False, False])])
    with pytest.raises(TransientError) as caught:
        b.write(0, [rows_of([2], ["b2"], [True])])  # a delete of A's uncommitted key
    assert "Lock wait timeout exceeded" in str(caught.value), str(caught.value)
    assert prepared_of(url, b.sink) == []
    a.commit(0, [first])
    b.commit(0, [b.write(0, [rows_of([2, 1], ["b2", "b1"], [True, False])])])
    assert q(url, f"SELECT id, v FROM `{a.table}` ORDER BY id") == [(1, "b1")]
    assert prepared_of(url, a.sink) == [] and prepared_of(url, b.sink) == []


def test_gap_locks_of_a_prepared_upsert_do_not_block_another_partition(
    url: str, sinks: list[str]
) -> None:
    """Under REPEATABLE READ a duplicate found by ON DUPLICATE KEY UPDATE and a DELETE of
    a missing key take next-key (gap) locks; if a prepared branch kept them, another
    partition inserting other keys into those gaps would wait for the decision (which
    waits for it)."""
    w = upserter(url, sinks, lock_timeout_s=2.0)
    run(url, f"INSERT INTO `{w.table}` (id, v) VALUES (10, 'o10'), (20, 'o20')")
    # partition 0: updates 20 (gap 10..20), deletes missing 30 and 40 (gap 20..sup)
    first = w.write(0, [rows_of([20, 30, 40], ["p20", "x", "x"], [False, True, True])], 0)
    # partition 1: inserts into both gaps
    second = w.write(0, [rows_of([15, 35, 50], ["q15", "q35", "q50"], [False] * 3)], 1)
    w.commit(0, [first, second])
    assert q(url, f"SELECT id, v FROM `{w.table}` ORDER BY id") == [
        (10, "o10"), (15, "q15"), (20, "p20"), (35, "q35"), (50, "q50"),
    ]  # fmt: skip
    assert prepared_of(url, w.sink) == []


# -- what a key is ---------------------------------------------------------------------


def test_keys_the_collation_folds_are_one_key_the_last_row_wins(url: str, sinks: list[str]) -> None:
    """Case, trailing spaces and accents under utf8mb4_general_ci: one key; the stored
    key of an existing row keeps its spelling (the key is not among the updated columns);
    a new key takes its last row's (REPLACE replaces the whole staged row)."""
    w = upserter(url, sinks, "k varchar(10) COLLATE utf8mb4_general_ci PRIMARY KEY, v int")
    w = KeyedUpserter(w.url, w.table, w.sink, delete_column=None)
    w.keys = ("k",)
    run(url, f"INSERT INTO `{w.table}` VALUES ('abc', 0)")
    part = batch({"k": ["ABC", "abc ", "àbc", "xyz", "XYZ"], "v": [1, 2, 3, 4, 5]})
    w.commit(0, [w.write(0, [part])])
    assert q(url, f"SELECT k, v FROM `{w.table}` ORDER BY v") == [("abc", 3), ("XYZ", 5)]
    assert prepared_of(url, w.sink) == []


def test_a_binary_collation_key_column_keeps_case_distinct_keys_apart(
    url: str, sinks: list[str]
) -> None:
    """The staging table's key column must compare as the target's column does (here a
    _bin column in a table whose default collation folds case)."""
    w = upserter(
        url, sinks,
        "k varchar(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY, v int) "
        "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci, ENGINE=InnoDB -- (",
    )  # fmt: skip
    w = KeyedUpserter(w.url, w.table, w.sink, delete_column=None)
    w.keys = ("k",)
    part = batch({"k": ["abc", "ABC", "abc"], "v": [1, 2, 3]})
    w.commit(0, [w.write(0, [part])])
    assert q(url, f"SELECT k, v FROM `{w.table}` ORDER BY k") == [("ABC", 2), ("abc", 3)]
    assert prepared_of(url, w.sink) == []


def test_a_composite_key_updates_by_both_columns(url: str, sinks: list[str]) -> None:
    w = upserter(url, sinks, "a int, b varchar(5), v int, PRIMARY KEY (b, a)")
    w = KeyedUpserter(w.url, w.table, w.sink)
    w.keys = ("a", "b")
    run(url, f"INSERT INTO `{w.table}` VALUES (1,'x',0), (1,'y',0), (2,'x',0)")
    part = batch(
        {"b": ["x", "y", "x", "z"], "a": [1, 1, 2, 1], "v": [10, 11, 12, 13],
         FLAG: [False, True, False, False]},
    )  # fmt: skip
    w.commit(0, [w.write(0, [part])])
    assert q(url, f"SELECT a, b, v FROM `{w.table}` ORDER BY a, b") == [
        (1, "x", 10), (1, "z", 13), (2, "x", 12),
    ]  # fmt: skip
    assert prepared_of(url, w.sink) == []


@pytest.mark.xfail(
    strict=True,
    reason="a NULL key (a UNIQUE key allows several NULLs): the staging table's REPLACE does "
    "not fold them, so every NULL-key row of the partition is inserted; PostgreSQL's "
    "DISTINCT ON keeps the last one only (and neither refuses a NULL key)",
)
def test_null_keys_in_a_unique_key_the_last_row_wins_as_on_postgres(
    url: str, sinks: list[str]
) -> None:
    w = upserter(url, sinks, "id int AUTO_INCREMENT PRIMARY KEY, code varchar(5) UNIQUE, v int")
    w = KeyedUpserter(w.url, w.table, w.sink, delete_column=None)
    w.keys = ("code",)
    part = batch({"code": [None, "a", None], "v": [1, 2, 3]}, {"code": pa.string()})
    w.commit(0, [w.write(0, [part])])
    assert prepared_of(url, w.sink) == []
    assert q(url, f"SELECT code, v FROM `{w.table}` ORDER BY v") == [("a", 2), (None, 3)]


def test_a_key_zero_in_an_auto_increment_key_is_the_key_zero(url: str, sinks: list[str]) -> None:
    """Without NO_AUTO_VALUE_ON_ZERO, MariaDB turns an inserted 0 in an AUTO_INCREMENT
    column into the next id: upserting key 0 twice would add two rows of other keys."""
    w = upserter(url, sinks, "id bigint AUTO_INCREMENT PRIMARY KEY, v varchar(20) NOT NULL, "
                             "note varchar(20) DEFAULT 'kept'")  # fmt: skip
    run(url, f"INSERT INTO `{w.table}` (id, v) VALUES (1, 'one')")
    w.commit(0, [w.write(0, [rows_of([0, 2], ["zero", "two"], [False, False])])])
    w.commit(1, [w.write(1, [rows_of([0], ["zero again"], [False])])])
    assert q(url, f"SELECT id, v FROM `{w.table}` ORDER BY id") == [
        (0, "zero again"), (1, "one"), (2, "two"),
    ]  # fmt: skip
    assert prepared_of(url, w.sink) == []


def test_a_null_delete_flag_upserts_the_row_as_on_postgres(url: str, sinks: list[str]) -> None:
    w = upserter(url, sinks)
    run(url, f"INSERT INTO `{w.table}` (id, v) VALUES (1, 'old1'), (2, 'old2')")
    part = pa.RecordBatch.from_pydict(
        {"id": pa.array([1, 2, 3], pa.int64()), "v": pa.array(["n1", "n2", "n3"]),
         FLAG: pa.array([None, True, None], pa.bool_())}
    )  # fmt: skip
    w.commit(0, [w.write(0, [part])])
    assert q(url, f"SELECT id, v FROM `{w.table}` ORDER BY id") == [(1, "n1"), (3, "n3")]
    assert prepared_of(url, w.sink) == []


def test_a_second_unique_index_never_overwrites_another_keys_row(
    url: str, sinks: list[str]
) -> None:
    """ON DUPLICATE KEY UPDATE fires on any unique index: key 2's row whose email is key
    1's would have overwritten key 1's row and key 2 would never be stored (a row lost
    silently; PostgreSQL raises a unique violation). The partition is refused naming the
    collision, nothing of it written, nothing prepared; rows whose other unique columns
    agree with their key are updated as before; two new keys of one partition sharing
    an email are refused too."""
    w = upserter(url, sinks, "id bigint PRIMARY KEY, email varchar(20) UNIQUE, v varchar(20)")
    w.delete_column = None
    run(url, f"INSERT INTO `{w.table}` VALUES (1, 'a@x', 'one'), (3, 'c@x', 'three')")
    part = batch({"id": [3, 2], "email": ["c@x", "a@x"], "v": ["THREE", "two"]}, {"id": pa.int64()})
    with pytest.raises(WriteError) as refused:
        w.write(0, [part])
    assert "another unique index" in str(refused.value)
    assert "nothing of it is written" in str(refused.value)
    assert q(url, f"SELECT id, email, v FROM `{w.table}` ORDER BY id") == [
        (1, "a@x", "one"), (3, "c@x", "three"),
    ]  # fmt: skip
    assert prepared_of(url, w.sink) == []
    twins = batch({"id": [5, 6], "email": ["e@x", "e@x"], "v": ["five", "six"]}, {"id": pa.int64()})
    with pytest.raises(WriteError, match="another unique index"):
        w.write(0, [twins])
    agree = batch({"id": [1, 4], "email": ["a@x", "d@x"], "v": ["ONE", "four"]}, {"id": pa.int64()})
    w.commit(0, [w.write(0, [agree])])
    assert q(url, f"SELECT id, email, v FROM `{w.table}` ORDER BY id") == [
        (1, "a@x", "ONE"), (3, "c@x", "three"), (4, "d@x", "four"),
    ]  # fmt: skip
    assert prepared_of(url, w.sink) == []


def test_only_some_columns_and_triggers_fire_in_the_branch(url: str, sinks: list[str]) -> None:
    w = upserter(url, sinks)
    audit = f"{w.table}_audit"
    run(
        url,
        f"CREATE TABLE `{audit}` (n int AUTO_INCREMENT PRIMARY KEY, what varchar(5), id bigint)",
        f"INSERT INTO `{w.table}` VALUES (1,'old1','n1'), (2,'old2','n2'), (3,'old3','n3'), "
        "(4,'old4','n4')",
    )
    for event in ("INSERT", "UPDATE", "DELETE"):
        row = "OLD" if event == "DELETE" else "NEW"
        run(
            url,
            f"CREATE TRIGGER `{w.table}_{event[:3]}` AFTER {event} ON `{w.table}` FOR EACH ROW "
            f"INSERT INTO `{audit}` (what, id) VALUES ('{event[:3]}', {row}.id)",
        )
    outcome = w.write(0, PARTITION)
    assert q(url, f"SELECT count(*) FROM `{audit}`") == [(0,)]  # prepared: not visible
    w.commit(0, [outcome])
    assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == AFTER
    assert sorted(q(url, f"SELECT what, id FROM `{audit}`")) == [
        ("DEL", 3), ("INS", 5), ("INS", 7), ("UPD", 1), ("UPD", 2),
    ]  # fmt: skip
    assert prepared_of(url, w.sink) == []


# -- crashes and the binary log ---------------------------------------------------------


def test_a_task_killed_mid_load_leaves_nothing_and_the_retry_writes_the_batch(
    url: str, sinks: list[str], tmp_path: Path
) -> None:
    w = upserter(url, sinks)
    run(url, f"INSERT INTO `{w.table}` VALUES (1,'old1','n1'), (2,'old2','n2'), "
             "(3,'old3','n3'), (4,'old4','n4')")  # fmt: skip
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "mid_copy", "batch": 0, "action": "kill"}]))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SQLSINK_FAULTS_FILE": str(faults)}
    args = {"url": url, "table": w.table, "sink": w.sink, "run": w.run}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.mariadb.test_upsert", json.dumps(args)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=90,
        start_new_session=True, check=False,
    )  # fmt: skip
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-3000:])
    assert (tmp_path / "faults.json.fired").exists()
    assert prepared_of(url, w.sink) == []
    assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == BEFORE
    w.commit(0, [w.write(0, PARTITION)])
    assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == AFTER
    assert prepared_of(url, w.sink) == []


@pytest.mark.parametrize(
    "fmt",
    [
        "STATEMENT",
        "MIXED",
    ],
)
def test_upsert_under_a_statement_or_mixed_binary_log(
    mariadb_server: MariaServer, url: str, sinks: list[str], fmt: str
) -> None:
    """MariaDB's default binlog_format is MIXED: the branch loads without a warning,
    prepares and commits. STATEMENT cannot log the sink's READ COMMITTED writes (sqlsink
    check says so): the write is refused in the sink's words with the fix, nothing left
    prepared."""
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute("SELECT @@global.binlog_format")
            before = cur.fetchone()[0]
        w = upserter(url, sinks)  # the commit log made before: under STATEMENT it cannot be
        with root.cursor() as cur:
            cur.execute(f"SET GLOBAL binlog_format = '{fmt}'")
        try:
            with root.cursor() as cur:  # root's session: REPEATABLE READ, logged as statements
                cur.execute(
                    f"INSERT INTO `{TARGET_DB}`.`{w.table}` VALUES (1,'old1','n1'), "
                    "(2,'old2','n2'), (3,'old3','n3'), (4,'old4','n4')"
                )
            assert q(url, "SELECT @@session.binlog_format") == [(fmt,)]
            if fmt == "STATEMENT":  # READ COMMITTED is logged by rows only: refused
                with pytest.raises(SqlsinkError) as caught:
                    w.write(0, PARTITION)
                text = str(caught.value)
                assert "binlog_format = STATEMENT" in text, text
                assert "Fix: SET GLOBAL binlog_format = 'ROW'" in text, text
                assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == BEFORE
            else:
                w.commit(0, [w.write(0, PARTITION)])
                assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == AFTER
            assert prepared_of(url, w.sink) == []
        finally:
            with root.cursor() as cur:
                cur.execute(f"SET GLOBAL binlog_format = '{before}'")
    finally:
        root.close()


# -- privileges --------------------------------------------------------------------------


@pytest.fixture
def limited(mariadb_server: MariaServer, url: str) -> Iterator[tuple[str, str]]:
    """A user with SELECT and INSERT on a fresh table only (and what the commit log
    needs): (its url, the table)."""
    from tests.fix_mariadb import LOG_DB

    user, table = f"lim_{uuid.uuid4().hex[:6]}", f"a_{uuid.uuid4().hex[:8]}"
    make_table(url, table, "id bigint PRIMARY KEY, v varchar(20)")
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute("CREATE USER %s@'%%' IDENTIFIED BY 'pw'", (user,))
            cur.execute(f"GRANT ALL PRIVILEGES ON `{LOG_DB}`.* TO %s@'%%'", (user,))
            cur.execute(f"GRANT CREATE TEMPORARY TABLES ON `{TARGET_DB}`.* TO %s@'%%'", (user,))
            cur.execute(f"GRANT SELECT, INSERT ON `{TARGET_DB}`.`{table}` TO %s@'%%'", (user,))
            cur.execute("GRANT FILE ON *.* TO %s@'%%'", (user,))
        parts = urllib.parse.urlsplit(url)
        yield f"mariadb://{user}:pw@{parts.hostname}:{parts.port}{parts.path}", table
        with root.cursor() as cur:
            cur.execute("DROP USER %s@'%%'", (user,))
    finally:
        root.close()


def test_a_user_without_update_and_delete_is_refused_at_planning_with_the_grant(
    limited: tuple[str, str],
) -> None:
    from pyspark.sql import types as T

    from sqlsink.options import SinkOptions
    from sqlsink.spark.plan import plan_write

    lim_url, table = limited
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("v", T.StringType()),
         T.StructField("gone", T.BooleanType())]
    )  # fmt: skip
    options = {"url": lim_url, "table": table, "mode": "upsert", "deleteColumn": "gone"}
    with pytest.raises(ConfigError) as caught:
        plan_write(SinkOptions.parse(options), schema, "t")
    text = str(caught.value)  # PostgreSQL's planning refuses so; MariaDB's did not (found)
    user = lim_url.split("//")[1].split(":")[0]
    assert f"user {user}@% lacks UPDATE, DELETE for upsert into `sqlsink_test`.`{table}`" in (
        text
    ), text
    assert "UPDATE command denied" in text and "Nothing was written" in text, text
    assert f"Fix: GRANT SELECT, UPDATE, DELETE ON `sqlsink_test`.`{table}` TO '{user}'@'%'" in (
        text
    ), text
    assert "pw" not in text.replace("upsert", "")


def test_a_user_without_update_fails_the_task_naming_the_privilege_nothing_prepared(
    limited: tuple[str, str],
) -> None:
    lim_url, table = limited
    sink = new_sink()
    w = Upserter(lim_url, table, sink, delete_column=None)
    try:
        with pytest.raises(WriteError) as caught:
            w.write(0, [rows_of([1], ["x"])])
        text = str(caught.value)
        assert "UPDATE command denied" in text and "privileges" in text, text
        assert prepared_of(lim_url, sink) == []
        assert q(lim_url, f"SELECT count(*) FROM `{table}`") == [(0,)]
    finally:
        forget_sink(lim_url, sink)


# -- keys the staging table and the target compare differently ---------------------------


def test_a_prefix_unique_index_as_the_key_is_refused_at_planning(
    url: str, sinks: list[str]
) -> None:
    from pyspark.sql import types as T

    from sqlsink.options import SinkOptions
    from sqlsink.spark.plan import plan_write

    w = upserter(url, sinks, "k varchar(10) NOT NULL, v int, UNIQUE KEY (k(3))")
    schema = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.IntegerType())])
    options = {"url": url, "table": w.table, "mode": "upsert", "keyColumns": "k"}
    with pytest.raises(ConfigError) as caught:  # the staging table is unique on the
        plan_write(SinkOptions.parse(options), schema, "t")  # whole column: 'abcX' and
    text = str(caught.value)  # 'abcY' overwrote each other's row (found by this test)
    assert "no unique index of the table is on exactly (`k`)" in text, text
    assert "prefix of a column" in text and text.endswith("Nothing was written"), text


def test_a_deadlock_between_two_streams_is_a_transient_error_nothing_left_prepared(
    mariadb_server: MariaServer, url: str, sinks: list[str]
) -> None:
    """Stream A deletes 2 and upserts 1, stream B deletes 1 and upserts 2. A root session
    holds keys 10 and 11 (each stream also deletes one) until both deletes wait on it,
    then lets go: A holds 2 and wants 1, B holds 1 and wants 2. InnoDB's 1213 rolls one
    branch back: a TransientError in the sink's words, nothing of it prepared; the other
    prepares; the loser's retry after the winner's commit gives the exact rows."""
    import threading
    import time

    made = upserter(url, sinks)
    run(url, f"INSERT INTO `{made.table}` (id, v) VALUES (1,'o'), (2,'o'), (10,'o'), (11,'o')")
    a = Upserter(url, made.table, new_sink(), lock_timeout_s=20.0)
    b = Upserter(url, made.table, new_sink(), lock_timeout_s=20.0)
    sinks += [a.sink, b.sink]
    parts = {
        "a": rows_of([2, 10, 1], ["a", "a", "a"], [True, True, False]),
        "b": rows_of([1, 11, 2], ["b", "b", "b"], [True, True, False]),
    }
    results: dict[str, Any] = {}

    def write(name: str, s: Upserter) -> None:
        try:
            results[name] = s.write(0, [parts[name]])
        except Exception as exc:  # the test reads it
            results[name] = exc

    gate = mariadb_server.connect(root=True, autocommit=False)
    try:
        with gate.cursor() as cur:
            cur.execute(
                f"SELECT id FROM `{TARGET_DB}`.`{made.table}` WHERE id IN (10, 11) FOR UPDATE"
            )
        threads = [threading.Thread(target=write, args=(n, s)) for n, s in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 15
        waiting = 0
        while time.monotonic() < deadline:
            with gate.cursor() as cur:  # root: sees every session
                cur.execute(  # each stream's DELETE stuck on the gate's key
                    "SELECT count(*) FROM information_schema.processlist "
                    "WHERE info LIKE 'DELETE t FROM %%' AND time_ms > 500"
                )
                waiting = int(cur.fetchone()[0])
            if waiting == 2:
                break
            time.sleep(0.05)
        assert waiting == 2, ("both streams should wait on the gate's keys", results)
    finally:
        gate.rollback()
        gate.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    errors = {n: r for n, r in results.items() if isinstance(r, Exception)}
    assert len(errors) == 1, results
    ((loser_name, error),) = errors.items()
    assert isinstance(error, TransientError), repr(error)
    assert "Deadlock found" in str(error) and "the batch is retried" in str(error), str(error)
    winner_name = "b" if loser_name == "a" else "a"
    winner, loser = (a, b) if winner_name == "a" else (b, a)
    assert prepared_of(url, loser.sink) == []
    assert prepared_of(url, winner.sink) == [results[winner_name].gid]
    winner.commit(0, [results[winner_name]])
    loser.commit(0, [loser.write(0, [parts[loser_name]])])
    want = [(1, "a")] if loser_name == "a" else [(2, "b")]
    assert q(url, f"SELECT id, v FROM `{made.table}`") == want
    assert prepared_of(url, a.sink) == [] and prepared_of(url, b.sink) == []


def test_a_delete_column_named_as_a_table_column_is_the_flag_only(
    url: str, sinks: list[str]
) -> None:
    """deleteColumn ``gone`` while the table has a column ``gone``: the DataFrame's is the
    flag (not written, as on PostgreSQL); the table's keeps its value."""
    w = upserter(url, sinks, "id bigint PRIMARY KEY, v varchar(20), gone varchar(5) DEFAULT 'd'")
    run(url, f"INSERT INTO `{w.table}` VALUES (1, 'old1', 'x1'), (2, 'old2', 'x2')")
    w.commit(0, [w.write(0, [rows_of([1, 2, 3], ["n1", "n2", "n3"], [False, True, False])])])
    assert q(url, f"SELECT id, v, gone FROM `{w.table}` ORDER BY id") == [
        (1, "n1", "x1"), (3, "n3", "d"),
    ]  # fmt: skip
    assert prepared_of(url, w.sink) == []


def test_a_second_attempt_while_the_first_is_mid_load_one_branch_the_exact_rows(
    url: str, sinks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A speculative (or retried) attempt of a partition starts while the first is in its
    branch, its staged rows half loaded (paused mid-load): the two never leave two
    branches, and the batch's commit gives the partition's last rows once."""
    import threading

    w = upserter(url, sinks, lock_timeout_s=5.0)
    run(url, f"INSERT INTO `{w.table}` VALUES (1,'old1','n1'), (2,'old2','n2'), "
             "(3,'old3','n3'), (4,'old4','n4')")  # fmt: skip
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps([{"point": "mid_copy", "once": True, "action": "sleep", "seconds": 3}])
    )
    monkeypatch.setenv("SQLSINK_FAULTS_FILE", str(faults))
    results: dict[int, Any] = {}

    def first() -> None:
        try:
            results[1] = w.write(0, PARTITION)
        except Exception as exc:  # the test reads it
            results[1] = exc

    t = threading.Thread(target=first)
    t.start()
    deadline = __import__("time").monotonic() + 10
    while not (tmp_path / "faults.json.fired").exists():
        assert __import__("time").monotonic() < deadline, "the first attempt never paused"
        __import__("time").sleep(0.05)
    try:
        results[2] = w.write(0, PARTITION)
    except Exception as exc:  # the test reads it
        results[2] = exc
    t.join(30)
    assert not t.is_alive()
    # the second prepared while the first was paused (its rows only in its own staging
    # table); the first's INSERT then waited on the prepared rows until lockTimeout
    second, first_error = results[2], results[1]
    assert not isinstance(second, Exception), repr(second)
    assert isinstance(first_error, TransientError), repr(first_error)
    assert "Lock wait timeout exceeded" in str(first_error), str(first_error)
    gids = {second.gid}
    done = [second]
    assert prepared_of(url, w.sink) == sorted(gids)
    w.commit(0, [done[0]])
    assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == AFTER
    assert prepared_of(url, w.sink) == []


def test_planning_an_upsert_into_a_table_whose_name_holds_a_backtick(
    url: str, sinks: list[str]
) -> None:
    """The planning's privilege tries quote the table's name (a backtick doubled)."""
    from pyspark.sql import types as T

    from sqlsink.options import SinkOptions
    from sqlsink.spark.plan import plan_write

    name = f"b`q {uuid.uuid4().hex[:6]}"
    make_table(url, name.replace("`", "``"), "id bigint PRIMARY KEY, v varchar(20)")
    try:
        schema = T.StructType(
            [T.StructField("id", T.LongType()), T.StructField("v", T.StringType())]
        )
        options = {"url": url, "table": name, "mode": "upsert"}
        plan = plan_write(SinkOptions.parse(options), schema, "t")
        assert getattr(plan, "upsert") == UpsertPlan(("id",), None)  # noqa: B009
    finally:
        run(url, f"DROP TABLE `{name.replace('`', '``')}`")


@pytest.mark.parametrize("how", ["session", "server"])
def test_the_branch_cut_after_the_load_before_prepare_leaves_nothing(
    mariadb_server: MariaServer, url: str, sinks: list[str], how: str
) -> None:
    """The partition's rows staged, its INSERT ... ON DUPLICATE KEY UPDATE waiting on a
    row a root session holds: its session is KILLed, or mariadbd SIGKILLed and restarted.
    A TransientError (the connection lost), nothing of the sink in XA RECOVER, the table
    as before; the retry writes the partition's last rows."""
    import threading
    import time

    if how == "server" and mariadb_server.process is None:
        pytest.skip("only a server this run started can be crashed")
    w = upserter(url, sinks, lock_timeout_s=30.0)
    run(url, f"INSERT INTO `{w.table}` VALUES (1,'old1','n1'), (2,'old2','n2'), "
             "(3,'old3','n3'), (4,'old4','n4')")  # fmt: skip
    results: list[Any] = []

    def write() -> None:
        try:
            results.append(w.write(0, PARTITION))
        except Exception as exc:  # the test reads it
            results.append(exc)

    gate = mariadb_server.connect(root=True, autocommit=False)
    thread = threading.Thread(target=write)
    try:
        with gate.cursor() as cur:
            cur.execute(f"SELECT id FROM `{TARGET_DB}`.`{w.table}` WHERE id = 2 FOR UPDATE")
        thread.start()
        deadline, found = time.monotonic() + 15, []
        while time.monotonic() < deadline and not found:
            with gate.cursor() as cur:
                cur.execute(
                    "SELECT id FROM information_schema.processlist "
                    "WHERE info LIKE 'INSERT INTO %%ON DUPLICATE KEY UPDATE%%' AND time_ms > 300"
                )
                found = [r[0] for r in cur.fetchall()]
            time.sleep(0.05)
        assert found, "the upsert's INSERT should wait on the held row"
        if how == "session":
            with gate.cursor() as cur:
                cur.execute(f"KILL CONNECTION {int(found[0])}")
    finally:
        if how == "server":
            mariadb_server.kill_and_restart()
        else:
            gate.rollback()
        gate.close()
    thread.join(30)
    assert not thread.is_alive()
    (error,) = results
    assert isinstance(error, TransientError), repr(error)
    assert "Nothing of batch 0 is visible" in str(error) and "the batch is retried" in str(error), (
        str(error)
    )
    assert prepared_of(url, w.sink) == []
    assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == BEFORE
    w.commit(0, [w.write(0, PARTITION)])
    assert q(url, f"SELECT id, v, note FROM `{w.table}` ORDER BY id") == AFTER
    assert prepared_of(url, w.sink) == []
