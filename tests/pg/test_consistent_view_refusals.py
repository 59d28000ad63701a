"""What the consistent view cannot follow, refused before it shows part of a batch
(docs/DESIGN.md invariant 13), against a real PostgreSQL: the target's triggers (rows a
trigger inserts in a subtransaction carry an xid no marker names), and an upsert into a
table that a view of the same sink shows (the old versions go, the new are hidden).

Each test runs the sink's own path as the Spark adapter runs it, without Spark: the
driver's planning (``plan_write``, as the data source and the foreachBatch writer call
it), the partition tasks (``write_partition``), the commit (``Committer``), with the
driver dying after the first ``COMMIT PREPARED`` of the batch that would be torn. Were
the sink to let it through, a reader of the view would see part of that batch: the
tests say so in their failure, and they check that it is refused instead, with nothing
written and nothing left prepared.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sqlsink.core.model import PartitionOutcome
from sqlsink.errors import ConfigError
from sqlsink.postgres.partition import write_partition
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import TargetPlan
from tests.pg.protocol import Writer, prepared_of

pytest.importorskip("pyspark")  # plan_write takes the DataFrame's schema (no JVM started)

Rows = list[tuple[Any, ...]]


def q(url: str, statement: str | sql.Composed, params: Sequence[Any] = ()) -> Rows:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def ids(url: str, relation: str) -> list[int]:
    found = q(url, sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(relation)))
    return [int(r[0]) for r in found]


def exists(url: str, relation: str) -> bool:
    return q(url, "SELECT to_regclass(%s) IS NOT NULL", (f"public.{relation}",)) == [(True,)]


def planned(writer: Writer, text: bool = False) -> TargetPlan:
    """The driver's planning of one DataFrame (id bigint[, v text]): ``plan_write``."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from sqlsink.spark.plan import plan_write

    fields = [StructField("id", LongType())]
    if text:
        fields.append(StructField("v", StringType()))
    return plan_write(writer.options, StructType(fields), writer.sink, writer.sink)


def write(
    writer: Writer, target: TargetPlan, batch: int, partition: int, keys: Sequence[int], v: str = ""
) -> PartitionOutcome:
    """One partition task of the batch, with the plan the driver made."""
    columns = {"id": pa.array(list(keys), pa.int64())}
    if len(target.columns) > 1:
        columns["v"] = pa.array([v] * len(keys))
    batches = [pa.RecordBatch.from_pydict(columns)]
    return write_partition(writer.options, target, writer.task(batch, partition), batches)


def dies_mid_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on the driver dies after the first COMMIT PREPARED of a batch."""

    def point(name: str, batch_id: int, *args: object, **kwargs: object) -> None:
        if name == "mid_commit":
            raise RuntimeError(f"the driver dies after a COMMIT PREPARED of batch {batch_id}")

    monkeypatch.setattr("sqlsink.core.resolver.crash_point", point)


def commit_dying(writer: Writer, batch: int, outcomes: list[PartitionOutcome | None]) -> None:
    with pytest.raises(RuntimeError, match="the driver dies"):
        writer.commit(batch, outcomes)


# -- the target's triggers ------------------------------------------------------------------


@dataclass(frozen=True)
class Routed:
    """A parent table whose rows a BEFORE INSERT trigger routes into an inheritance child
    inside a PL/pgSQL EXCEPTION block (the usual "create the child if missing" pattern:
    every routed insert runs in a subtransaction)."""

    parent: str
    child: str
    function: str
    view: str

    def add_trigger(self, url: str) -> None:
        q(
            url,
            sql.SQL(
                "CREATE TRIGGER route BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
            ).format(sql.Identifier(self.parent), sql.Identifier(self.function)),
        )


ROUTING = """
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        INSERT INTO {child} VALUES (NEW.*);
    EXCEPTION WHEN undefined_table THEN
        RAISE;  -- a real router creates the missing child here, then inserts again
    END;
    RETURN NULL;
END $$
"""


@pytest.fixture
def routed(pg_url: str, sink: str) -> Iterator[Routed]:
    """The parent and its child, the routing function; no trigger yet (``add_trigger``).
    Dropped after the test with what the test made beside it (``<parent>_...``)."""
    name = f"ev_{uuid.uuid4().hex[:10]}"
    made = Routed(name, f"{name}_p0", f"{name}_route", f"{name}_whole")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        parent, child = sql.Identifier(made.parent), sql.Identifier(made.child)
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(parent))
        conn.execute(sql.SQL("CREATE TABLE {} () INHERITS ({})").format(child, parent))
        conn.execute(sql.SQL(ROUTING).format(function=sql.Identifier(made.function), child=child))
    yield made
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for gid in prepared_of(pg_url, sink):  # a failed test's
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        for table in (made.parent, f"{made.parent}_pt", f"{made.parent}_ref"):
            drop = sql.SQL("DROP TABLE IF EXISTS {} CASCADE")  # with the view
            conn.execute(drop.format(sql.Identifier(table)))
        conn.execute(sql.SQL("DROP FUNCTION {}()").format(sql.Identifier(made.function)))


def trigger_text(routed: Routed) -> str:
    return (
        f"trigger route on public.{routed.parent} (BEFORE INSERT FOR EACH ROW, function "
        f"{routed.function}())"
    )


def test_a_table_whose_trigger_inserts_its_rows_in_a_subtransaction_is_refused_at_planning(
    pg_url: str, sink: str, routed: Routed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's routing trigger inserts each row into the child in a subtransaction:
    the child's rows carry the subtransaction's xid, which no marker names, so the view
    would show the committed partition of a batch whose driver died mid-commit. Refused
    by the driver's planning, before any task: nothing written, nothing prepared, no
    view made."""
    routed.add_trigger(pg_url)
    writer = Writer(pg_url, routed.parent, sink, f"q-{sink}", extra={"consistentView": routed.view})
    with pytest.raises(ConfigError) as refused:
        writer.commit(0, [write(writer, planned(writer), 0, 0, range(0, 3))])  # makes the view
        dies_mid_commit(monkeypatch)
        target = planned(writer)
        outcomes: list[PartitionOutcome | None] = [
            write(writer, target, 1, 0, range(100, 105)),
            write(writer, target, 1, 1, range(200, 205)),
        ]
        commit_dying(writer, 1, outcomes)
        seen = ids(pg_url, routed.view)
        assert seen == [0, 1, 2], f"a reader of the view sees part of batch 1: {seen}"
    message = str(refused.value)
    assert message.startswith(
        f"option consistentView=public.{routed.view}: table public.{routed.parent} has 1 "
        f"enabled trigger(s) that fire on the sink's inserts: {trigger_text(routed)}. "
    ), message
    assert "inside a subtransaction (a PL/pgSQL block with EXCEPTION" in message
    assert "cannot relate to their batch" in message
    assert "Nothing was written" in message
    assert "Fix: drop the option consistentView" in message
    assert "move the routing to declarative partitioning" in message
    assert ids(pg_url, routed.parent) == []  # the parent and its child
    assert prepared_of(pg_url, sink) == []
    assert not exists(pg_url, routed.view)
    assert q(pg_url, "SELECT count(*) FROM sqlsink.markers WHERE sink_id = %s", (sink,)) == [(0,)]


def test_a_trigger_made_after_planning_is_refused_at_the_commit_before_the_decision(
    pg_url: str, sink: str, routed: Routed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 is planned before the routing trigger exists; its tasks then write through
    it. The commit keeps the view under the sink lock before deciding: it finds the
    trigger and refuses, so nothing of batch 1 is committed; the abort that follows
    (Spark's) rolls its partitions back."""
    writer = Writer(pg_url, routed.parent, sink, f"q-{sink}", extra={"consistentView": routed.view})
    writer.commit(0, [write(writer, planned(writer), 0, 0, range(0, 3))])
    assert ids(pg_url, routed.view) == [0, 1, 2]
    target = planned(writer)  # no trigger yet
    routed.add_trigger(pg_url)
    outcomes: list[PartitionOutcome | None] = [
        write(writer, target, 1, 0, range(100, 105)),
        write(writer, target, 1, 1, range(200, 205)),
    ]
    assert len(prepared_of(pg_url, sink)) == 2
    dies_mid_commit(monkeypatch)
    with pytest.raises(ConfigError) as refused:
        commit_dying(writer, 1, outcomes)
        seen = ids(pg_url, routed.view)
        assert seen == [0, 1, 2], f"a reader of the view sees part of batch 1: {seen}"
    monkeypatch.undo()
    message = str(refused.value)
    assert trigger_text(routed) in message, message
    assert "Nothing of the batch is committed" in message
    writer.abort(1, outcomes)
    assert prepared_of(pg_url, sink) == []
    assert ids(pg_url, routed.parent) == [0, 1, 2]
    assert ids(pg_url, routed.view) == [0, 1, 2]


@pytest.mark.parametrize(
    "case",
    [
        "statement trigger on a grandchild",
        "trigger of a partitioned table, named once",
        "constraint trigger on a partition",
    ],
)
def test_every_enabled_insert_trigger_of_the_table_or_a_descendant_is_named(
    pg_url: str, sink: str, routed: Routed, case: str
) -> None:
    """The catalog cannot tell a trigger that writes rows in a subtransaction from one that
    does not: every enabled trigger that fires on an insert into the table or a
    descendant is refused, and named with its table."""
    parent, child, fn = routed.parent, routed.child, routed.function
    table = parent
    if case == "statement trigger on a grandchild":
        q(pg_url, f"CREATE TABLE {child}_x () INHERITS ({child})")
        q(pg_url, f"CREATE TRIGGER st AFTER INSERT ON {child}_x EXECUTE FUNCTION {fn}()")
        expect = [f"trigger st on public.{child}_x (AFTER INSERT FOR EACH STATEMENT, function"]
    elif case == "trigger of a partitioned table, named once":
        table = f"{parent}_pt"
        q(pg_url, f"CREATE TABLE {table} (id bigint) PARTITION BY RANGE (id)")
        for n in range(2):
            q(
                pg_url,
                f"CREATE TABLE {table}_{n} PARTITION OF {table} "
                f"FOR VALUES FROM ({n * 100}) TO ({n * 100 + 100})",
            )
        q(
            pg_url,
            f'CREATE TRIGGER "Tg" BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {fn}()',
        )
        expect = [f'trigger "Tg" on public.{table} (BEFORE INSERT FOR EACH ROW, function']
    else:
        table = f"{parent}_pt"
        q(pg_url, f"CREATE TABLE {table} (id bigint) PARTITION BY RANGE (id)")
        q(pg_url, f"CREATE TABLE {table}_0 PARTITION OF {table} FOR VALUES FROM (0) TO (100)")
        q(
            pg_url,
            f"CREATE CONSTRAINT TRIGGER ct AFTER INSERT OR UPDATE ON {table}_0 "
            f"DEFERRABLE FOR EACH ROW EXECUTE FUNCTION {fn}()",
        )
        expect = [f"trigger ct on public.{table}_0 (AFTER INSERT OR UPDATE FOR EACH ROW, function"]
    writer = Writer(pg_url, table, sink, f"q-{sink}", extra={"consistentView": routed.view})
    with pytest.raises(ConfigError) as refused:
        planned(writer)
    message = str(refused.value)
    assert f"has {len(expect)} enabled trigger(s)" in message, message
    for text in expect:
        assert text in message, message
    assert message.count(" on public.") == len(expect), message  # no other, no clone


@pytest.mark.parametrize(
    "case", ["declarative partitions", "disabled trigger", "update trigger", "foreign key"]
)
def test_a_table_without_enabled_insert_triggers_keeps_its_view_whole(
    pg_url: str, sink: str, routed: Routed, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fix the refusal names (declarative partitioning: the server routes rows, no
    trigger), and triggers that never fire on the sink's inserts or write nothing (an
    internal foreign-key trigger): accepted, and the view hides a batch torn mid-commit."""
    parent, fn = routed.parent, routed.function
    table = parent
    if case == "declarative partitions":
        table = f"{parent}_pt"
        q(pg_url, f"CREATE TABLE {table} (id bigint) PARTITION BY RANGE (id)")
        for n in range(3):
            q(
                pg_url,
                f"CREATE TABLE {table}_{n} PARTITION OF {table} "
                f"FOR VALUES FROM ({n * 100}) TO ({n * 100 + 100})",
            )
    elif case == "disabled trigger":
        routed.add_trigger(pg_url)
        q(pg_url, f"ALTER TABLE {parent} DISABLE TRIGGER route")
    elif case == "update trigger":
        q(
            pg_url,
            f"CREATE TRIGGER upd BEFORE UPDATE ON {parent} FOR EACH ROW EXECUTE FUNCTION {fn}()",
        )
    else:
        q(pg_url, f"CREATE TABLE {parent}_ref (id bigint PRIMARY KEY)")
        q(pg_url, f"INSERT INTO {parent}_ref SELECT generate_series(0, 299)")
        q(
            pg_url,
            f"ALTER TABLE {parent} ADD CONSTRAINT fk FOREIGN KEY (id) REFERENCES {parent}_ref",
        )
    writer = Writer(pg_url, table, sink, f"q-{sink}", extra={"consistentView": routed.view})
    writer.commit(0, [write(writer, planned(writer), 0, 0, range(0, 3))])
    dies_mid_commit(monkeypatch)
    target = planned(writer)
    outcomes: list[PartitionOutcome | None] = [
        write(writer, target, 1, 0, range(100, 105)),
        write(writer, target, 1, 1, range(200, 205)),
    ]
    commit_dying(writer, 1, outcomes)
    monkeypatch.undo()
    assert len(ids(pg_url, table)) == 8  # the bare table shows part of batch 1
    assert ids(pg_url, routed.view) == [0, 1, 2]  # the view none of it
    with writer.committer() as committer:
        committer.recover()
    assert ids(pg_url, routed.view) == [0, 1, 2, *range(100, 105), *range(200, 205)]
    assert prepared_of(pg_url, sink) == []


# -- an upsert or replace into a table a view of the sink shows ----------------------------


@dataclass(frozen=True)
class Keyed:
    table: str  # (id bigint PRIMARY KEY, v text)
    view: str


@pytest.fixture
def keyed_v(pg_url: str, sink: str) -> Iterator[Keyed]:
    name = f"kv_{uuid.uuid4().hex[:10]}"
    made = Keyed(name, f"{name}_whole")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(sql.Identifier(name))
        )
    yield made
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for gid in prepared_of(pg_url, sink):  # a failed test's
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        for table in (name, f"{name}_pt"):
            drop = sql.SQL("DROP TABLE IF EXISTS {} CASCADE")  # with the view
            conn.execute(drop.format(sql.Identifier(table)))


def rows_of(url: str, relation: str) -> Rows:
    return q(url, sql.SQL("SELECT id, v FROM {} ORDER BY id").format(sql.Identifier(relation)))


OLD = [(1, "old"), (2, "old"), (3, "old"), (4, "old")]


@pytest.mark.parametrize("mode", ["upsert", "replace"])
def test_a_later_batch_that_upserts_a_table_the_sinks_view_shows_is_refused_before_its_job(
    pg_url: str, sink: str, keyed_v: Keyed, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 0 appends keys 1..4 through the view; batch 1 of the same sink (a later
    foreachBatch batch, or a restart of the data source with other options) upserts keys
    1 and 3, no view given. Its committed partition would have deleted key 1's old
    version, and the view hides the new one: key 1 would be in the table and in no
    version in the view. Refused by the planning of batch 1, before its job."""
    run = uuid.uuid4().hex
    appender = Writer(
        pg_url, keyed_v.table, sink, f"q-{sink}", run=run, extra={"consistentView": keyed_v.view}
    )
    rewriter = Writer(pg_url, keyed_v.table, sink, f"q-{sink}", run=run, extra={"mode": mode})
    target = planned(appender, text=True)
    appender.commit(0, [write(appender, target, 0, 0, [1, 2, 3, 4], "old")])
    assert rows_of(pg_url, keyed_v.view) == OLD
    dies_mid_commit(monkeypatch)
    with pytest.raises(ConfigError) as refused:
        target = planned(rewriter, text=True)  # the part's planning, before its job
        outcomes: list[PartitionOutcome | None] = (
            [write(rewriter, target, 1, 0, [1], "new"), write(rewriter, target, 1, 1, [3], "new")]
            if mode == "upsert"
            else [write(rewriter, target, 1, 0, [1, 3], "new")]  # replace: one partition
        )
        # dies after the first COMMIT PREPARED (for replace: before its markers are gone)
        commit_dying(rewriter, 1, outcomes)
        seen = rows_of(pg_url, keyed_v.view)
        assert [k for k, _ in seen] == [1, 2, 3, 4], f"keys vanish from the view: {seen}"
    monkeypatch.undo()
    message = str(refused.value)
    assert message == (
        f"sink {sink}: table public.{keyed_v.table} cannot be written with mode={mode}: the "
        f"sink's consistent view public.{keyed_v.view} shows it. A batch of that mode "
        "replaces and deletes rows, and once one of its transactions is committed the rows "
        "it replaced or deleted are gone, so no view can show the table as it was before "
        f"the batch while the rest commits: readers of public.{keyed_v.view} would see rows "
        f"vanish. Fix: write public.{keyed_v.table} with mode=append only, or, if no reader "
        f"uses public.{keyed_v.view} any more, DROP VIEW public.{keyed_v.view} and give it no "
        "longer (view=..., option consistentView). Nothing was written"
    )
    assert prepared_of(pg_url, sink) == []
    assert rows_of(pg_url, keyed_v.table) == OLD
    assert rows_of(pg_url, keyed_v.view) == OLD
    # dropped (readers moved to the table), the same upsert goes through
    q(pg_url, sql.SQL("DROP VIEW {}").format(sql.Identifier(keyed_v.view)))
    target = planned(rewriter, text=True)
    rewriter.commit(1, [write(rewriter, target, 1, 0, [1, 3], "new")])
    expect = [(1, "new"), (2, "old"), (3, "new"), (4, "old")]
    assert rows_of(pg_url, keyed_v.table) == (expect if mode == "upsert" else expect[::2])


@pytest.mark.parametrize("viewed", ["the parent", "the partition"])
def test_an_upsert_into_a_partition_or_the_parent_of_the_viewed_table_is_refused(
    pg_url: str, sink: str, keyed_v: Keyed, viewed: str
) -> None:
    """A view over a partitioned table shows its partitions' rows, and a view over a
    partition shows rows an upsert into its parent routes there: the same rewrite."""
    parent = f"{keyed_v.table}_pt"
    q(pg_url, f"CREATE TABLE {parent} (id bigint PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    q(pg_url, f"CREATE TABLE {parent}_0 PARTITION OF {parent} FOR VALUES FROM (0) TO (100)")
    shown, written = (parent, f"{parent}_0") if viewed == "the parent" else (f"{parent}_0", parent)
    appender = Writer(pg_url, shown, sink, f"q-{sink}", extra={"consistentView": keyed_v.view})
    appender.commit(0, [write(appender, planned(appender, text=True), 0, 0, [1, 2], "old")])
    upserter = Writer(pg_url, written, sink, f"q-{sink}", extra={"mode": "upsert"})
    with pytest.raises(ConfigError) as refused:
        planned(upserter, text=True)
    message = str(refused.value)
    assert message.startswith(
        f"sink {sink}: table public.{written} cannot be written with mode=upsert: the "
        f'sink\'s consistent view public.{keyed_v.view} shows it (its table "public".'
        f'"{shown}" shares rows with public.{written}). '
    ), message
    assert prepared_of(pg_url, sink) == []
    # another sink's view is that sink's: this sink's upsert is not refused by it
    other = Writer(pg_url, written, f"{sink}-b", "q-other", extra={"mode": "upsert"})
    planned(other, text=True)
