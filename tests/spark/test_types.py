"""Spark types into PostgreSQL columns, and bad data: a clear error, nothing visible."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer, prepared_transactions

pytestmark = pytest.mark.spark
UTC = dt.timezone.utc

TABLE_DDL = """CREATE TABLE {} (
    id bigint PRIMARY KEY, flag boolean, small smallint, amount numeric(12,3), ratio real,
    name varchar(20), doc jsonb, ref uuid, tags text[], scores double precision[],
    at timestamptz, local_at timestamp, day date, raw bytea, attrs jsonb)"""
SCHEMA = (
    "id BIGINT, flag BOOLEAN, small SHORT, amount DECIMAL(12,3), ratio FLOAT, name STRING, "
    "doc STRING, ref STRING, tags ARRAY<STRING>, scores ARRAY<DOUBLE>, at TIMESTAMP, "
    "local_at TIMESTAMP_NTZ, day DATE, raw BINARY, attrs STRUCT<k: STRING, n: INT>"
)
REF = uuid.UUID("12345678-1234-5678-1234-567812345678")
ROWS = [
    (
        1,
        True,
        -32768,
        decimal.Decimal("-123456789.125"),
        0.5,
        "ünïcode ✓",
        '{"a": [1, 2]}',
        str(REF),
        ["x", None, "z"],
        [1.5, float("nan")],
        dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=5))),
        dt.datetime(2030, 1, 2, 3, 4, 5),
        dt.date(1970, 1, 1),
        b"\x00\xff",
        ("v", 7),
    ),
    (2, None, None, None, None, None, None, None, None, None, None, None, None, None, None),
    (
        3,
        False,
        32767,
        decimal.Decimal("0.001"),
        -1e30,
        "",
        "null",
        REF.hex.upper(),
        [],
        [],
        dt.datetime(2262, 4, 11, tzinfo=UTC),
        dt.datetime(1900, 1, 1),
        dt.date(9999, 12, 31),
        b"",
        ("", None),
    ),
]


def make(url: str, table: str, ddl: str = TABLE_DDL) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(ddl).format(sql.Identifier(table)))


def save(spark: Any, rows: list[tuple[Any, ...]], schema: str, url: str, table: str) -> None:
    df = spark.createDataFrame(rows, schema).repartition(2)
    df.write.format("sqlsink").mode("append").option("url", url).option("table", table).save()


def fetch(url: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        query = sql.SQL("SELECT * FROM {} ORDER BY id").format(sql.Identifier(table))
        return [tuple(r) for r in conn.execute(query)]


def test_types_round_trip(spark: Any, pg_url: str, table: str) -> None:
    make(pg_url, table)
    save(spark, ROWS, SCHEMA, pg_url, table)
    first, empty, last = fetch(pg_url, table)
    assert first[:6] == (1, True, -32768, decimal.Decimal("-123456789.125"), 0.5, "ünïcode ✓")
    assert first[6:10] == ({"a": [1, 2]}, REF, ["x", None, "z"], first[9])
    assert first[9][0] == 1.5 and first[9][1] != first[9][1]  # NaN survives
    assert first[10] == dt.datetime(1999, 12, 31, 18, 59, 59, 999999, tzinfo=UTC)
    assert first[11:14] == (dt.datetime(2030, 1, 2, 3, 4, 5), dt.date(1970, 1, 1), b"\x00\xff")
    assert first[14] == {"k": "v", "n": 7}
    assert empty == (2, *[None] * 14)
    assert last[6:9] == (None, REF, [])  # JSON 'null' is a value; PostgreSQL keeps it as null
    assert last[10:13] == (
        dt.datetime(2262, 4, 11, tzinfo=UTC),
        dt.datetime(1900, 1, 1),
        dt.date(9999, 12, 31),
    )


BAD = [
    (
        "NOT NULL",
        "CREATE TABLE {} (id bigint PRIMARY KEY, name text NOT NULL)",
        [(1, "a"), (2, None)],
        "id BIGINT, name STRING",
        r"column 'name'.*null value",
    ),
    (
        "check",
        "CREATE TABLE {} (id bigint PRIMARY KEY, n int CHECK (n > 0))",
        [(1, 5), (2, -1)],
        "id BIGINT, n INT",
        r"violates check constraint",
    ),
    (
        "range",
        "CREATE TABLE {} (id bigint PRIMARY KEY, n smallint)",
        [(1, 5), (2, 70000)],
        "id BIGINT, n INT",
        r"column 'n'.*70000",
    ),
    (
        "uuid",
        "CREATE TABLE {} (id bigint PRIMARY KEY, ref uuid)",
        [(1, str(REF)), (2, "not-a-uuid")],
        "id BIGINT, ref STRING",
        r"column 'ref'.*not-a-uuid",
    ),
    (
        "json",
        "CREATE TABLE {} (id bigint PRIMARY KEY, doc jsonb)",
        [(1, "{}"), (2, "{oops")],
        "id BIGINT, doc STRING",
        r"column 'doc'.*invalid input syntax for type json",
    ),
]


@pytest.mark.parametrize(("case", "ddl", "rows", "schema", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_data_fails_the_batch_and_shows_nothing(
    spark: Any,
    pg_url: str,
    table: str,
    pg_server: PgServer,
    case: str,
    ddl: str,
    rows: list[tuple[Any, ...]],
    schema: str,
    match: str,
) -> None:
    make(pg_url, table, ddl)
    good = [(i, *rows[0][1:]) for i in range(10, 20)]
    with pytest.raises(Exception, match=r"batch 0, partition \d") as err:
        save(spark, good + rows, schema, pg_url, table)
    assert __import__("re").search(match, str(err.value)), str(err.value)[:2000]
    assert fetch(pg_url, table) == []
    assert prepared_transactions(pg_server.admin_url) == []


def test_incompatible_schema_is_reported_whole_before_writing(
    spark: Any, pg_url: str, table: str
) -> None:
    make(pg_url, table, "CREATE TABLE {} (id bigint PRIMARY KEY, ref uuid, must text NOT NULL)")
    rows = [(1, True, "x")]
    with pytest.raises(Exception) as err:
        save(spark, rows, "id BIGINT, ref BOOLEAN, extra STRING", pg_url, table)
    message = str(err.value)
    assert "column 'extra' of the DataFrame is not in table" in message
    assert "column 'must' of table" in message and "NOT NULL without a default" in message
    assert "'ref'" in message and "uuid" in message  # and the type problem, in the same error
    assert fetch(pg_url, table) == []
