"""Arrow → binary COPY encoding, round-tripped through a real PostgreSQL server."""

from __future__ import annotations

import datetime as dt
import decimal
import ipaddress
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sqlsink.errors import ConfigError, WriteError
from sqlsink.postgres.catalog import TargetColumn, table_columns
from sqlsink.postgres.encoding import (
    COPY_HEADER,
    COPY_TRAILER,
    BinaryCopyEncoder,
    build_encoder,
    write_batches,
)
from sqlsink.tablename import TableName

Conn = psycopg.Connection[tuple[Any, ...]]
D = decimal.Decimal
UTC = dt.timezone.utc
NAN = float("nan")
INF = float("inf")


# -- helpers ------------------------------------------------------------------------------------


def create(conn: Conn, table: str, columns: dict[str, str]) -> list[TargetColumn]:
    """CREATE TABLE with an identity column (for the order) and the given columns."""
    defs = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(pg_type))  # test constants only
        for name, pg_type in columns.items()
    )
    conn.execute(
        sql.SQL("CREATE TABLE {} (_n bigint GENERATED ALWAYS AS IDENTITY, {})").format(
            sql.Identifier("public", table), defs
        )
    )
    by_name = {c.name: c for c in table_columns(conn, TableName("public", table))}
    return [by_name[name] for name in columns]


def copy_in(
    conn: Conn, table: str, encoder: BinaryCopyEncoder, batches: Sequence[pa.RecordBatch]
) -> int:
    names = sql.SQL(", ").join(sql.Identifier(n) for n in encoder.column_names)
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier("public", table), names
    )
    with conn.cursor() as cur, cur.copy(statement) as copy:
        return write_batches(copy, encoder, batches)


def select(conn: Conn, table: str, names: Sequence[str], cast: str = "") -> list[tuple[Any, ...]]:
    cols = sql.SQL(", ").join(sql.SQL("{}" + cast).format(sql.Identifier(n)) for n in names)
    query = sql.SQL("SELECT {} FROM {} ORDER BY _n").format(cols, sql.Identifier("public", table))
    return conn.execute(query).fetchall()


def roundtrip(
    conn: Conn,
    table: str,
    columns: dict[str, str],
    batches: Sequence[pa.RecordBatch],
    cast: str = "",
) -> list[tuple[Any, ...]]:
    """Create the table, COPY the batches in, and read the rows back in order."""
    targets = create(conn, table, columns)
    encoder = build_encoder(list(batches[0].schema), targets)
    assert copy_in(conn, table, encoder, batches) == sum(b.num_rows for b in batches)
    return select(conn, table, list(columns), cast)


def one_column(conn: Conn, table: str, pg_type: str, array: pa.Array, cast: str = "") -> list[Any]:
    batch = pa.record_batch({"v": array})
    return [row[0] for row in roundtrip(conn, table, {"v": pg_type}, [batch], cast)]


def same(got: Any, want: Any) -> bool:
    """Equality where NaN equals NaN (floats and numeric), recursively for lists."""
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(got, float) and isinstance(want, float) and math.isnan(want):
        return math.isnan(got)
    if isinstance(got, D) and isinstance(want, D) and want.is_nan():
        return got.is_nan()
    return bool(got == want) and type(got) is type(want)


def target(name: str, oid: int, type_name: str) -> TargetColumn:
    return TargetColumn(name, oid, type_name, not_null=False, has_default=False)


def with_garbage_in_null_slots(values: list[int], nulls: list[int], arrow: pa.DataType) -> pa.Array:
    """An int array whose NULL slots hold the given (maybe out-of-range) values."""
    bitmap = np.packbits([i not in nulls for i in range(len(values))], bitorder="little").tobytes()
    data = np.array(values, dtype=arrow.to_pandas_dtype()).tobytes()
    return pa.Array.from_buffers(arrow, len(values), [pa.py_buffer(bitmap), pa.py_buffer(data)])


# -- the stream framing ------------------------------------------------------------------------


def test_header_and_trailer() -> None:
    assert COPY_HEADER[:11] == b"PGCOPY\n\xff\r\n\x00"
    assert COPY_HEADER[11:] == bytes(8)  # flags, header extension length
    assert len(COPY_HEADER) == 19
    assert COPY_TRAILER == b"\xff\xff"


def test_zero_rows_and_empty_batches(pg_conn: Conn, table: str) -> None:
    schema = pa.schema([("v", pa.int64())])
    empty = pa.record_batch([pa.array([], pa.int64())], schema=schema)
    targets = create(pg_conn, table, {"v": "bigint"})
    encoder = build_encoder(list(schema), targets)
    assert bytes(encoder.encode(empty)) == b""
    one = pa.record_batch([pa.array([7], pa.int64())], schema=schema)
    assert bytes(encoder.encode(one)) == b"\x00\x01" + b"\x00\x00\x00\x08" + (7).to_bytes(8, "big")
    assert copy_in(pg_conn, table, encoder, []) == 0
    assert copy_in(pg_conn, table, encoder, [empty, one, empty, one.slice(1), one]) == 2
    assert select(pg_conn, table, ["v"]) == [(7,), (7,)]


def test_one_row_of_everything_null(pg_conn: Conn, table: str) -> None:
    batch = pa.record_batch(
        {
            "a": pa.array([None], pa.int32()),
            "b": pa.array([None], pa.string()),
            "c": pa.array([None], pa.list_(pa.int64())),
            "d": pa.array([None], pa.decimal128(10, 2)),
            "e": pa.nulls(1),
            "f": pa.array([None], pa.struct([("x", pa.int64())])),
        }
    )
    columns = {
        "a": "integer",
        "b": "uuid",
        "c": "bigint[]",
        "d": "numeric",
        "e": "date",
        "f": "jsonb",
    }
    assert roundtrip(pg_conn, table, columns, [batch]) == [(None,) * 6]


# -- every supported pair, round-tripped -------------------------------------------------------

EMOJI = "emoji 😀🎉 and ünïcödé, 日本語, ελληνικά"
LONG_TEXT = "long ✓ " * 400  # over 1 KiB: the one-copy-per-value path

ROUNDTRIPS: list[tuple[str, str, pa.Array, list[Any]]] = [
    # integers
    ("int8->smallint", "smallint", pa.array([-128, 127, None, 0], pa.int8()), [-128, 127, None, 0]),
    ("int16->smallint", "smallint", pa.array([-32768, 32767, None], pa.int16()),
     [-32768, 32767, None]),
    ("int32->integer", "integer", pa.array([-(2**31), 2**31 - 1, None, 5], pa.int32()),
     [-(2**31), 2**31 - 1, None, 5]),
    ("int64->bigint", "bigint", pa.array([-(2**63), 2**63 - 1, None, 0], pa.int64()),
     [-(2**63), 2**63 - 1, None, 0]),
    ("int64->integer", "integer", pa.array([-(2**31), 2**31 - 1, None], pa.int64()),
     [-(2**31), 2**31 - 1, None]),
    ("int32->smallint", "smallint", pa.array([-32768, 32767, None], pa.int32()),
     [-32768, 32767, None]),
    ("int16->bigint", "bigint", pa.array([-1, None, 300], pa.int16()), [-1, None, 300]),
    ("uint32->bigint", "bigint", pa.array([0, 2**32 - 1, None], pa.uint32()),
     [0, 2**32 - 1, None]),
    ("uint64->bigint", "bigint", pa.array([2**63 - 1, None], pa.uint64()), [2**63 - 1, None]),
    ("int64->double", "double precision", pa.array([2**53, -3, None], pa.int64()),
     [float(2**53), -3.0, None]),
    ("int32->real", "real", pa.array([16_777_216, -3, None], pa.int32()),
     [16_777_216.0, -3.0, None]),
    ("int64->numeric", "numeric", pa.array([0, -1, 10_000, 12_345_678, -(2**63), 2**63 - 1, None]),
     [D(0), D(-1), D(10_000), D(12_345_678), D(-(2**63)), D(2**63 - 1), None]),
    ("uint64->numeric", "numeric", pa.array([2**64 - 1, 0], pa.uint64()), [D(2**64 - 1), D(0)]),
    ("int8->numeric(5,1)", "numeric(5,1)", pa.array([-7, None], pa.int8()), [D("-7.0"), None]),
    # floats
    ("float64->double", "double precision",
     pa.array([1.5, -0.0, NAN, INF, -INF, None, 1e308, 5e-324, -2.2250738585072014e-308]),
     [1.5, -0.0, NAN, INF, -INF, None, 1e308, 5e-324, -2.2250738585072014e-308]),
    ("float32->real", "real", pa.array([1.5, NAN, -INF, None, 3.4e38], pa.float32()),
     [1.5, NAN, -INF, None, 3.4e38]),  # psycopg reads real by its shortest repr
    ("float32->double", "double precision", pa.array([0.1, None], pa.float32()),
     [float(np.float32(0.1)), None]),
    ("float64->real", "real", pa.array([0.1, NAN, INF, None]),
     [0.1, NAN, INF, None]),
    ("float64->numeric", "numeric",
     pa.array([0.1, -2.5, 1e20, 1.5e-10, NAN, 0.0, -0.0, None, 123456.789, 1e300, 5e-324]),
     [D("0.1"), D("-2.5"), D("1e20"), D("1.5e-10"), D("NaN"), D(0), D(0), None,
      D("123456.789"), D("1e300"), D("5e-324")]),
    ("float32->numeric", "numeric", pa.array([0.1, -3.25, None], pa.float32()),
     [D("0.1"), D("-3.25"), None]),
    # booleans
    ("bool->boolean", "boolean", pa.array([True, False, None, True]), [True, False, None, True]),
    # decimals
    ("decimal(10,2)->numeric", "numeric",
     pa.array([D("-1234.56"), D("0.01"), D("100.00"), D("0.00"), None], pa.decimal128(10, 2)),
     [D("-1234.56"), D("0.01"), D("100.00"), D("0.00"), None]),
    ("decimal(38,10)->numeric", "numeric",
     pa.array([D("12345678901234567890.1234567890"), D("-0.0000000001"),
               D("-9999999999999999999999999999.9999999999"), D(0)], pa.decimal128(38, 10)),
     [D("12345678901234567890.1234567890"), D("-0.0000000001"),
      D("-9999999999999999999999999999.9999999999"), D("0E-10")]),
    ("decimal(38,0)->numeric", "numeric",
     pa.array([D(10**38 - 1), D(-(10**38 - 1)), D(1)], pa.decimal128(38, 0)),
     [D(10**38 - 1), D(-(10**38 - 1)), D(1)]),
    ("decimal(38,38)->numeric", "numeric",
     pa.array([D("1E-38"), D("-0.99999999999999999999999999999999999999")], pa.decimal128(38, 38)),
     [D("1E-38"), D("-0.99999999999999999999999999999999999999")]),
    ("decimal(5,-3)->numeric", "numeric",
     pa.array([D("1.2345E+7"), D("-1E+3")], pa.decimal128(5, -3)),
     [D(12_345_000), D(-1000)]),
    ("decimal256->numeric", "numeric",
     pa.array([D(10**56 - 1), D("-1.5E-19"), None], pa.decimal256(76, 20)),
     [D(10**56 - 1), D("-1.5E-19"), None]),
    ("decimal32->numeric", "numeric", pa.array([D("-9.99"), D("0.5")], pa.decimal32(3, 2)),
     [D("-9.99"), D("0.50")]),
    ("decimal64->numeric", "numeric", pa.array([D("-123456789.123")], pa.decimal64(18, 3)),
     [D("-123456789.123")]),
    ("decimal(10,4)->numeric(10,2)", "numeric(10,2)", pa.array([D("1.2345")], pa.decimal128(10, 4)),
     [D("1.23")]),
    # strings
    ("string->text", "text", pa.array(["", "plain", EMOJI, None, LONG_TEXT, "x"]),
     ["", "plain", EMOJI, None, LONG_TEXT, "x"]),
    ("large_string->text", "text", pa.array([EMOJI, None, ""], pa.large_string()),
     [EMOJI, None, ""]),
    ("string_view->text", "text", pa.array(["view", None], pa.string_view()), ["view", None]),
    ("dictionary->text", "text", pa.array(["a", "b", "a", None]).dictionary_encode(),
     ["a", "b", "a", None]),
    ("string->varchar(20)", "character varying(20)", pa.array(["ünï", None, ""]),
     ["ünï", None, ""]),
    ("string->char(5)", "character(5)", pa.array(["ab", None, "abcde"]),
     ["ab   ", None, "abcde"]),
    ("string->name", "name", pa.array(["a_name", None]), ["a_name", None]),
    ("string->json", "json", pa.array(['{"a": [1, 2.5, "ü"]}', None, "[]", "3"]),
     [{"a": [1, 2.5, "ü"]}, None, [], 3]),
    ("string->jsonb", "jsonb", pa.array(['{"a": {"b": null}}', None, '"😀"']),
     [{"a": {"b": None}}, None, "😀"]),
    ("string->uuid", "uuid",
     pa.array(["12345678-9abc-def0-1234-56789abcdef0", "12345678-9ABC-DEF0-1234-56789ABCDEF0",
               "0123456789abcdefABCDEF0123456789", None]),
     [uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")] * 2
     + [uuid.UUID("0123456789abcdefabcdef0123456789"), None]),
    ("large_string->uuid", "uuid", pa.array([None, "00000000-0000-0000-0000-000000000000"],
                                            pa.large_string()),
     [None, uuid.UUID(int=0)]),
    ("string->inet", "inet",
     pa.array(["192.168.0.1", "10.1.2.3/8", "::1", "2001:db8::1/64", None]),
     [ipaddress.ip_address("192.168.0.1"), ipaddress.ip_interface("10.1.2.3/8"),
      ipaddress.ip_address("::1"), ipaddress.ip_interface("2001:db8::1/64"), None]),
    ("string->cidr", "cidr", pa.array(["10.0.0.0/8", "2001:db8::/32", "1.2.3.4", None]),
     [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("2001:db8::/32"),
      ipaddress.ip_network("1.2.3.4/32"), None]),
    # binaries
    ("binary->bytea", "bytea", pa.array([b"", b"\x00\xff\x00", None, bytes(range(256)) * 8]),
     [b"", b"\x00\xff\x00", None, bytes(range(256)) * 8]),
    ("large_binary->bytea", "bytea", pa.array([b"abc", None], pa.large_binary()), [b"abc", None]),
    ("fixed_binary->bytea", "bytea", pa.array([b"abc", None, b"\x00\x00\x01"], pa.binary(3)),
     [b"abc", None, b"\x00\x00\x01"]),
    ("fixed_binary(16)->uuid", "uuid", pa.array([bytes(range(16)), None], pa.binary(16)),
     [uuid.UUID(bytes=bytes(range(16))), None]),
    ("arrow.uuid->uuid", "uuid",
     pa.ExtensionArray.from_storage(pa.uuid(), pa.array([bytes(range(16))], pa.binary(16))),
     [uuid.UUID(bytes=bytes(range(16)))]),
    # dates and times
    ("date32->date", "date",
     pa.array([dt.date(1970, 1, 1), dt.date(1999, 12, 31), dt.date(2000, 1, 1), None,
               dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1582, 10, 4)]),
     [dt.date(1970, 1, 1), dt.date(1999, 12, 31), dt.date(2000, 1, 1), None,
      dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1582, 10, 4)]),
    ("date64->date", "date", pa.array([dt.date(1960, 2, 29), None], pa.date64()),
     [dt.date(1960, 2, 29), None]),
    ("timestamp[us,UTC]->timestamptz", "timestamp with time zone",
     pa.array([dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=UTC),
               dt.datetime(1900, 1, 1, tzinfo=UTC), dt.datetime(2000, 1, 1, tzinfo=UTC), None,
               dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
               dt.datetime(1, 1, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
     [dt.datetime(1969, 7, 20, 20, 17, 40, tzinfo=UTC), dt.datetime(1900, 1, 1, tzinfo=UTC),
      dt.datetime(2000, 1, 1, tzinfo=UTC), None,
      dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
      dt.datetime(1, 1, 1, tzinfo=UTC)]),
    ("timestamp[us,Tokyo]->timestamptz", "timestamp with time zone",
     pa.array([dt.datetime(2024, 3, 10, 9, 0, tzinfo=UTC)], pa.timestamp("us", tz="Asia/Tokyo")),
     [dt.datetime(2024, 3, 10, 9, 0, tzinfo=UTC)]),
    ("timestamp[s,NewYork]->timestamptz", "timestamp with time zone",
     pa.array([-86_400, 0, None], pa.timestamp("s", tz="America/New_York")),
     [dt.datetime(1969, 12, 31, tzinfo=UTC), dt.datetime(1970, 1, 1, tzinfo=UTC), None]),
    ("timestamp[ms,+05:30]->timestamptz", "timestamp with time zone",
     pa.array([1_500, -1], pa.timestamp("ms", tz="+05:30")),
     [dt.datetime(1970, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC),
      dt.datetime(1969, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)]),
    ("timestamp[ns,UTC]->timestamptz", "timestamp with time zone",
     pa.array([1_999, -1, None, 946_684_800_000_000_000], pa.timestamp("ns", tz="UTC")),
     [dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),  # floored to the microsecond
      dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), None,
      dt.datetime(2000, 1, 1, tzinfo=UTC)]),
    ("timestamp[us]->timestamp", "timestamp without time zone",
     pa.array([dt.datetime(1850, 6, 1, 12, 30, 15, 123_456), None, dt.datetime(2100, 1, 1)]),
     [dt.datetime(1850, 6, 1, 12, 30, 15, 123_456), None, dt.datetime(2100, 1, 1)]),
    ("timestamp[us,Tokyo]->timestamp (Tokyo wall time)", "timestamp",
     pa.array([dt.datetime(2024, 3, 10, 9, 0, tzinfo=UTC)], pa.timestamp("us", tz="Asia/Tokyo")),
     [dt.datetime(2024, 3, 10, 18, 0)]),
    ("timestamp[us]->timestamptz (as UTC)", "timestamptz",
     pa.array([dt.datetime(2024, 3, 10, 9, 0)], pa.timestamp("us")),
     [dt.datetime(2024, 3, 10, 9, 0, tzinfo=UTC)]),
    ("time64[us]->time", "time", pa.array([dt.time(0, 0), dt.time(23, 59, 59, 999_999), None]),
     [dt.time(0, 0), dt.time(23, 59, 59, 999_999), None]),
    ("time32[ms]->time", "time", pa.array([3_723_004], pa.time32("ms")), [dt.time(1, 2, 3, 4000)]),
    ("time64[ns]->time", "time", pa.array([1_999], pa.time64("ns")), [dt.time(0, 0, 0, 1)]),
    ("duration[us]->interval", "interval",
     pa.array([dt.timedelta(days=1, seconds=3, microseconds=5), -dt.timedelta(hours=5), None]),
     [dt.timedelta(days=1, seconds=3, microseconds=5), -dt.timedelta(hours=5), None]),
    ("duration[s]->interval", "interval", pa.array([90], pa.duration("s")),
     [dt.timedelta(seconds=90)]),
    # arrays
    ("list<int32>->integer[]", "integer[]",
     pa.array([[1, 2, 3], [], None, [None, 4], [-(2**31)]], pa.list_(pa.int32())),
     [[1, 2, 3], [], None, [None, 4], [-(2**31)]]),
    ("large_list<int64>->bigint[]", "bigint[]",
     pa.array([[2**62], None, []], pa.large_list(pa.int64())), [[2**62], None, []]),
    ("list<int16>->smallint[]", "smallint[]", pa.array([[1, None]], pa.list_(pa.int16())),
     [[1, None]]),
    ("list<float64>->double[]", "double precision[]",
     pa.array([[1.5, NAN, None, -INF], []], pa.list_(pa.float64())),
     [[1.5, NAN, None, -INF], []]),
    ("list<float32>->real[]", "real[]", pa.array([[0.5, None]], pa.list_(pa.float32())),
     [[0.5, None]]),
    ("list<bool>->boolean[]", "boolean[]", pa.array([[True, None, False], None]),
     [[True, None, False], None]),
    ("list<string>->text[]", "text[]",
     pa.array([["a", None, EMOJI, ""], [], None, [LONG_TEXT]]),
     [["a", None, EMOJI, ""], [], None, [LONG_TEXT]]),
    ("list<string>->varchar[]", "character varying(10)[]", pa.array([["x", "yy"]]),
     [["x", "yy"]]),
    ("list<string>->uuid[]", "uuid[]", pa.array([["00000000000000000000000000000001", None]]),
     [[uuid.UUID(int=1), None]]),
    ("list<string>->jsonb[]", "jsonb[]", pa.array([['{"a":1}', "[]"]]), [[{"a": 1}, []]]),
    ("list<decimal>->numeric[]", "numeric[]",
     pa.array([[D("1.50"), None, D("-0.01")], []], pa.list_(pa.decimal128(5, 2))),
     [[D("1.50"), None, D("-0.01")], []]),
    ("list<timestamp>->timestamptz[]", "timestamptz[]",
     pa.array([[dt.datetime(1999, 1, 1, tzinfo=UTC), None]], pa.list_(pa.timestamp("us", "UTC"))),
     [[dt.datetime(1999, 1, 1, tzinfo=UTC), None]]),
    ("list<date>->date[]", "date[]", pa.array([[dt.date(2020, 2, 29)]]), [[dt.date(2020, 2, 29)]]),
    ("list<binary>->bytea[]", "bytea[]", pa.array([[b"\x00", None]]), [[b"\x00", None]]),
    ("fixed_size_list->integer[]", "integer[]",
     pa.array([[1, 2], None, [3, None]], pa.list_(pa.int32(), 2)), [[1, 2], None, [3, None]]),
    ("list<struct>->jsonb[]", "jsonb[]",
     pa.array([[{"k": 1}, None]], pa.list_(pa.struct([("k", pa.int64())]))), [[{"k": 1}, None]]),
    # documents
    ("struct->jsonb", "jsonb",
     pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": "é😀"}],
              pa.struct([("a", pa.int64()), ("b", pa.string())])),
     [{"a": 1, "b": "x"}, None, {"a": None, "b": "é😀"}]),
    ("struct->json (decimal, date, binary, NaN)", "json",
     pa.array([{"d": D("1.50"), "t": dt.date(2020, 1, 2), "b": b"\x00\x01", "f": NAN}],
              pa.struct([("d", pa.decimal128(5, 2)), ("t", pa.date32()), ("b", pa.binary()),
                         ("f", pa.float64())])),
     [{"d": "1.50", "t": "2020-01-02", "b": "AAE=", "f": "NaN"}]),
    ("map<string,int64>->jsonb", "jsonb",
     pa.array([[("k", 1), ("j", 2)], [], None], pa.map_(pa.string(), pa.int64())),
     [{"k": 1, "j": 2}, {}, None]),
    ("map<int32,list<string>>->json", "json",
     pa.array([[(1, ["a", None])]], pa.map_(pa.int32(), pa.list_(pa.string()))),
     [{"1": ["a", None]}]),
    ("list<int64>->jsonb", "jsonb", pa.array([[1, None], [], None]), [[1, None], [], None]),
    ("struct<list,map,struct>->jsonb", "jsonb",
     pa.array([{"l": [1.5], "m": [("x", True)], "s": {"n": None}}],
              pa.struct([("l", pa.list_(pa.float64())), ("m", pa.map_(pa.string(), pa.bool_())),
                         ("s", pa.struct([("n", pa.int8())]))])),
     [{"l": [1.5], "m": {"x": True}, "s": {"n": None}}]),
    # the null type
    ("null->text", "text", pa.nulls(3), [None, None, None]),
    ("null->integer[]", "integer[]", pa.nulls(1), [None]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pg_type", "array", "expected"),
    [case[1:] for case in ROUNDTRIPS],
    ids=[case[0] for case in ROUNDTRIPS],
)
def test_roundtrip(
    pg_conn: Conn, table: str, pg_type: str, array: pa.Array, expected: list[Any]
) -> None:
    got = one_column(pg_conn, table, pg_type, array)
    assert same(got, expected), f"{got!r} != {expected!r}"
    # The same values from a slice (non-zero offsets into every buffer, bitmaps included).
    if len(array) > 1:
        pg_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier("public", table)))
        got = one_column(pg_conn, table, pg_type, array.slice(1))
        assert same(got, expected[1:]), f"{got!r} != {expected[1:]!r}"


def test_numeric_keeps_the_decimal_scale(pg_conn: Conn, table: str) -> None:
    array = pa.array([D("1.50"), D("0.00"), D("-100.00"), None], pa.decimal128(10, 2))
    got = one_column(pg_conn, table, "numeric", array, cast="::text")
    assert got == ["1.50", "0.00", "-100.00", None]


@pytest.mark.parametrize(("precision", "scale"), [(38, 0), (38, 2), (38, 5), (38, 18), (38, 37)])
def test_random_decimals(pg_conn: Conn, table: str, precision: int, scale: int) -> None:
    rng = np.random.default_rng(precision * 100 + scale)
    values: list[D | None] = []
    for digits in rng.integers(1, precision + 1, 300).tolist():
        unscaled = int("".join(map(str, rng.integers(0, 10, digits).tolist())))
        values.append(D(f"{'-' if rng.random() < 0.5 else ''}{unscaled}e{-scale}"))
    values += [None, D(f"0e{-scale}"), D(f"{10**precision - 1}e{-scale}")]
    array = pa.array(values, pa.decimal128(precision, scale))
    got = one_column(pg_conn, table, "numeric", array, cast="::text")
    assert got == [None if v is None else f"{v.copy_abs() if v.is_zero() else v:f}" for v in values]


def test_extreme_timestamps(pg_conn: Conn, table: str) -> None:
    """The whole int64 range of Arrow microseconds above PostgreSQL's minimum, as text."""
    big = 2**63 - 1
    array = pa.array([big, -210_866_803_200_000_000], pa.timestamp("us", tz="UTC"))
    pg_conn.execute("SET TimeZone = 'UTC'")
    got = one_column(pg_conn, table, "timestamptz", array, cast="::text")
    assert got == ["294247-01-10 04:00:54.775807+00", "4714-11-24 00:00:00+00 BC"]


def test_many_columns_with_nulls_and_slices(pg_conn: Conn, table: str) -> None:
    """A wide batch with nulls everywhere, read back whole and through many slices."""
    n = 53
    rng = np.random.default_rng(7)
    nulls = rng.random((12, n)) < 0.2

    def col(values: list[Any], k: int) -> list[Any]:
        return [None if nulls[k][i] else v for i, v in enumerate(values)]

    ints = rng.integers(-(2**40), 2**40, n).tolist()
    texts = ["".join(rng.choice(list("aé😀xyz "), int(m)).tolist()) for m in rng.integers(0, 9, n)]
    stamps = [
        dt.datetime(2000, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=int(v))
        for v in rng.integers(-(10**16), 10**16, n)
    ]
    uuids = [uuid.UUID(int=int(v)) for v in rng.integers(0, 2**62, n)]
    data = {
        "i64": (pa.array(col(ints, 0), pa.int64()), "bigint"),
        "i32": (pa.array(col([v % 30000 for v in ints], 1), pa.int32()), "smallint"),
        "f64": (pa.array(col(rng.standard_normal(n).tolist(), 2)), "double precision"),
        "flag": (pa.array(col([bool(v % 2) for v in ints], 3)), "boolean"),
        "txt": (pa.array(col(texts, 4)), "text"),
        "js": (pa.array(col([f'{{"k":{v}}}' for v in ints], 5)), "jsonb"),
        "id": (pa.array(col([str(u) for u in uuids], 6)), "uuid"),
        "amount": (pa.array(col([D(v).scaleb(-3) for v in ints], 7), pa.decimal128(20, 3)),
                   "numeric(20,3)"),
        "at": (pa.array(col(stamps, 8), pa.timestamp("us", tz="Europe/Berlin")), "timestamptz"),
        "day": (pa.array(col([s.date() for s in stamps], 9)), "date"),
        "arr": (pa.array(col([list(range(v % 4)) for v in ints], 10), pa.list_(pa.int32())),
                "integer[]"),
        "raw": (pa.array(col([t.encode() for t in texts], 11)), "bytea"),
    }  # fmt: skip
    batch = pa.record_batch({name: arr for name, (arr, _) in data.items()})
    columns = {name: pg_type for name, (_, pg_type) in data.items()}

    def expected(b: pa.RecordBatch) -> list[tuple[Any, ...]]:
        rows = b.to_pylist()
        for row in rows:
            row["id"] = None if row["id"] is None else uuid.UUID(row["id"])
            row["js"] = None if row["js"] is None else {"k": int(row["js"][5:-1])}
        return [tuple(row.values()) for row in rows]

    slices = [(0, n), (1, 1), (3, 17), (n - 1, 1), (7, 0), (10, 40)]
    targets = create(pg_conn, table, columns)
    encoder = build_encoder(list(batch.schema), targets)
    for offset, length in slices:
        piece = batch.slice(offset, length)
        assert copy_in(pg_conn, table, encoder, [piece]) == length
        got = select(pg_conn, table, list(columns))
        assert got == expected(piece), (offset, length)
        pg_conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier("public", table)))


def test_strings_with_gaps_long_values_and_dirty_null_slots(pg_conn: Conn, table: str) -> None:
    """NULL slots pointing at bytes, values across the 1 KiB copy threshold, a big batch."""
    rng = np.random.default_rng(3)
    n = 20_000
    lengths = rng.integers(0, 60, n)
    lengths[rng.integers(0, n, 40)] = rng.integers(1000, 5000, 40)  # some long values
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    chars = np.frombuffer(b"abcdefghij", np.uint8)[rng.integers(0, 10, int(offsets[-1]))]
    valid = rng.random(n) > 0.1
    bitmap = np.packbits(valid, bitorder="little").tobytes()
    array = pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(chars.tobytes()), pa.py_buffer(bitmap)
    )
    batch = pa.record_batch({"s": array, "b": array.cast(pa.binary())})
    rows = roundtrip(pg_conn, table, {"s": "text", "b": "bytea"}, [batch.slice(5)])
    want = array.slice(5).to_pylist()
    assert [r[0] for r in rows] == want
    assert [r[1] for r in rows] == [None if v is None else v.encode() for v in want]


def test_several_batches_in_one_copy(pg_conn: Conn, table: str) -> None:
    batches = [
        pa.record_batch({"v": pa.array([i * 10 + k for k in range(i)], pa.int32())})
        for i in range(5)
    ]
    rows = roundtrip(pg_conn, table, {"v": "integer"}, batches)
    assert [r[0] for r in rows] == [i * 10 + k for i in range(5) for k in range(i)]


def test_nulls_may_hold_anything(pg_conn: Conn, table: str) -> None:
    """Out-of-range garbage in NULL slots is no error."""
    array = with_garbage_in_null_slots([1, 2**40, -(2**40), 3], [1, 2], pa.int64())
    assert one_column(pg_conn, table, "integer", array) == [1, None, None, 3]


# -- values a column cannot hold ---------------------------------------------------------------

BAD_VALUES: list[tuple[str, str, pa.Array, int, str]] = [
    ("int32->smallint", "smallint", pa.array([1, 40_000, 2], pa.int32()), 1, "40000"),
    ("int64->integer low", "integer", pa.array([None, 0, -(2**31) - 1], pa.int64()), 2,
     "-2147483649"),
    ("uint64->bigint", "bigint", pa.array([2**63], pa.uint64()), 0, "9223372036854775808"),
    ("int16->smallint[] element", "smallint[]",
     pa.array([[1], [], None, [2, 2**20]], pa.list_(pa.int32())), 3, "element 2"),
    ("bad uuid", "uuid", pa.array(["12345678-1234-1234-1234-1234567890ab", "not-a-uuid"]), 1,
     "not-a-uuid"),
    ("uuid non-hex", "uuid", pa.array([None, "g2345678123412341234123456789abc"]), 1, "not a UUID"),
    ("uuid dashes misplaced", "uuid", pa.array(["123456781-234-1234-1234-1234567890ab"]), 0,
     "not a UUID"),
    ("uuid too long", "uuid", pa.array(["x" * 5000]), 0, "not a UUID"),
    ("bad inet", "inet", pa.array(["1.2.3.4", "999.1.1.1"]), 1, "999.1.1.1"),
    ("cidr host bits", "cidr", pa.array(["10.0.0.1/8"]), 0, "10.0.0.1/8"),
    ("inf->numeric", "numeric", pa.array([1.0, -INF]), 1, "inf"),
    ("float64->real overflow", "real", pa.array([1e300]), 0, "1e+300"),
    ("timestamp[s] overflow", "timestamptz", pa.array([10**17], pa.timestamp("s", "UTC")), 0,
     "out of PostgreSQL's range"),
    ("timestamp before 4714 BC", "timestamp", pa.array([-(2**62)], pa.timestamp("us")), 0,
     "out of PostgreSQL's range"),
    ("date after 5874897", "date", pa.array([2**31 - 1], pa.date32()), 0, "out of PostgreSQL"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pg_type", "array", "row", "mentions"),
    [case[1:] for case in BAD_VALUES],
    ids=[case[0] for case in BAD_VALUES],
)
def test_value_errors(
    pg_conn: Conn, table: str, pg_type: str, array: pa.Array, row: int, mentions: str
) -> None:
    batch = pa.record_batch({"ok": pa.array(range(len(array)), pa.int64()), "Bad Col": array})
    targets = create(pg_conn, table, {"ok": "bigint", "Bad Col": pg_type})
    encoder = build_encoder(list(batch.schema), targets)
    with pytest.raises(WriteError) as caught:
        copy_in(pg_conn, table, encoder, [batch])
    message = str(caught.value)
    assert "'Bad Col'" in message
    assert f"row {row} " in message
    assert mentions in message
    assert len(message) < 400  # long values are cut
    context = caught.value.context
    assert {"column": "Bad Col", "row": row}.items() <= context.items()
    assert context["problem"] in message  # what deadLetterTable records as the reason
    assert select(pg_conn, table, ["ok"]) == []  # the COPY was aborted


SERVER_CHECKS: list[tuple[str, str, pa.Array]] = [
    ("invalid json", "json", pa.array(["{not json"])),
    ("invalid jsonb", "jsonb", pa.array(['{"a": }'])),
    ("varchar too long", "varchar(3)", pa.array(["abcd"])),
    ("NUL in text", "text", pa.array(["a\x00b"])),
    ("numeric field overflow", "numeric(5,2)", pa.array([D("1234.5")], pa.decimal128(10, 1))),
]


@pytest.mark.parametrize(
    ("pg_type", "array"), [c[1:] for c in SERVER_CHECKS], ids=[c[0] for c in SERVER_CHECKS]
)
def test_what_the_server_checks(pg_conn: Conn, table: str, pg_type: str, array: pa.Array) -> None:
    """Encoded as they are; the server refuses them (the sink turns that into a WriteError)."""
    with pytest.raises(psycopg.errors.DataError):
        one_column(pg_conn, table, pg_type, array)


# -- pairs the encoder refuses -----------------------------------------------------------------

UNSUPPORTED: list[tuple[str, pa.DataType, TargetColumn, str]] = [
    ("bool->uuid", pa.bool_(), target("flag", 2950, "uuid"), "StringType"),
    ("string->integer", pa.string(), target("n", 23, "integer"), "cast('int')"),
    ("float64->bigint", pa.float64(), target("n", 20, "bigint"), "integer type"),
    ("int64->text", pa.int64(), target("t", 25, "text"), "StringType"),
    ("int64->timestamptz", pa.int64(), target("t", 1184, "timestamp with time zone"),
     "TimestampType"),
    ("date32->timestamp", pa.date32(), target("t", 1114, "timestamp without time zone"),
     "TimestampNTZType"),
    ("list<list<int>>->integer[]", pa.list_(pa.list_(pa.int32())), target("a", 1007, "integer[]"),
     "F.flatten"),
    ("struct->text", pa.struct([("a", pa.int8())]), target("s", 25, "text"), "StringType"),
    ("binary->text", pa.binary(), target("s", 1043, "character varying(5)"), "StringType"),
    ("int64->point", pa.int64(), target("p", 600, "point"), "cast in SQL"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("arrow", "column", "hint"),
    [case[1:] for case in UNSUPPORTED],
    ids=[case[0] for case in UNSUPPORTED],
)
def test_unsupported_pairs(arrow: pa.DataType, column: TargetColumn, hint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_encoder([pa.field("spark_" + column.name, arrow)], [column])
    message = str(caught.value)
    assert repr(column.name) in message
    assert str(arrow) in message
    assert column.type_name in message
    assert hint in message
    assert "Fix:" in message


def test_mismatched_lengths_and_schemas() -> None:
    with pytest.raises(ConfigError):
        build_encoder([pa.field("a", pa.int64())], [])
    encoder = build_encoder([pa.field("a", pa.int64())], [target("a", 20, "bigint")])
    with pytest.raises(ConfigError, match="'a'"):
        encoder.encode(pa.record_batch({"a": pa.array([1], pa.int32())}))
    with pytest.raises(ConfigError):
        encoder.encode(pa.record_batch({"a": pa.array([1]), "b": pa.array([1])}))


# -- the measuring snippet (asserts correctness only; prints the rate) -------------------------


def test_throughput_snippet(pg_conn: Conn, table: str) -> None:
    """1,000,000 rows of (bigint, timestamptz, integer, double, ~40-char text), 10,000 a batch.

    Run with -s to see the rate: the assertions are about the bytes, never about the time.
    """
    n, per_batch = 1_000_000, 10_000
    rng = np.random.default_rng(1)
    lengths = rng.integers(30, 51, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 ", np.uint8)
    chars = alphabet[rng.integers(0, len(alphabet), int(offsets[-1]))]
    data = pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "ts": pa.array(rng.integers(-(10**15), 2 * 10**15, n), pa.timestamp("us", tz="UTC")),
            "n": pa.array(rng.integers(-(2**31), 2**31, n).astype(np.int32)),
            "x": pa.array(rng.standard_normal(n)),
            "s": pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars)),
        }
    )
    batches = data.to_batches(max_chunksize=per_batch)
    columns = {
        "id": "bigint",
        "ts": "timestamp with time zone",
        "n": "integer",
        "x": "double precision",
        "s": "text",
    }
    targets = create(pg_conn, table, columns)
    encoder = build_encoder(list(data.schema), targets)

    started = time.perf_counter()
    total = sum(len(encoder.encode(batch)) for batch in batches)
    elapsed = time.perf_counter() - started
    print(f"\nencoded {n:,} rows in {elapsed * 1000:.0f} ms: {n / elapsed / 1e6:.2f} M rows/s")

    assert len(batches) == n // per_batch
    assert total == n * (2 + 12 + 12 + 8 + 12 + 4) + int(lengths.sum())
    first, last = batches[0], batches[-1]
    copy_in(pg_conn, table, encoder, [first, last])
    got = select(pg_conn, table, list(columns))
    want = [tuple(row.values()) for b in (first, last) for row in b.to_pylist()]
    assert got == want
