"""Option schemaEvolution attacked at planning, on a real server: names that need
quoting or that PostgreSQL would truncate, Spark types without a PostgreSQL type, two
queries adding the same column at once, a widening behind a reader, upsert and
createTable with addColumns."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import types as T

from sqlsink.errors import ConfigError, SqlsinkError, TransientError
from sqlsink.options import SinkOptions
from sqlsink.postgres.entry import POSTGRESQL
from sqlsink.postgres.target import plan_target
from sqlsink.spark.types import arrow_schema, column_type, table_columns
from tests.pg.test_schema_evolution import columns_of, make, plan, schema_of


def names(url: str, table: str) -> list[str]:
    return [c[0] for c in columns_of(url, table)]


def test_names_that_need_quoting_are_added_as_given_and_found_again(
    pg_url: str, table: str
) -> None:
    given = ["Mixed Case", 'say "hi"', "select", "x); DROP TABLE t; --"]
    schema = T.StructType(
        [T.StructField("id", T.LongType())] + [T.StructField(n, T.StringType()) for n in given]
    )
    make(pg_url, table, "id bigint")
    first = plan(pg_url, table, schema, schemaEvolution="addColumns")
    assert names(pg_url, table) == ["id", *given]
    second = plan(pg_url, table, schema, schemaEvolution="addColumns")
    assert second == first
    assert [c.name for c in first.columns] == ["id", *given]


def test_a_name_postgresql_would_truncate_is_refused_before_the_alter(
    pg_url: str, table: str
) -> None:
    """PostgreSQL truncates an identifier to 63 bytes: the added column would not be
    found by the re-planning (nor by any later run), so the query would fail at every
    start with 'table changed while the sink evolved it'. Refused first, with the name."""
    long_name = "a_column_name_that_is_longer_than_postgresql_allows_for_identifiers"
    assert len(long_name.encode()) > 63
    make(pg_url, table, "id bigint")
    schema = schema_of(id=T.LongType(), **{long_name: T.StringType()})
    with pytest.raises(ConfigError) as caught:
        plan(pg_url, table, schema, schemaEvolution="addColumns")
    assert str(caught.value) == (
        f"the DataFrame does not fit table public.{table}: column {long_name!r} of the "
        "DataFrame: its name is 67 bytes and PostgreSQL keeps 63 (max_identifier_length), "
        "so the column added would have another name. Fix: rename the column in Spark"
    )
    assert names(pg_url, table) == ["id"]


def test_a_nested_array_is_refused_with_the_other_problems_and_nothing_added(
    pg_url: str, table: str
) -> None:
    """array<array<int>> has no PostgreSQL type the sink creates (SQLAlchemy refuses to
    nest ARRAY): one ConfigError with every problem, not SQLAlchemy's ValueError."""
    make(pg_url, table, "id bigint")
    schema = schema_of(
        id=T.LongType(),
        grid=T.ArrayType(T.ArrayType(T.IntegerType())),
        during=T.DayTimeIntervalType(),
        note=T.StringType(),
    )
    with pytest.raises(ConfigError) as caught:
        plan(pg_url, table, schema, schemaEvolution="addColumns")
    t = f"public.{table}"
    assert str(caught.value) == (
        f"the DataFrame does not fit table {t}: column 'grid': no PostgreSQL type for Spark "
        "type array<array<int>>; cast it in Spark (e.g. to string) or create the table "
        "yourself; column 'during': no PostgreSQL type for Spark type interval day to "
        "second; cast it in Spark (e.g. to string) or create the table yourself. Fix: "
        "select/rename the DataFrame's columns to the table's, or alter the table"
    )
    assert names(pg_url, table) == ["id"]


def test_struct_map_and_array_of_structs_are_added_or_refused_before_any_change(
    pg_url: str, table: str
) -> None:
    """Nested types get jsonb (jsonb[]): either written, or refused before the ALTER."""
    make(pg_url, table, "id bigint")
    point = T.StructType([T.StructField("x", T.IntegerType())])
    schema = schema_of(
        id=T.LongType(),
        point=point,
        tags=T.MapType(T.StringType(), T.IntegerType()),
        points=T.ArrayType(point),
    )
    try:
        plan(pg_url, table, schema, schemaEvolution="addColumns")
    except ConfigError:
        assert names(pg_url, table) == ["id"]
    else:
        assert columns_of(pg_url, table)[1:] == [
            ("point", "jsonb", False),
            ("tags", "jsonb", False),
            ("points", "jsonb[]", False),
        ]


def test_two_queries_adding_the_same_column_at_once_both_go_on(pg_url: str, table: str) -> None:
    """Both plan the column, both ALTER ... ADD COLUMN IF NOT EXISTS: the second waits
    for the first's lock, then finds the column (a notice); both plans write it."""
    make(pg_url, table, "id bigint")
    schema = schema_of(id=T.LongType(), note=T.StringType())
    results: list[Any] = []
    with psycopg.connect(pg_url) as holder:  # both ALTERs queue behind this reader
        holder.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))

        def one() -> None:
            try:
                results.append(plan(pg_url, table, schema, schemaEvolution="addColumns"))
            except Exception as exc:  # the test asserts what it was
                results.append(exc)

        threads = [threading.Thread(target=one) for _ in range(2)]
        for thread in threads:
            thread.start()
        _wait_for_waiters(pg_url, table, 2)
        holder.rollback()
    for thread in threads:
        thread.join(30)
    assert len(results) == 2
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert results[0] == results[1]
    assert names(pg_url, table) == ["id", "note"]


def test_two_queries_adding_a_column_with_different_types_the_loser_is_told(
    pg_url: str, table: str
) -> None:
    """A adds note text, B (planned meanwhile) note bigint: B's ADD ... IF NOT EXISTS
    skips, its re-planning finds text: a refusal naming the column, not a silent write."""
    make(pg_url, table, "id bigint")
    results: list[Any] = []
    with psycopg.connect(pg_url) as holder:
        holder.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))

        def one(kind: T.DataType) -> None:
            try:
                schema = schema_of(id=T.LongType(), note=kind)
                results.append(plan(pg_url, table, schema, schemaEvolution="addColumns"))
            except Exception as exc:  # the test asserts what it was
                results.append(exc)

        first = threading.Thread(target=one, args=(T.StringType(),))
        first.start()
        _wait_for_waiters(pg_url, table, 1)
        second = threading.Thread(target=one, args=(T.BinaryType(),))
        second.start()
        _wait_for_waiters(pg_url, table, 2)
        holder.rollback()
    first.join(30)
    second.join(30)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1, results
    assert isinstance(errors[0], (ConfigError, TransientError)), errors
    assert str(errors[0]).startswith(
        f"the DataFrame does not fit table public.{table}: column 'note': cannot write "
        "Arrow type binary (Spark column 'note') into PostgreSQL type text. Fix: cast"
    ), errors
    assert columns_of(pg_url, table)[1] == ("note", "text", False)


def _wait_for_waiters(url: str, table: str, count: int) -> None:
    import time

    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(200):
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                (f"public.{table}",),
            ).fetchone()
            if row is not None and row[0] >= count:
                return
            time.sleep(0.05)
    raise AssertionError(f"{count} waiters on {table} never appeared")


def test_widening_behind_a_reader_gives_up_naming_it(pg_url: str, table: str) -> None:
    make(pg_url, table, "id integer")
    with psycopg.connect(pg_url) as reader:
        pid = reader.info.backend_pid
        reader.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        with pytest.raises(TransientError) as caught:
            plan(
                pg_url, table, schema_of(id=T.LongType()), schemaEvolution="widen", lockTimeout="1s"
            )
        reader.rollback()
    text = str(caught.value)
    assert str(pid) in text, text
    assert "pg_terminate_backend" in text, text
    assert columns_of(pg_url, table) == [("id", "integer", False)]


def test_upsert_with_add_columns_keeps_the_key(pg_url: str, table: str) -> None:
    make(pg_url, table, "id bigint PRIMARY KEY, v text")
    schema = schema_of(id=T.LongType(), v=T.StringType(), note=T.StringType())
    target = plan(pg_url, table, schema, schemaEvolution="addColumns", mode="upsert")
    assert target.upsert is not None and target.upsert.keys == ("id",)
    assert target.key == ("id",)
    assert names(pg_url, table) == ["id", "v", "note"]


def test_create_table_with_add_columns_creates_then_adds_nothing(pg_url: str, table: str) -> None:
    schema = schema_of(id=T.LongType(), note=T.StringType())
    parsed = SinkOptions.parse(
        {"url": pg_url, "table": table, "createTable": "true", "schemaEvolution": "addColumns"}
    )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        target = plan_target(
            conn,  # type: ignore[arg-type]
            parsed,
            schema.fieldNames(),
            table_columns(schema, POSTGRESQL),
            arrow_schema(schema),
            lambda name: column_type(schema[name].dataType, name, POSTGRESQL),
        )
    assert [c.name for c in target.columns] == ["id", "note"]
    assert names(pg_url, table) == ["id", "note"]


def test_a_query_planned_before_another_widened_the_column_is_told_it_changed(
    pg_url: str, table: str, sink: str
) -> None:
    """Query A planned when id was integer (its bigint DataFrame range-checked into it);
    query B widens id to bigint; A's next partition, with the plan it made at its start,
    writes its rows (or fails with an error that says the table changed)."""
    from sqlsink.postgres.partition import write_partition
    from tests.pg.protocol import Writer, rows

    make(pg_url, table, "id integer")
    a = Writer(pg_url, table, sink, None)
    stale = a.target()
    plan(pg_url, table, schema_of(id=T.LongType()), schemaEvolution="widen")
    assert columns_of(pg_url, table) == [("id", "bigint", False)]
    with pytest.raises(SqlsinkError) as caught:
        write_partition(a.options, stale, a.task(0), rows(range(3)))
    assert not caught.value.transient, caught.value  # every retry would fail the same way
    assert str(caught.value) == (
        f"sink {sink}, batch 0, partition 0: writing to table public.{table} failed; row 1 "
        "of the partition's COPY; column 'id'; server says: insufficient data left in "
        "message. Nothing of batch 0 is "
        f"visible. column 'id' of table public.{table} is bigint now, integer when the "
        "query planned (changed since by another query's schemaEvolution=widen, or an "
        "ALTER TABLE). Fix: restart the query (from its checkpoint): it plans again"
    )


def test_widening_a_column_a_generated_column_reads_is_refused_in_the_sinks_words(
    pg_url: str, table: str
) -> None:
    """PostgreSQL cannot change the type of a column a generated column reads: a
    ConfigError with the statement and the server's reason, not psycopg's
    FeatureNotSupported."""
    make(pg_url, table, "id integer, doubled integer GENERATED ALWAYS AS (id * 2) STORED")
    with pytest.raises(ConfigError) as caught:
        plan(pg_url, table, schema_of(id=T.LongType()), schemaEvolution="widen")
    t = f"public.{table}"
    assert str(caught.value) == (
        f'option schemaEvolution=widen: PostgreSQL refused ALTER TABLE "public"."{table}" '
        'ALTER COLUMN "id" TYPE bigint: cannot alter type of a column used by a generated '
        'column (Column "id" is used by generated column "doubled"). Nothing was changed '
        f"or written. Fix: change table {t} by hand so that the DataFrame fits it, or cast "
        "the DataFrame's columns to its types"
    )
    assert columns_of(pg_url, table)[0] == ("id", "integer", False)


def test_two_queries_widening_one_column_at_once_never_narrow_it(pg_url: str, table: str) -> None:
    """A (bigint DataFrame) and B (integer DataFrame) both plan a smallint column's
    widening; A's ALTER runs first: B's, planned on smallint, must not take the column
    back from bigint to integer (which would cut A's values, or fail A's next writes)."""
    make(pg_url, table, "v smallint")
    results: list[Any] = []
    with psycopg.connect(pg_url) as holder:
        holder.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))

        def one(kind: T.DataType) -> None:
            try:
                results.append(plan(pg_url, table, schema_of(v=kind), schemaEvolution="widen"))
            except Exception as exc:  # the test asserts what it was
                results.append(exc)

        first = threading.Thread(target=one, args=(T.LongType(),))
        first.start()
        _wait_for_waiters(pg_url, table, 1)
        second = threading.Thread(target=one, args=(T.IntegerType(),))
        second.start()
        _wait_for_waiters(pg_url, table, 2)
        holder.rollback()
    first.join(30)
    second.join(30)
    assert columns_of(pg_url, table) == [("v", "bigint", False)], results
    assert not [r for r in results if isinstance(r, BaseException)], results
