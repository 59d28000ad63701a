"""Consistent views through the foreachBatch writer (``view=`` per appended table): a
batch of two tables, each with its view, is seen whole through both views or not at
all, by a reader polling during real commits and after a real kill mid-commit.
(The data source's view: tests/spark/test_consistent_view.py; what the view hides,
statement by statement: tests/pg/test_consistent_view.py.)"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import sqlsink
from sqlsink.errors import ConfigError
from sqlsink.postgres import views
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.fb_windows import TwoTables, killed_at, restarted
from tests.spark.streams import table_ids

pytestmark = pytest.mark.spark


def counts(conn: psycopg.Connection[Any], orders: str, lines: str) -> tuple[int, ...]:
    """In one statement (one snapshot): the two views, their join, the two bare tables."""
    o, o_view = sql.Identifier(orders), sql.Identifier("v_" + orders)
    li, l_view = sql.Identifier(lines), sql.Identifier("v_" + lines)
    row = conn.execute(
        sql.SQL(
            "SELECT (SELECT count(*) FROM {ov}), (SELECT count(*) FROM {lv}), "
            "(SELECT count(*) FROM {ov} JOIN {lv} USING (id)), "
            "(SELECT count(*) FROM {o}), (SELECT count(*) FROM {li})"
        ).format(ov=o_view, lv=l_view, o=o, li=li)
    ).fetchone()
    assert row is not None
    return tuple(int(n) for n in row)


@pytest.fixture
def two_tables(pg_url: str, pg_server: PgServer, tmp_path: Path) -> Iterator[TwoTables]:
    tables = TwoTables.create(
        pg_url, pg_server.admin_url, uuid.uuid4().hex[:10], tmp_path, views=True
    )
    yield tables
    tables.drop()


@pytest.mark.crash
def test_killed_mid_commit_the_views_of_both_tables_hide_the_batch_until_it_is_finished(
    spark: Any, tmp_path: Path, pg_url: str, two_tables: TwoTables
) -> None:
    """The driver SIGKILLed between the two COMMIT PREPAREDs of batch 1: one table holds
    its part, the other's is prepared. Both views, and their join, show batch 0 only;
    the restart finishes batch 1 and the views then show every record."""
    from tests.spark.foreach_batch_driver import run
    from tests.spark.foreach_batch_driver import two_tables as function

    tables = two_tables
    killed_at(tables, "mid_commit", sys.executable, tmp_path)  # bare tables: 30 and 70
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert counts(conn, tables.orders, tables.lines)[:3] == (30, 30, 30)
        [hidden] = views.hidden_batches(conn, tables.sink_id)  # what status reports
        assert (hidden.batch_id, hidden.partitions, hidden.rows, hidden.of_partitions) == (
            1,
            1,
            40,
            2,
        )
        found = sorted(
            (v.view.name, v.table) for v in views.find_views(conn) if v.sink_id == tables.sink_id
        )
    assert found == [
        ("v_" + tables.lines, f'"public"."{tables.lines}"'),
        ("v_" + tables.orders, f'"public"."{tables.orders}"'),
    ]
    run(spark, tables.source, tables.checkpoint, function(*_args(tables), views=True))
    restarted(tables)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert counts(conn, tables.orders, tables.lines) == (100, 100, 100, 100, 100)
        left = "SELECT count(*) FROM sqlsink.markers WHERE sink_id = %s"
        assert conn.execute(left, (tables.sink_id,)).fetchone() == (0,)


def _args(tables: TwoTables) -> tuple[str, str, str, str]:
    return (tables.url, tables.sink_id, tables.orders, tables.lines)


def test_a_reader_of_two_views_sees_the_same_whole_batches_in_every_snapshot(
    spark: Any,
    pg_url: str,
    pg_server: PgServer,
    two_tables: TwoTables,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four batches of two tables, two partitions each (four transactions a batch), with
    a 0.15 s pause after each COMMIT PREPARED; a reader polls both views, their join and
    the bare tables in one statement every few milliseconds. Every sample of the views
    is a whole number of batches, the same in both; the bare tables show part of a batch
    in some samples (counted: the windows were there to see)."""
    tables = two_tables
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "mid_commit", "action": "sleep", "seconds": 0.15}]))
    monkeypatch.setenv("SQLSINK_FAULTS_FILE", str(faults))  # the committer runs here
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=tables.sink_id, query_id="q-views")
    bounds = [0, 30, 70, 120, 200]
    whole = set(bounds)
    samples: list[tuple[int, ...]] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def read() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                while not stop.is_set():
                    # the views are created at the first commit
                    with contextlib.suppress(psycopg.errors.UndefinedTable):
                        samples.append(counts(conn, tables.orders, tables.lines))
                    time.sleep(0.003)
        except BaseException as exc:
            failures.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for batch_id, (low, high) in enumerate(itertools.pairwise(bounds)):
            df = spark.range(low, high).repartition(2)
            with writer.batch(batch_id) as b:
                b.append(
                    df.selectExpr("id", "'p' AS payload"), tables.orders, view="v_" + tables.orders
                )
                b.append(
                    df.selectExpr("id", "CAST(1.5 AS double) AS amount"),
                    tables.lines,
                    view="v_" + tables.lines,
                )
    finally:
        stop.set()
        reader.join(timeout=30)
    assert not failures, failures
    torn_views = [s for s in samples if not (s[0] == s[1] == s[2] and s[0] in whole)]
    torn_tables = [s for s in samples if not (s[3] == s[4] and s[3] in whole)]
    print(f"\n{len(samples)} samples; bare tables torn in {len(torn_tables)}, views in 0")
    assert torn_views == []
    assert len(torn_tables) >= 4  # the reader did look inside the commit windows
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the reader may stop mid-commit
        assert counts(conn, tables.orders, tables.lines) == (200, 200, 200, 200, 200)
    assert prepared_transactions(pg_server.admin_url) == []


def test_view_mistakes_are_refused_before_anything_is_committed(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """The writer option, a view with upsert, and one view named for two tables."""
    with pytest.raises(ConfigError, match=r"given per table.*to\(table, view=\.\.\.\)"):
        sqlsink.ForeachBatchWriter(url=pg_url, sink_id="fb-v", consistentView="v")
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", query_id="q-refused", createTable="true"
    )
    with pytest.raises(ConfigError, match="consistentView cannot be used with mode=upsert"):
        writer.to(table, mode="upsert", key=["id"], view="v_" + table)
    other = table + "_b"
    twice = r"view public\.v_\w+ is given for table public\.t_"
    with pytest.raises(ConfigError, match=twice), writer.batch(0) as b:
        b.append(spark.range(0, 5), table, view="v_" + table)
        b.append(spark.range(5, 9), other, view="v_" + table)
    assert table_ids(pg_url, table) == []  # the first part was prepared, then rolled back
    assert prepared_transactions(pg_server.admin_url) == []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass(%s)", ("v_" + table,)).fetchone() == (None,)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(other)))


@pytest.mark.parametrize("order", ["upsert after the view", "view after the upsert", "later batch"])
def test_an_upsert_into_a_table_a_view_of_the_sink_shows_is_refused_before_its_job(
    spark: Any,
    pg_url: str,
    table: str,
    pg_server: PgServer,
    order: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The table holds keys 1..4. One part of the sink's batch appends keys 5..8 with
    view=..., another upserts keys 1 and 3 (two partitions), in either order in one batch,
    or the upsert in the next batch. The committed upsert partition deletes the old
    versions and the view hides the new ones: a reader would see keys 1 and 3 vanish
    while the batch is committed in part. Refused before the upsert's (or the view's)
    job, with nothing of that batch committed. A reader looks after each COMMIT PREPARED
    of the driver's commits."""
    view = "v_" + table
    sink = f"fb-{table[2:]}"
    q = sql.SQL
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            q("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(sql.Identifier(table))
        )
        conn.execute(
            q("INSERT INTO {} SELECT i, 'old' FROM generate_series(1, 4) i").format(
                sql.Identifier(table)
            )
        )
    seen: list[list[int]] = []

    def look(name: str, batch_id: int, *args: object, **kwargs: object) -> None:
        if name == "mid_commit":
            with psycopg.connect(pg_url, autocommit=True) as conn:
                rows = conn.execute(q("SELECT id FROM {} ORDER BY id").format(sql.Identifier(view)))
                seen.append([int(r[0]) for r in rows])

    monkeypatch.setattr("sqlsink.core.resolver.crash_point", look)
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink, query_id="q-rewrite")
    appended = spark.range(5, 9).selectExpr("id", "'new' AS v").repartition(2)
    upserted = spark.createDataFrame([(1, "new"), (3, "new")], "id long, v string").repartition(2)
    try:
        with pytest.raises(ConfigError) as refused:
            if order == "later batch":
                with writer.batch(0) as b:
                    b.append(appended, table, view=view)
                with writer.batch(1) as b:
                    b.upsert(upserted, table)
            else:
                with writer.batch(0) as b:
                    if order == "upsert after the view":
                        b.append(appended, table, view=view)
                        b.upsert(upserted, table)
                    else:
                        b.upsert(upserted, table)
                        b.append(appended, table, view=view)
            whole = [1, 2, 3, 4, 5, 6, 7, 8]
            torn = [s for s in seen if not set(s) <= set(whole) or not {1, 2, 3, 4} <= set(s)]
            assert torn == [], f"keys vanish from the view mid-commit: {torn}"
        message = str(refused.value)
        part = {"upsert after the view": 1, "view after the upsert": 0, "later batch": 0}[order]
        batch = 1 if order == "later batch" else 0
        where = f"sink {sink}" + ("" if order == "later batch" else f": batch {batch}, part {part}")
        assert message.startswith(
            f"{where}: table public.{table} cannot be written with mode=upsert: the sink's "
            f"consistent view public.{view} shows it. A batch of that mode replaces and deletes "
            "rows"
        ), message
        assert f"DROP VIEW public.{view}" in message
        after = {
            "upsert after the view": "An earlier part of this batch gives the view; nothing of "
            "the batch is committed",
            "view after the upsert": f"Part 1 of this batch gives the view public.{view} of "
            f"table public.{table}; nothing of the batch is committed",
            "later batch": "Nothing was written",
        }[order]
        assert message.endswith(after), message
        assert prepared_transactions(pg_server.admin_url) == []
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(q("SELECT id, v FROM {} ORDER BY id").format(sql.Identifier(table)))
            expect = [(i, "old") for i in range(1, 5)]
            if order == "later batch":  # batch 0 is committed, batch 1 refused
                expect += [(i, "new") for i in range(5, 9)]
            assert rows.fetchall() == expect
            made = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{view}",))
            assert made.fetchone() == (order == "later batch",)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(q("DROP VIEW IF EXISTS {}").format(sql.Identifier(view)))
