"""The consistent view (option consistentView; docs/DESIGN.md invariant 13), against a
real PostgreSQL: a reader of the bare table catches a batch half committed, a reader of
the view never does, whatever happens between two COMMIT PREPAREDs.

The committer's ``mid_commit`` fault point (after each COMMIT PREPARED) is where the
tests look: a reader on its own connection counts the rows of the table and of the view
in one statement (one snapshot), or the point raises, as a driver that dies there.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.committer import Committer
from sqlsink.core.gid import Gid
from sqlsink.core.model import NewDecision
from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions
from sqlsink.postgres import views
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.tablename import TableName
from tests.pg.protocol import Writer, make_table, prepared_of

Conn = psycopg.Connection[tuple[Any, ...]]
Reading = tuple[int, int]  # (rows of the bare table, rows of the view), one snapshot


@pytest.fixture
def view(pg_url: str) -> Iterator[str]:
    """A view name in the public schema, dropped after the test (before its table)."""
    name = f"v_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        kind = conn.execute("SELECT relkind::text FROM pg_class WHERE relname = %s", (name,))
        found = kind.fetchone()
        if found is not None:  # a test may have put a table there
            what = sql.SQL("VIEW" if found[0] == "v" else "TABLE")
            conn.execute(sql.SQL("DROP {} {}").format(what, sql.Identifier("public", name)))


def read(url: str, table: str, view: str) -> Reading:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {})").format(
                sql.Identifier(table), sql.Identifier(view)
            )
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def count(url: str, table: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return int(row.fetchone()[0])  # type: ignore[index]


def at_mid_commit(monkeypatch: pytest.MonkeyPatch, action: Callable[[int], None]) -> None:
    """Run ``action(batch)`` after every COMMIT PREPARED of the committer."""

    def point(name: str, batch_id: int, *args: object, **kwargs: object) -> None:
        if name == "mid_commit":
            action(batch_id)

    monkeypatch.setattr("sqlsink.core.resolver.crash_point", point)


def viewing(url: str, table: str, sink: str, view: str) -> Writer:
    return Writer(url, table, sink, query_id=f"q-{sink}", extra={"consistentView": view})


THREE = (range(100, 110), range(110, 120), range(120, 130))  # batch 1: three partitions


# -- the problem, and the view -------------------------------------------------------------


def test_a_reader_of_the_bare_table_sees_a_batch_half_committed(
    pg_url: str, keyed: str, sink: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the view exists: between two COMMIT PREPAREDs the table holds part of a batch."""
    writer = Writer(pg_url, keyed, sink, query_id=f"q-{sink}")
    writer.batch(0, range(10))
    seen: list[int] = []
    at_mid_commit(monkeypatch, lambda batch: seen.append(count(pg_url, keyed)))
    writer.batch(1, *THREE)
    assert seen == [20, 30, 40]  # 10 + one, two, three partitions of batch 1
    assert count(pg_url, keyed) == 40


def test_a_reader_of_the_view_sees_none_of_a_batch_until_all_of_it_is_committed(
    pg_url: str, keyed: str, sink: str, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(10))  # the run's first commit creates the view
    assert read(pg_url, keyed, view) == (10, 10)
    seen: list[Reading] = []
    at_mid_commit(monkeypatch, lambda batch: seen.append(read(pg_url, keyed, view)))
    writer.batch(1, *THREE)
    # after each COMMIT PREPARED: the table shows part of batch 1, the view none of it
    assert seen == [(20, 10), (30, 10), (40, 10)]
    assert read(pg_url, keyed, view) == (40, 40)  # complete: its markers are gone
    with psycopg.connect(pg_url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM sqlsink.markers WHERE sink_id = %s", (sink,))
        assert left.fetchone() == (0,)
        # the rows the view shows are the table's, column for column
        rows = sql.SQL("SELECT * FROM {} EXCEPT ALL SELECT * FROM {}")
        assert not conn.execute(rows.format(sql.Identifier(keyed), sql.Identifier(view))).fetchall()


@pytest.mark.parametrize("finish", ["recover", "next batch", "commit again"])
def test_a_driver_dying_mid_commit_leaves_the_batch_hidden_until_it_is_finished(
    pg_url: str, keyed: str, sink: str, view: str, monkeypatch: pytest.MonkeyPatch, finish: str
) -> None:
    """The driver dies after the first COMMIT PREPARED: the bare table shows a third of
    the batch until someone finishes it (minutes, or hours), the view none of it."""
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(10))

    def die(batch: int) -> None:
        raise RuntimeError("the driver dies here")

    at_mid_commit(monkeypatch, die)
    outcomes = [writer.write(1, ids, p) for p, ids in enumerate(THREE)]
    with pytest.raises(RuntimeError, match="dies"):
        writer.commit(1, list(outcomes))
    monkeypatch.undo()
    assert len(prepared_of(pg_url, sink)) == 2
    assert read(pg_url, keyed, view) == (20, 10)
    time.sleep(0.05)
    assert read(pg_url, keyed, view) == (20, 10)  # for as long as nobody finishes it
    if finish == "recover":  # sqlsink recover runs exactly this
        with writer.committer() as committer:
            committer.recover()
        assert read(pg_url, keyed, view) == (40, 40)
    elif finish == "next batch":  # a new run's first task resolves the leftovers
        restarted = viewing(pg_url, keyed, sink, view)
        restarted.batch(2, range(200, 205))
        assert read(pg_url, keyed, view) == (45, 45)
    else:  # Spark's abort(), or a repeated commit(): the decided batch rolls forward
        writer.commit(1, list(outcomes))
        assert read(pg_url, keyed, view) == (40, 40)
    assert prepared_of(pg_url, sink) == []


# -- several tables of one sink ---------------------------------------------------------


def _prepare_two_tables(url: str, sink: str, run: str, tables: tuple[str, str]) -> list[str]:
    """What the foreachBatch writer will do: one transaction per partition writing two
    tables and one marker, prepared (batch 1, partitions 0-2, ten rows per table each)."""
    gids = []
    for partition in range(3):
        gid = str(Gid(sink, 1, partition, run, partition + 1))
        with psycopg.connect(url) as conn:
            for table in tables:
                conn.execute(
                    sql.SQL("INSERT INTO {} SELECT generate_series(%s::bigint, %s::bigint)").format(
                        sql.Identifier(table)
                    ),
                    (partition * 10, partition * 10 + 9),
                )
            conn.execute(
                "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
                "VALUES (%s, %s, 1, %s, 20)",
                (gid, sink, partition),
            )
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        gids.append(gid)
    return gids


@pytest.fixture
def second_table(pg_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    make_table(pg_url, name)
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_views_of_two_tables_of_one_sink_agree_on_the_complete_batches(
    pg_url: str, keyed: str, second_table: str, sink: str, view: str
) -> None:
    """Two views over two tables written by one transaction per partition: every view
    filters on the same sink's markers, so one snapshot of both (a join) sees the same
    batches, while a reader polls as the partitions are committed one by one."""
    tables = (keyed, second_table)
    names = (view, f"{view}_b")
    run = uuid.uuid4().hex
    gids = _prepare_two_tables(pg_url, sink, run, tables)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        backend = PostgresBackend(conn)  # type: ignore[arg-type]
        assert backend.insert_decision(NewDecision(sink, 1, gids, 60, f"q-{sink}", run))
        for name, table in zip(names, tables, strict=True):
            views.keep_view(conn, TableName("public", name), TableName("public", table), sink)  # type: ignore[arg-type]
    query = sql.SQL(
        "SELECT (SELECT count(*) FROM {va}), (SELECT count(*) FROM {vb}), "
        "(SELECT count(*) FROM {va} JOIN {vb} USING (id)), "
        "(SELECT count(*) FROM {ta}), (SELECT count(*) FROM {tb})"
    ).format(
        va=sql.Identifier(names[0]),
        vb=sql.Identifier(names[1]),
        ta=sql.Identifier(tables[0]),
        tb=sql.Identifier(tables[1]),
    )
    seen: list[tuple[int, ...]] = []
    stop = threading.Event()

    def poll() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(query).fetchone()
                assert row is not None
                seen.append(tuple(int(v) for v in row))

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for gid in gids[:2]:  # the committer's loop, slowed down; then it dies
                time.sleep(0.05)
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
            time.sleep(0.05)
            committer = Committer(PostgresBackend(conn), sink)  # type: ignore[arg-type]
            _, report = committer.recover()  # commits the last and completes the batch
            assert report.completed_batches == [1]
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join()
    views_seen = {s[:3] for s in seen}
    assert views_seen <= {(0, 0, 0), (30, 30, 30)}, views_seen  # never a part, and in step
    assert (0, 0, 0) in views_seen and (30, 30, 30) in views_seen
    tables_seen = {s[3:] for s in seen}
    assert {(10, 10), (20, 20)} & tables_seen, tables_seen  # the bare tables did show parts


# -- refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"mode": "upsert"}, "consistentView cannot be used with mode=upsert: .* replace"),
        ({"semantic": "at_least_once"}, "consistentView needs semantic=exactly_once"),
        ({"semantic": "none"}, "consistentView needs semantic=exactly_once .it is none"),
        ({"consistentView": "public.t"}, "is the target table itself"),
    ],
)
def test_what_the_view_cannot_guarantee_is_refused_before_anything_runs(
    extra: dict[str, str], match: str
) -> None:
    options = {"url": "postgresql://h/db", "table": "t", "consistentView": "v", **extra}
    with pytest.raises(ConfigError, match=match):
        SinkOptions.parse(options)


def test_the_view_name_defaults_to_the_tables_schema() -> None:
    parse = SinkOptions.parse
    opts = parse({"url": "postgresql://h/db", "table": "app.t", "consistentView": "t_whole"})
    assert opts.consistent_view == TableName("app", "t_whole")
    opts = parse({"url": "postgresql://h/db", "table": "app.t", "consistentView": "r.V"})
    assert opts.consistent_view == TableName("r", "v")


def _keep(conn: Conn, view: str, table: str, sink: str) -> str:
    return views.keep_view(conn, TableName("public", view), TableName("public", table), sink)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["table", "plain view", "another sink's view", "other table"])
def test_an_object_that_is_not_the_sinks_own_view_is_refused(
    pg_url: str, keyed: str, sink: str, view: str, kind: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        target = sql.Identifier(view)
        if kind == "table":
            conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(target))
            expect = f"public.{view} is a table owned by .*not a view the sink made"
        elif kind == "plain view":
            conn.execute(sql.SQL("CREATE VIEW {} AS SELECT 1 AS one").format(target))
            expect = "is a view owned by .*not a view the sink made.*name another view"
        elif kind == "another sink's view":
            _keep(conn, view, keyed, "other-sink")
            expect = f"consistent view of sink other-sink .*not of this sink .{sink}.*DROP VIEW"
        else:
            make_table(pg_url, f"{keyed}_old")
            _keep(conn, view, f"{keyed}_old", sink)
            expect = "this sink's view of table .*_old.*give each table its own view"
        try:
            with pytest.raises(ConfigError, match=expect):
                _keep(conn, view, keyed, sink)
            writer = viewing(pg_url, keyed, sink, view)
            named = writer.options.consistent_view
            assert named is not None
            with pytest.raises(ConfigError, match=expect):  # at planning, before any data
                views.check_before_writing(conn, named, writer.options.table, sink)  # type: ignore[arg-type]
            # and a query's commit: refused under the sink lock, before the decision
            outcome = writer.write(0, range(5))
            with pytest.raises(ConfigError, match=expect):
                writer.commit(0, [outcome])
            writer.abort(0, [outcome])  # Spark's abort: the undecided batch is rolled back
            assert count(pg_url, keyed) == 0 and prepared_of(pg_url, sink) == []
        finally:
            conn.execute(sql.SQL("DROP {} {}").format(sql.SQL(kind_sql(kind)), target))
            old = sql.Identifier(f"{keyed}_old")
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(old))


def kind_sql(kind: str) -> str:
    return "TABLE" if kind == "table" else "VIEW"


def test_a_role_that_may_not_delete_markers_is_refused_with_the_grant(
    pg_url: str, keyed: str, sink: str, view: str
) -> None:
    """Without DELETE the markers of complete batches stay, and the view would hide those
    batches for good."""
    role = f"nodelete_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        try:
            grants = (
                "GRANT USAGE ON SCHEMA sqlsink TO {r}",
                "GRANT SELECT, INSERT ON sqlsink.markers, sqlsink.decisions TO {r}",
                "GRANT SELECT ON {t} TO {r}",
                "GRANT CREATE ON SCHEMA public TO {r}",
            )
            for grant in grants:
                conn.execute(sql.SQL(grant).format(r=sql.Identifier(role), t=sql.Identifier(keyed)))
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            with pytest.raises(ConfigError) as refused:
                _keep(conn, view, keyed, sink)
            conn.execute("RESET ROLE")
            message = str(refused.value)
            assert f"role {role} may not DELETE FROM sqlsink.markers" in message
            assert f"GRANT DELETE ON sqlsink.markers TO {role}" in message
            assert "hide those batches for good" in message
            # with the grant, the same role creates it (readers then need SELECT on it only)
            conn.execute(
                sql.SQL("GRANT DELETE ON sqlsink.markers TO {}").format(sql.Identifier(role))
            )
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            assert _keep(conn, view, keyed, sink) == "created"
            conn.execute("RESET ROLE")
        finally:
            conn.execute("RESET ROLE")
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(view)))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- keeping it right ----------------------------------------------------------------------


def _view_columns(conn: Conn, view: str) -> list[str]:
    rows = conn.execute(
        "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "ORDER BY attnum",
        (f"public.{view}",),
    ).fetchall()
    return [str(r[0]) for r in rows]


def test_the_sink_replaces_its_own_view_when_the_table_gains_a_column(
    pg_url: str, keyed: str, sink: str, view: str, caplog: pytest.LogCaptureFixture
) -> None:
    reader = f"reader_{uuid.uuid4().hex[:8]}"
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(5))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(reader)))
        try:
            conn.execute(
                sql.SQL("GRANT SELECT ON {} TO {}").format(
                    sql.Identifier(view), sql.Identifier(reader)
                )
            )
            assert _view_columns(conn, view) == ["id"]
            assert _keep(conn, view, keyed, sink) == "kept"  # up to date: nothing done
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN note text").format(sql.Identifier(keyed))
            )
            writer.batch(1, range(5, 10))  # the next commit replaces it
            assert _view_columns(conn, view) == ["id", "note"]
            comment = conn.execute(
                "SELECT obj_description(%s::regclass, 'pg_class')", (f"public.{view}",)
            ).fetchone()
            assert comment is not None
            mark = views.parse_comment(comment[0])
            assert mark == views.ViewMark(views.FORMAT, sink, f'"public"."{keyed}"')
            granted = conn.execute(
                "SELECT has_table_privilege(%s, %s, 'SELECT')", (reader, f"public.{view}")
            ).fetchone()
            assert granted == (True,)  # replaced in place: readers' grants stay
            assert read(pg_url, keyed, view) == (10, 10)
            # a renamed column cannot be replaced in place: the view stays (and stays
            # consistent, with its old column names), and the sink says why
            conn.execute(
                sql.SQL("ALTER TABLE {} RENAME COLUMN note TO remark").format(sql.Identifier(keyed))
            )
            with caplog.at_level(logging.WARNING, logger="sqlsink"):
                assert _keep(conn, view, keyed, sink) == "stale"
            assert "could not be replaced" in caplog.text and "DROP VIEW" in caplog.text
            assert _view_columns(conn, view) == ["id", "note"]
            # dropped, it comes back at the next commit
            conn.execute(sql.SQL("DROP VIEW {}").format(sql.Identifier(view)))
            writer.batch(2, range(10, 15))
            assert _view_columns(conn, view) == ["id", "remark"]
            assert read(pg_url, keyed, view) == (15, 15)
        finally:
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(view)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(reader)))


def test_markers_that_hide_nothing_or_complete_batches_are_handled(
    pg_url: str, keyed: str, sink: str, view: str
) -> None:
    """A marker without xid (written before schema 5) hides nothing; markers of a batch
    that is complete (kept by a role without DELETE, or settled by hand) are deleted by
    the next keep, so that the view shows the batch."""
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(5))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # another writer's rows are shown as they are
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1000)").format(sql.Identifier(keyed)))
        # a batch's partition committed, its marker kept although the batch is complete
        conn.execute("BEGIN")
        conn.execute(sql.SQL("INSERT INTO {} VALUES (2000)").format(sql.Identifier(keyed)))
        conn.execute(
            "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
            "VALUES (%s, %s, 0, 9, 1)",
            (f"kept-{sink}", sink),
        )
        conn.execute("COMMIT")
        assert read(pg_url, keyed, view) == (7, 6)  # hidden
        hidden = views.hidden_batches(conn, sink)  # type: ignore[arg-type]
        assert hidden == [views.HiddenBatch(0, 1, 1, 1, True)]
        assert _keep(conn, view, keyed, sink) == "kept"  # and the stale marker is gone
        assert read(pg_url, keyed, view) == (7, 7)
        assert views.hidden_batches(conn, sink) == []  # type: ignore[arg-type]
        # a marker without xid, as schema 4 wrote them: it hides nothing
        conn.execute("BEGIN")
        conn.execute(sql.SQL("INSERT INTO {} VALUES (3000)").format(sql.Identifier(keyed)))
        conn.execute(
            "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows, xid) "
            "VALUES (%s, %s, 1, 0, 1, NULL)",
            (f"old-{sink}", sink),
        )
        conn.execute("COMMIT")
        assert read(pg_url, keyed, view) == (8, 8)


# -- the cost: nothing in flight, the table's own plan ---------------------------------------


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _outer_path(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The plan's spine: the root, then each node's outer child (no InitPlans, no SubPlans)."""
    node: dict[str, Any] | None = plan
    while node is not None:
        yield node
        node = next(
            (c for c in node.get("Plans", []) if c.get("Parent Relationship") == "Outer"), None
        )


def _explain(conn: Conn, query: sql.Composable) -> dict[str, Any]:
    row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(query)).fetchone()
    assert row is not None
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan: dict[str, Any] = doc[0]["Plan"]
    return plan


SCAN_KEYS = ("Node Type", "Relation Name", "Index Name", "Index Cond", "Parallel Aware")


def _scan(plan: dict[str, Any]) -> dict[str, Any]:
    """The scan of the table (the innermost node reading it)."""
    found = [n for n in _nodes(plan) if "Relation Name" in n and n["Relation Name"] != "markers"]
    assert found, plan
    return {k: found[-1].get(k) for k in SCAN_KEYS}


def _initplans(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The view's two InitPlans, in the order of its WHERE: "gate" (a marker of the
    sink?) and "xids" (the xids of its markers)."""
    found = [n for n in _nodes(plan) if n.get("Parent Relationship") == "InitPlan"]
    assert len(found) == 2, plan
    return dict(zip(("gate", "xids"), found, strict=True))


def _view_filter(text: str) -> bool:
    """The view's filter as EXPLAIN prints it: ((NOT $0) OR (xmin <> ALL ($1))) on 16."""
    return re.fullmatch(r"\(\(NOT .+\) OR \(xmin <> ALL \(.+\)\)\)", text) is not None


@pytest.mark.parametrize("seqscan", ["on", "off"])
def test_with_nothing_in_flight_the_view_runs_the_tables_own_scan(
    pg_url: str, keyed: str, sink: str, view: str, seqscan: str
) -> None:
    """EXPLAIN (ANALYZE) of count(*) and of a primary-key lookup: the view's plan
    is the table's scan (the key pushed into the index) with one filter whose first
    operand passes every row, and the xids of the markers are never read. The one thing
    given up: where the table's plan is an index-only scan, the view's reads the heap (the
    filter reads xmin): an index scan, or, for all rows, a scan of the table."""
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(0, 10_000), range(10_000, 20_000))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(keyed)))
        conn.execute(sql.SQL("SET enable_seqscan = {}").format(sql.SQL(seqscan)))
        conn.execute("SET max_parallel_workers_per_gather = 0")  # parallel: the next test
        queries = {
            "count": "SELECT count(*) FROM {}",
            "key": "SELECT * FROM {} WHERE id = 4242",
        }
        for what, text in queries.items():
            bare = _explain(conn, sql.SQL(text).format(sql.Identifier(keyed)))
            through = _explain(conn, sql.SQL(text).format(sql.Identifier(view)))
            assert not [n for n in _nodes(through) if n["Node Type"] in ("Append", "Result")]
            table_scan, view_scan = _scan(bare), _scan(through)
            if seqscan == "off" and what == "count":
                assert table_scan["Node Type"] == "Index Only Scan"
            if table_scan["Node Type"] == "Index Only Scan":  # the trade (docstring): the
                # heap is read, by the index (a key) or by a scan of the table (all rows)
                assert view_scan["Node Type"] in ("Index Scan", "Seq Scan"), through
                assert view_scan["Index Cond"] == table_scan["Index Cond"], through
            else:
                assert view_scan == table_scan, (what, bare, through)
            if what == "key":
                assert view_scan["Index Cond"] is not None
            [scan] = [n for n in _nodes(through) if n.get("Relation Name") == keyed]
            assert _view_filter(scan["Filter"]), scan
            gates = _initplans(through)
            assert gates["gate"]["Actual Loops"] == 1  # one probe of sqlsink.markers
            assert gates["xids"]["Actual Loops"] == 0  # never run: the first operand passed
            assert through["Actual Rows"] == bare["Actual Rows"]


def test_the_view_keeps_parallel_aggregates_and_the_tables_row_estimates(
    pg_url: str, keyed: str, sink: str, view: str
) -> None:
    """Format 1 (a UNION ALL of the table twice) made the planner count every row twice
    (2x the table's estimate, which misleads the plans of joins and aggregates over the
    view). One scan with a filter that the planner sees pass nearly every row: the
    table's estimate, and count(*) is still aggregated in parallel, the leader
    evaluating the InitPlans once for all workers."""
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(0, 10_000), range(10_000, 20_000))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(keyed)))
        for query in ("SELECT * FROM {}", "SELECT * FROM {} WHERE id < 5000"):
            bare, through = (
                conn.execute(
                    sql.SQL("EXPLAIN (FORMAT JSON) " + query).format(sql.Identifier(name))
                ).fetchone()[0][0]["Plan"]["Plan Rows"]  # type: ignore[index]
                for name in (keyed, view)
            )
            assert 0.9 * bare <= through <= 1.02 * bare, (query, bare, through)
        for setting in (
            "parallel_setup_cost = 0",
            "parallel_tuple_cost = 0",
            "min_parallel_table_scan_size = 0",
            "max_parallel_workers_per_gather = 2",
        ):
            conn.execute("SET " + setting)
        plan = _explain(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(view)))
        kinds = [(n["Node Type"], n.get("Partial Mode")) for n in _nodes(plan)]
        assert ("Gather", None) in kinds and ("Aggregate", "Partial") in kinds, kinds
        # the query's own Gather (an InitPlan may be parallel too, with a Gather of its own,
        # when the planner finds that cheaper: seen under load with parallel costs at 0)
        [gather] = [n for n in _outer_path(plan) if n["Node Type"] == "Gather"]
        assert len(gather.get("Params Evaluated", [])) == 2, gather
        [scan] = [n for n in _nodes(plan) if n.get("Relation Name") == keyed]
        assert scan["Parallel Aware"] and _view_filter(scan["Filter"]), scan
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(view)))
        assert row.fetchone() == (20_000,)


def test_with_a_batch_in_flight_the_view_hides_exactly_its_committed_partitions(
    pg_url: str, keyed: str, sink: str, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(10))
    hidden: list[list[int]] = []

    def look(batch: int) -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                sql.SQL("SELECT id FROM {} EXCEPT SELECT id FROM {} ORDER BY 1").format(
                    sql.Identifier(keyed), sql.Identifier(view)
                )
            ).fetchall()
            hidden.append([int(r[0]) for r in rows])
            found = views.hidden_batches(conn, sink)  # type: ignore[arg-type]
            assert [(h.batch_id, h.of_partitions, h.complete) for h in found] == [(1, 3, False)]

    at_mid_commit(monkeypatch, look)
    writer.batch(1, *THREE)
    assert [len(h) for h in hidden] == [10, 20, 30]
    assert hidden[-1] == list(range(100, 130))


def test_freezing_the_rows_of_a_hidden_partition_keeps_them_hidden(
    pg_url: str, keyed: str, sink: str, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen row keeps its xmin (PostgreSQL 9.4 on marks it frozen in its flags), so a
    batch stranded past vacuum_freeze_min_age stays hidden: the view's limit is the
    32-bit wraparound of xids, not freezing (docs/DESIGN.md invariant 13)."""
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(10))

    def die(batch: int) -> None:
        raise RuntimeError("the driver dies here")

    at_mid_commit(monkeypatch, die)
    outcomes = [writer.write(1, ids, p) for p, ids in enumerate(THREE)]
    with pytest.raises(RuntimeError, match="dies"):
        writer.commit(1, list(outcomes))
    monkeypatch.undo()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        table = sql.Identifier(keyed)
        conn.execute(sql.SQL("VACUUM (FREEZE) {}").format(table))
        row = conn.execute(
            "SELECT (SELECT relfrozenxid FROM pg_class WHERE oid = %s::regclass)::text::bigint,"
            " (SELECT xid FROM sqlsink.markers WHERE sink_id = %s)::text::bigint",
            (keyed, sink),
        ).fetchone()
        assert row is not None
        frozen_below, hidden_xid = row
        assert frozen_below > hidden_xid  # every row the partition wrote is frozen now
        still = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE xmin::text::bigint = %s").format(table),
            (hidden_xid,),
        ).fetchone()
        assert still == (10,)  # and still carries the partition's xid in its xmin
    assert read(pg_url, keyed, view) == (20, 10)
    with writer.committer() as committer:
        committer.recover()
    assert read(pg_url, keyed, view) == (40, 40)


# -- snapshots: every reader sees whole batches, whatever its isolation ------------------------


def _reader(url: str, isolation: str) -> Conn:
    conn = psycopg.connect(url, application_name="sqlsink-test-reader")
    conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
    return conn


def _counts(conn: Conn, table: str, view: str) -> Reading:
    row = conn.execute(
        sql.SQL("SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {})").format(
            sql.Identifier(table), sql.Identifier(view)
        )
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_repeatable_read_reader_sees_the_batches_of_its_snapshot_whole(
    pg_url: str, keyed: str, sink: str, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three REPEATABLE READ readers: one whose snapshot predates the commit of batch 1,
    one whose snapshot is taken after its first COMMIT PREPARED, and one that takes its
    snapshot there by reading something else (the bare table) and reads the view for
    the first time only after the batch is complete and its markers deleted (and the
    view replaced meanwhile by a newer format): each sees none of batch 1 through the
    view, for as long as its transaction lasts; a new transaction sees all of it."""
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(10))
    before, during, late = (_reader(pg_url, "REPEATABLE READ") for _ in range(3))
    try:
        assert _counts(before, keyed, view) == (10, 10)  # its snapshot: before batch 1
        seen: list[tuple[Reading, ...]] = []

        def look(batch: int) -> None:
            if not seen:  # after the first COMMIT PREPARED
                assert _counts(during, keyed, view) == (20, 10)
                assert count_in(late, keyed) == 20  # a snapshot, the view not read yet
            seen.append((_counts(before, keyed, view), _counts(during, keyed, view)))

        at_mid_commit(monkeypatch, look)
        writer.batch(1, *THREE)
        monkeypatch.undo()
        assert seen == [((10, 10), (20, 10))] * 3
        assert read(pg_url, keyed, view) == (40, 40)  # complete, for a new snapshot
        assert _counts(before, keyed, view) == (10, 10)
        assert _counts(during, keyed, view) == (20, 10)
        for reader in (before, during):  # they hold the view: let go, then it is replaced
            reader.commit()
            assert _counts(reader, keyed, view) == (40, 40)
            reader.commit()
        with psycopg.connect(pg_url, autocommit=True) as conn:  # an older format: replaced
            old = views.comment_text(sink, TableName("public", keyed))
            old = old.replace(f"(format {views.FORMAT})", "(format 1)")
            comment = sql.SQL("COMMENT ON VIEW {} IS {}")
            conn.execute(comment.format(sql.Identifier(view), sql.Literal(old)))
            assert _keep(conn, view, keyed, sink) == "replaced"
        assert _counts(late, keyed, view) == (20, 10)  # its first look at the view
        late.commit()
        assert _counts(late, keyed, view) == (40, 40)
    finally:
        for reader in (before, during, late):
            reader.close()


def count_in(conn: Conn, table: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
    return int(row.fetchone()[0])  # type: ignore[index]


def test_a_read_committed_transaction_sees_whole_batches_in_every_statement(
    pg_url: str, keyed: str, sink: str, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """READ COMMITTED: each statement has its own snapshot, and each sees whole batches;
    a cursor keeps the snapshot it was opened with; and after a driver died mid-commit,
    the batch stays hidden from every later statement until it is finished."""
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(10))
    reader = _reader(pg_url, "READ COMMITTED")
    try:
        assert _counts(reader, keyed, view) == (10, 10)
        cursor = reader.cursor(name="early")  # a server-side cursor: its snapshot is now
        cursor.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(view)))

        def die(batch: int) -> None:
            assert _counts(reader, keyed, view) == (20, 10)  # the same open transaction
            raise RuntimeError("the driver dies here")

        at_mid_commit(monkeypatch, die)
        outcomes = [writer.write(1, ids, p) for p, ids in enumerate(THREE)]
        with pytest.raises(RuntimeError, match="dies"):
            writer.commit(1, list(outcomes))
        monkeypatch.undo()
        assert _counts(reader, keyed, view) == (20, 10)
        with writer.committer() as committer:
            committer.recover()
        assert _counts(reader, keyed, view) == (40, 40)
        assert len(cursor.fetchall()) == 10  # opened before batch 1: none of it
        reader.commit()
    finally:
        reader.close()


# -- replacing a view of an older format ---------------------------------------------------


FORMAT_1 = (
    "CREATE VIEW {view} AS SELECT id FROM ("
    'SELECT id, true AS "sqlsink: nothing in flight", NULL::xid AS "sqlsink: row xid" '
    "FROM {table} UNION ALL SELECT id, false, xmin FROM {table}) AS sqlsink_rows "
    'WHERE "sqlsink: nothing in flight" = NOT EXISTS ('
    "SELECT FROM sqlsink.markers WHERE sink_id = {sink}) "
    'AND ("sqlsink: nothing in flight" OR "sqlsink: row xid" <> ALL (ARRAY('
    "SELECT xid FROM sqlsink.markers WHERE sink_id = {sink} AND xid IS NOT NULL)))"
)


def test_a_view_of_format_1_is_replaced_in_place_once_its_readers_let_go(
    pg_url: str,
    keyed: str,
    sink: str,
    view: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A view made by an older sqlsink (format 1, the UNION ALL): the next keep replaces
    it with CREATE OR REPLACE (grants stay). A reader whose transaction has read it holds
    it: the replacement waits REPLACE_LOCK_TIMEOUT_S, no longer, keeps the old view (it
    shows whole batches too) and names the session that holds it; the next keep after
    the reader's transaction ends replaces it."""
    monkeypatch.setattr("sqlsink.postgres.views.keeping.REPLACE_LOCK_TIMEOUT_S", 0.3)
    reader_role = f"reader_{uuid.uuid4().hex[:8]}"
    writer = viewing(pg_url, keyed, sink, view)
    writer.batch(0, range(5))  # the view, format 2
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP VIEW {}").format(sql.Identifier(view)))
        conn.execute(
            sql.SQL(FORMAT_1).format(
                view=sql.Identifier(view), table=sql.Identifier(keyed), sink=sql.Literal(sink)
            )
        )
        old_comment = views.comment_text(sink, TableName("public", keyed)).replace(
            f"(format {views.FORMAT})", "(format 1)"
        )
        conn.execute(
            sql.SQL("COMMENT ON VIEW {} IS {}").format(
                sql.Identifier(view), sql.Literal(old_comment)
            )
        )
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(reader_role)))
        try:
            conn.execute(
                sql.SQL("GRANT SELECT ON {} TO {}").format(
                    sql.Identifier(view), sql.Identifier(reader_role)
                )
            )
            reader = _reader(pg_url, "READ COMMITTED")
            try:
                assert _counts(reader, keyed, view) == (5, 5)  # holds the view now
                pid = reader.info.backend_pid
                started = time.monotonic()
                with caplog.at_level(logging.WARNING, logger="sqlsink"):
                    assert _keep(conn, view, keyed, sink) == "stale"
                assert time.monotonic() - started < 5
                assert f"session {pid} (role " in caplog.text, caplog.text
                assert "application 'sqlsink-test-reader'" in caplog.text
                assert "idle in transaction, its transaction open for" in caplog.text
                assert "held it for 0.3 s" in caplog.text and "format 1" in caplog.text
                assert "UNION ALL" in _viewdef(conn, view)  # the old one, still there
                writer.batch(1, range(5, 10))  # and still hiding what it must
                assert _counts(reader, keyed, view) == (10, 10)
            finally:
                reader.close()
            assert _keep(conn, view, keyed, sink) == "replaced"
            assert "UNION" not in _viewdef(conn, view)
            comment = conn.execute(
                "SELECT obj_description(%s::regclass, 'pg_class')", (f"public.{view}",)
            ).fetchone()
            assert comment is not None and views.parse_comment(comment[0]) == views.ViewMark(
                views.FORMAT, sink, f'"public"."{keyed}"'
            )
            granted = conn.execute(
                "SELECT has_table_privilege(%s, %s, 'SELECT')", (reader_role, f"public.{view}")
            ).fetchone()
            assert granted == (True,)
            assert _keep(conn, view, keyed, sink) == "kept"
            assert read(pg_url, keyed, view) == (10, 10)
        finally:
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(view)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(reader_role)))


def _viewdef(conn: Conn, view: str) -> str:
    row = conn.execute("SELECT pg_get_viewdef(%s::regclass)", (f"public.{view}",)).fetchone()
    assert row is not None
    return str(row[0])
