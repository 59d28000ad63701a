"""A partition's XA branch on a real MariaDB (sqlsink/mariadb/partition.py): the load
round-trips every value of the type table, refuses what MariaDB cannot hold or would
change, and leaves nothing visible or prepared when it refuses."""

from __future__ import annotations

import datetime as dt
import math
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal

import pyarrow as pa
import pytest

from sqlsink.errors import WriteError
from sqlsink.mariadb.connection import connect, rows
from sqlsink.mariadb.partition import SQL_MODE
from sqlsink.mariadb.schema import ensure_schema
from tests.fix_mariadb import MariaServer
from tests.mariadb.protocol import Writer, forget_sink, ids_of, make_table, new_sink, prepared_of

TYPES = (
    "id bigint PRIMARY KEY, s varchar(200), t text, b varbinary(200), f double, "
    "r float, ok boolean, d decimal(38, 10), big decimal(38, 0), ts datetime(6), "
    "tz timestamp(6) NULL, day date, small smallint"
)
UTC = dt.timezone.utc
NASTY = ["", "a\tb", "line\nnext", "back\\slash", "\\N", "\\", "NULL", "x\r\ny", "nul\x00in",
         "quote'\"`", "emoji 😀🎉 ünï", "tab at end\t", "\\t literal"]  # fmt: skip


@pytest.fixture
def url(mariadb_server: MariaServer) -> str:
    return mariadb_server.url()


@pytest.fixture
def writer(url: str) -> Iterator[Writer]:
    table = f"t_{uuid.uuid4().hex[:8]}"
    conn = connect(url)
    ensure_schema(conn)  # the commit log, which the partition's checks read
    conn.close()
    w = Writer(url, table, new_sink())
    yield w
    forget_sink(url, w.sink)


def table_rows(url: str, table: str) -> list[tuple[object, ...]]:
    conn = connect(url)
    try:
        return rows(conn, f"SELECT * FROM `{table}` ORDER BY id")
    finally:
        conn.close()


def typed_batch() -> pa.RecordBatch:
    n = len(NASTY)
    stamps = [
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        dt.datetime(2038, 1, 19, 3, 14, 7, 0, tzinfo=UTC),
    ]
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(range(n), pa.int64()),
            "s": pa.array(NASTY),
            "t": pa.array(list(reversed(NASTY))),
            "b": pa.array([bytes([i, 0, 9, 10, 92, 255 - i]) if i % 4 else b"" for i in range(n)]),
            "f": pa.array([0.1, -0.0, 1e308, 5e-324, 1 / 3, 2.0**53 + 1, -1.5e-300] * 2)[:n],
            "r": pa.array([1.5, -2.25, 0.0, 3.0] * 4, pa.float64())[:n],
            "ok": pa.array([True, False] * 7)[:n],
            "d": pa.array(
                [Decimal("9" * 28 + "." + "9" * 10), Decimal("-0.0000000001"), Decimal(0)] * 5,
                pa.decimal128(38, 10),
            )[:n],
            "big": pa.array([Decimal("9" * 38), Decimal("-" + "9" * 38)] * 7, pa.decimal128(38, 0))[
                :n
            ],
            "ts": pa.array(stamps * 5, pa.timestamp("us", "UTC"))[:n],
            "tz": pa.array(stamps[1:] * 7, pa.timestamp("us", "UTC"))[:n],
            "day": pa.array([dt.date(1000, 1, 1), dt.date(9999, 12, 31), dt.date(2024, 2, 29)] * 5)[
                :n
            ],
            "small": pa.array([-32768, 32767, 0] * 5, pa.int16())[:n],
        }
    )


def with_nulls(batch: pa.RecordBatch) -> pa.RecordBatch:
    """One more row: NULL in every column but the key."""
    nulls = {
        f.name: pa.array([len(NASTY)] if f.name == "id" else [None], f.type) for f in batch.schema
    }
    return pa.RecordBatch.from_pydict(nulls, schema=batch.schema)


def test_every_value_of_the_type_table_round_trips_exactly(writer: Writer, url: str) -> None:
    make_table(url, writer.table, TYPES)
    given = typed_batch()
    report = writer.commit(0, [writer.write(0, [given, with_nulls(given)])])
    assert len(report.committed) == 1
    found = table_rows(url, writer.table)
    expected = given.to_pylist()
    assert len(found) == len(expected) + 1
    for row, want in zip(found, expected, strict=False):
        got = dict(zip([f.name for f in given.schema], row, strict=True))
        for name in ("id", "s", "t", "d", "big", "day", "small"):
            assert got[name] == want[name], name
        assert bytes(got["b"]) == want["b"]  # type: ignore[arg-type]
        assert got["f"] == want["f"]  # -0.0 reads back 0.0: MariaDB's DOUBLE (test below)
        assert got["r"] == want["r"]
        assert bool(got["ok"]) is want["ok"]
        assert got["ts"] == want["ts"].replace(tzinfo=None)  # type: ignore[union-attr]
        assert got["tz"] == want["tz"].replace(tzinfo=None)  # type: ignore[union-attr]
    assert found[-1] == (len(NASTY), *([None] * (len(given.schema) - 1)))
    assert found[0][1] == "" and found[0][1] is not None  # empty is not NULL


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_naming_batch_partition_column_and_fix(
    writer: Writer, url: str, bad: float
) -> None:
    make_table(url, writer.table, "id bigint PRIMARY KEY, amount double")
    batch = pa.RecordBatch.from_pydict(
        {"id": pa.array([1, 2], pa.int64()), "amount": pa.array([1.0, bad])}
    )
    with pytest.raises(WriteError) as err:
        writer.write(3, [batch], partition=2)
    text = str(err.value)
    assert "batch 3" in text and "partition 2" in text and "'amount'" in text
    assert "NaN or infinite" in text and "Fix:" in text
    assert err.value.context["column"] == "amount"
    assert ids_of(url, writer.table) == [] and prepared_of(url, writer.sink) == []


@pytest.mark.parametrize(
    ("column", "values", "said"),
    [
        ("name", pa.array(["a", None, "c"]), "NULL"),
        ("small", pa.array([1, 70000, 3], pa.int64()), "range"),
        (
            "d",
            pa.array([Decimal("1.5"), Decimal("123456.5"), Decimal(0)], pa.decimal128(38, 1)),
            "range",
        ),
    ],
)
def test_bad_input_is_a_clear_error_nothing_visible_nothing_prepared(
    writer: Writer, url: str, column: str, values: pa.Array, said: str
) -> None:
    """LOAD DATA LOCAL turns strict mode's errors into warnings (the server cannot stop the
    client's stream): each warning is an error of the sink, naming the column."""
    make_table(
        url, writer.table, "id bigint PRIMARY KEY, name varchar(10) NOT NULL, small smallint, "
        "d decimal(5, 1)",
    )  # fmt: skip
    base = {
        "id": pa.array([1, 2, 3], pa.int64()),
        "name": pa.array(["a", "b", "c"]),
        "small": pa.array([1, 2, 3], pa.int64()),
        "d": pa.array([Decimal(1), Decimal(2), Decimal(3)], pa.decimal128(38, 1)),
    }
    batch = pa.RecordBatch.from_pydict({**base, column: values})
    with pytest.raises(WriteError) as err:
        writer.write(5, [batch], partition=1)
    text = str(err.value)
    assert f"column {column!r}" in text and said in text, text
    assert "batch 5" in text and "partition 1" in text and "Fix:" in text
    assert ids_of(url, writer.table) == [] and prepared_of(url, writer.sink) == []


def test_a_duplicate_key_is_an_error_not_a_skipped_row(writer: Writer, url: str) -> None:
    make_table(url, writer.table)
    with pytest.raises(WriteError, match="Duplicate entry"):
        writer.write(0, [pa.RecordBatch.from_pydict({"id": pa.array([7, 8, 7], pa.int64())})])
    assert ids_of(url, writer.table) == [] and prepared_of(url, writer.sink) == []


def test_the_load_session_is_strict_and_the_servers_default_is_too(url: str) -> None:
    conn = connect(url)
    try:
        default = str(rows(conn, "SELECT @@GLOBAL.sql_mode")[0][0])
    finally:
        conn.close()
    assert "STRICT_TRANS_TABLES" in default  # MariaDB 10.11's default
    assert "STRICT_ALL_TABLES" in SQL_MODE.split(",")


def test_many_batches_stream_through_the_fifo_and_commit_once(writer: Writer, url: str) -> None:
    make_table(url, writer.table)
    parts = [
        [pa.RecordBatch.from_pydict({"id": pa.array(range(s, s + 500), pa.int64())})
         for s in range(p * 5000, (p + 1) * 5000, 500)]
        for p in range(2)
    ]  # fmt: skip
    outcomes = [writer.write(1, part, p) for p, part in enumerate(parts)]
    assert [o.rows for o in outcomes] == [5000, 5000]
    assert ids_of(url, writer.table) == []  # prepared: not visible
    assert len(prepared_of(url, writer.sink)) == 2
    writer.commit(1, list(outcomes))
    assert ids_of(url, writer.table) == list(range(10000))
    assert prepared_of(url, writer.sink) == []
    # a replay of the decided batch writes nothing
    again = writer.write(1, range(3))
    assert again.skipped and again.gid is None
    assert ids_of(url, writer.table) == list(range(10000))


def test_mariadbs_double_keeps_no_negative_zero(writer: Writer, url: str) -> None:
    """Not the load's doing: a plain INSERT of -0e0 reads back as 0 too (equal values)."""
    make_table(url, writer.table, "id bigint PRIMARY KEY, f double")
    conn = connect(url)
    try:
        rows(conn, f"INSERT INTO `{writer.table}` VALUES (1, -0e0), (2, %s)", (-0.0,))
        found = [float(r[0]) for r in rows(conn, f"SELECT f FROM `{writer.table}` ORDER BY id")]
    finally:
        conn.close()
    assert found == [0.0, 0.0] and all(math.copysign(1, f) == 1 for f in found)


@pytest.mark.parametrize("missing", ["table", "column"])
def test_a_statement_the_server_refuses_before_reading_ends_at_once(
    writer: Writer, url: str, missing: str
) -> None:
    """The server refuses LOAD DATA before it reads the FIFO: the feeder, waiting for a
    reader, is let go (no thread left blocked) and the error names the cause."""
    if missing == "column":
        make_table(url, writer.table)
    batches = [
        pa.RecordBatch.from_pydict({"id": pa.array(range(s, s + 1000), pa.int64()),
                                    "nope": pa.array(["x" * 100] * 1000)})
        for s in range(0, 200_000, 1000)
    ]  # fmt: skip
    began = time.monotonic()
    with pytest.raises(WriteError) as err:
        writer.write(0, batches if missing == "column" else batches[:1])
    assert time.monotonic() - began < 5
    assert ("doesn't exist" if missing == "table" else "'nope'") in str(err.value)
    assert "batch 0" in str(err.value) and prepared_of(url, writer.sink) == []


def test_a_server_without_local_infile_is_refused_with_the_setting_to_change(
    mariadb_server: MariaServer, writer: Writer, url: str
) -> None:
    make_table(url, writer.table)
    root = mariadb_server.connect(root=True)
    try:
        rows(root, "SET GLOBAL local_infile = 0")
        with pytest.raises(WriteError, match="local_infile = ON") as err:
            writer.write(0, range(3))
    finally:
        rows(root, "SET GLOBAL local_infile = 1")
        root.close()
    assert "batch 0" in str(err.value)
    assert ids_of(url, writer.table) == [] and prepared_of(url, writer.sink) == []
