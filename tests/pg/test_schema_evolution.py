"""Option schemaEvolution at planning, on a real server: columns added, types widened,
every refusal in one message before anything changes, the lock wait naming its holder,
and the consistent view replaced to show a new column."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import types as T

from sqlsink.core.gid import Gid
from sqlsink.errors import ConfigError, TransientError
from sqlsink.options import SinkOptions
from sqlsink.postgres import views
from sqlsink.postgres.entry import POSTGRESQL
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import TargetPlan, plan_target
from sqlsink.spark.types import arrow_schema, column_type
from sqlsink.tablename import TableName
from tests.pg.protocol import Writer, prepare_by_hand


def plan(url: str, table: str, schema: T.StructType, **options: str) -> TargetPlan:
    """plan_target as the Spark adapter calls it (spark/plan.py), with the options given."""
    parsed = SinkOptions.parse({"url": url, "table": table, **options})

    def types(name: str) -> Any:
        return column_type(schema[name].dataType, name, POSTGRESQL)

    with psycopg.connect(url, autocommit=True) as conn:
        return plan_target(
            conn,  # type: ignore[arg-type]
            parsed,
            schema.fieldNames(),
            None,
            arrow_schema(schema),
            types,
        )


def make(url: str, table: str, columns: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute(
            sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), sql.SQL(columns))
        )


def columns_of(url: str, relation: str) -> list[tuple[str, str, bool]]:
    """(name, format_type, NOT NULL) of each column of a table or view."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT attname::text, format_type(atttypid, atttypmod), attnotnull "
            "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (relation,),
        ).fetchall()
    return [(str(n), str(t), bool(nn)) for n, t, nn in rows]


def schema_of(**fields: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(name, type_) for name, type_ in fields.items()])


V2 = schema_of(id=T.LongType(), note=T.StringType(), amount=T.DecimalType(12, 2))


def test_a_new_column_is_added_nullable_with_the_type_tables_type(pg_url: str, table: str) -> None:
    make(pg_url, table, "id bigint PRIMARY KEY")
    target = plan(pg_url, table, V2, schemaEvolution="addColumns")
    assert columns_of(pg_url, table) == [
        ("id", "bigint", True),
        ("note", "text", False),
        ("amount", "numeric(12,2)", False),
    ]
    assert [c.name for c in target.columns] == ["id", "note", "amount"]
    assert [c.type_name for c in target.columns] == ["bigint", "text", "numeric(12,2)"]


def test_the_second_planning_finds_the_columns_and_alters_nothing(pg_url: str, table: str) -> None:
    """A replay, or a run after a crash that followed the ALTER: the columns are found.
    Another session holds the table meanwhile (as a prepared partition would): an ALTER
    would wait for it and fail after lockTimeout; planning with nothing to add does not."""
    make(pg_url, table, "id bigint")
    first = plan(pg_url, table, V2, schemaEvolution="addColumns")
    with psycopg.connect(pg_url) as holder:
        holder.execute(sql.SQL("INSERT INTO {} (id) VALUES (1)").format(sql.Identifier(table)))
        second = plan(pg_url, table, V2, schemaEvolution="addColumns", lockTimeout="1s")
        holder.rollback()
    assert second == first
    assert [c[0] for c in columns_of(pg_url, table)] == ["id", "note", "amount"]


def test_without_the_option_a_new_column_is_refused_as_before(pg_url: str, table: str) -> None:
    make(pg_url, table, "id bigint")
    with pytest.raises(ConfigError) as caught:
        plan(pg_url, table, schema_of(id=T.LongType(), note=T.StringType()))
    assert str(caught.value) == (
        f"the DataFrame does not fit table public.{table}: column 'note' of the DataFrame "
        f"is not in table public.{table}. Fix: select/rename the DataFrame's columns to the "
        "table's, or alter the table"
    )
    assert [c[0] for c in columns_of(pg_url, table)] == ["id"]


def test_widen_widens_where_postgresql_keeps_the_values(
    pg_url: str, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    make(pg_url, table, "id integer, name varchar(10), amount numeric(10,2), ratio real")
    wider = schema_of(
        id=T.LongType(), name=T.StringType(), amount=T.DecimalType(14, 2), ratio=T.DoubleType()
    )
    with caplog.at_level(logging.INFO, logger="sqlsink"):
        plan(pg_url, table, wider, schemaEvolution="widen")
    assert columns_of(pg_url, table) == [
        ("id", "bigint", False),
        ("name", "text", False),
        ("amount", "numeric(14,2)", False),
        ("ratio", "double precision", False),
    ]
    rewrite = [r.getMessage() for r in caplog.records if "rewrites" in r.getMessage()]
    assert rewrite == [
        f"sqlsink: widening 'id', 'ratio' of table public.{table}: PostgreSQL rewrites the "
        "table and its indexes (no reader or writer of it gets on until that is done)"
    ]


def test_add_columns_alone_never_changes_a_columns_type(pg_url: str, table: str) -> None:
    make(pg_url, table, "id integer, name varchar(10)")
    plan(
        pg_url, table, schema_of(id=T.LongType(), name=T.StringType()), schemaEvolution="addColumns"
    )
    assert columns_of(pg_url, table) == [
        ("id", "integer", False),
        ("name", "character varying(10)", False),
    ]


def test_every_refusal_in_one_message_and_nothing_changed(pg_url: str, table: str) -> None:
    """A scale change (values would change), a NOT NULL column the stream dropped and a
    Spark type without a PostgreSQL one: refused together, each with its statement; the
    column that could be added is not added either."""
    make(pg_url, table, "id bigint, amount numeric(10,2), code text NOT NULL")
    given = schema_of(
        id=T.LongType(),
        amount=T.DecimalType(12, 4),
        during=T.DayTimeIntervalType(),
        note=T.StringType(),
    )
    with pytest.raises(ConfigError) as caught:
        plan(pg_url, table, given, schemaEvolution="widen")
    t = f"public.{table}"
    q = f'"public"."{table}"'
    assert str(caught.value) == (
        f"the DataFrame does not fit table {t}: "
        f"column 'code' of table {t} is NOT NULL without a default, and the DataFrame has "
        f'no such column. Fix: ALTER TABLE {q} ALTER COLUMN "code" DROP NOT NULL (its rows '
        "are then written NULL), or give it a value; "
        "column 'during': no PostgreSQL type for Spark type interval day to second; cast it "
        "in Spark (e.g. to string) or create the table yourself; "
        f"column 'amount' of table {t} is numeric(10,2) and the DataFrame's is "
        "decimal(12,4): more decimal places would change every stored value (1.50 becomes "
        "1.5000; PostgreSQL rewrites the table), so the sink does not widen it. Fix: "
        f'ALTER TABLE {q} ALTER COLUMN "amount" TYPE numeric(12,4), or cast the column in '
        "Spark to decimal(10,2). Fix: select/rename the DataFrame's columns to the table's, "
        "or alter the table"
    )
    assert [c[0] for c in columns_of(pg_url, table)] == ["id", "amount", "code"]


def test_a_dropped_nullable_column_is_written_null(pg_url: str, table: str, sink: str) -> None:
    make(pg_url, table, "id bigint, gone text, kept text DEFAULT 'k'")
    target = plan(pg_url, table, schema_of(id=T.LongType()), schemaEvolution="addColumns")
    assert [c.name for c in target.columns] == ["id"]
    Writer(pg_url, table, sink, None, extra={"schemaEvolution": "addColumns"}).batch(0, range(2))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, gone, kept FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
    assert rows == [(0, None, "k"), (1, None, "k")]


def test_the_lock_wait_names_the_prepared_transaction_and_recover(
    pg_url: str, table: str, sink: str
) -> None:
    """A killed run's prepared partition holds the table: the ALTER gives up after
    lockTimeout, names the gid and the command that resolves it, and changes nothing."""
    make(pg_url, table, "id bigint")
    gid = prepare_by_hand(pg_url, table, Gid(sink, 4, 0, "deadrun", 1), range(3))
    try:
        with pytest.raises(TransientError) as caught:
            plan(pg_url, table, V2, schemaEvolution="addColumns", lockTimeout="1s")
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    assert str(caught.value) == (
        f"schema evolution of table public.{table} (added column 'note' (text); added "
        "column 'amount' (numeric(12, 2))) waited 1 s for the table's lock, held by "
        f"prepared transaction {gid} (RowExclusiveLock on {table}). Nothing was changed or "
        "written. Fix: a prepared transaction holds it: sqlsink recover resolves those a "
        "stopped run left once the run is no longer live (runTimeout), or at once with "
        f"sqlsink recover --sink-id {sink} --force --run-id deadrun when you know run "
        "deadrun is dead (a running query's own are finished by its commit); then start "
        "again"
    )
    assert caught.value.context["prepared"] == [gid]
    assert [c[0] for c in columns_of(pg_url, table)] == ["id"]


def test_the_consistent_view_is_replaced_to_show_the_new_column(
    pg_url: str, table: str, sink: str
) -> None:
    make(pg_url, table, "id bigint")
    view = f"{table}_whole"
    writer = Writer(pg_url, table, sink, "q-1", extra={"consistentView": view})
    try:
        writer.batch(0, range(0, 3))
        assert [c[0] for c in columns_of(pg_url, view)] == ["id"]
        plan(
            pg_url,
            table,
            schema_of(id=T.LongType(), note=T.StringType()),
            schemaEvolution="addColumns",
        )
        writer.batch(1, range(3, 5))  # written as before the column: NULL in it
        assert [c[0] for c in columns_of(pg_url, view)] == ["id", "note"]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, note FROM {} ORDER BY id").format(sql.Identifier(view))
            ).fetchall()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(view)))
    assert rows == [(i, None) for i in range(5)]


def test_widening_a_column_a_view_reads_is_refused_with_the_statements(
    pg_url: str, table: str, sink: str
) -> None:
    make(pg_url, table, "id integer")
    view = f"{table}_whole"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE VIEW {} AS SELECT id FROM {}").format(
                sql.Identifier(view), sql.Identifier(table)
            )
        )
    try:
        with pytest.raises(ConfigError) as caught:
            plan(pg_url, table, schema_of(id=T.LongType()), schemaEvolution="widen")
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP VIEW {}").format(sql.Identifier(view)))
    assert str(caught.value) == (
        f"the DataFrame does not fit table public.{table}: column 'id' of table "
        f"public.{table} would be widened from integer to bigint, but view {view} reads it "
        "and PostgreSQL cannot change the type of a column a view reads. Fix: DROP VIEW "
        f'{view}; ALTER TABLE "public"."{table}" ALTER COLUMN "id" TYPE bigint; then create '
        "the view again (a consistent view of the sink is created again by its next batch: "
        "grant SELECT on it again)"
    )


def test_a_views_refusal_comes_before_the_alter(pg_url: str, table: str, sink: str) -> None:
    """plan_write hands plan_target the consistent view's check (``before_changes``): a
    view name taken by another object refuses the query with the table unchanged."""
    make(pg_url, table, "id bigint")
    taken = f"{table}_taken"
    schema = schema_of(id=T.LongType(), note=T.StringType())
    parsed = SinkOptions.parse(
        {"url": pg_url, "table": table, "schemaEvolution": "addColumns", "consistentView": taken}
    )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(taken)))
        try:
            with pytest.raises(ConfigError) as caught:
                plan_target(
                    conn,  # type: ignore[arg-type]
                    parsed,
                    schema.fieldNames(),
                    None,
                    arrow_schema(schema),
                    lambda name: column_type(schema[name].dataType, name, POSTGRESQL),
                    before_changes=lambda _: views.check_before_writing(
                        conn,  # type: ignore[arg-type]
                        TableName.parse(taken),
                        parsed.table,
                        sink,
                    ),
                )
        finally:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(taken)))
    assert "not a view the sink made" in str(caught.value)
    assert [c[0] for c in columns_of(pg_url, table)] == ["id"]
