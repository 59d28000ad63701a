"""A tz-aware Arrow timestamp into ``timestamp`` (without time zone) is its wall time in its
own zone (the session time zone Spark labels it with); into ``timestamptz``, the instant."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from tests.pg.test_encoding import Conn, one_column

UTC = dt.timezone.utc
NY = "America/New_York"


def instants(*utc: dt.datetime, tz: str = NY, unit: str = "us") -> pa.Array:
    """Instants given in UTC, labelled with zone ``tz`` (the label is metadata only)."""
    stamps = [None if t is None else t.replace(tzinfo=UTC) for t in utc]
    return pa.array(stamps, pa.timestamp(unit, tz="UTC")).cast(pa.timestamp(unit, tz=tz))


def test_new_york_midnight_stays_midnight(pg_conn: Conn, table: str) -> None:
    # 05:00 UTC is 00:00 in New York (EST); 04:00 UTC is 00:00 (EDT) in summer
    array = instants(dt.datetime(2026, 1, 15, 5), dt.datetime(2026, 7, 1, 4), None)
    got = one_column(pg_conn, table, "timestamp", array)
    assert got == [dt.datetime(2026, 1, 15), dt.datetime(2026, 7, 1), None]


def test_dst_edges(pg_conn: Conn, table: str) -> None:
    # New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 2026-11-01: 02:00 EDT
    # falls back to 01:00 EST (06:00 UTC), so 01:30 happens twice
    array = instants(
        dt.datetime(2026, 3, 8, 6, 59, 59, 999_999),  # 01:59:59.999999 EST
        dt.datetime(2026, 3, 8, 7),  # 03:00 EDT
        dt.datetime(2026, 11, 1, 5, 30),  # 01:30 EDT
        dt.datetime(2026, 11, 1, 6, 30),  # 01:30 EST
    )
    got = one_column(pg_conn, table, "timestamp", array)
    assert got == [
        dt.datetime(2026, 3, 8, 1, 59, 59, 999_999),
        dt.datetime(2026, 3, 8, 3),
        dt.datetime(2026, 11, 1, 1, 30),
        dt.datetime(2026, 11, 1, 1, 30),
    ]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_every_unit(pg_conn: Conn, table: str, unit: str) -> None:
    array = instants(dt.datetime(2026, 1, 15, 5), tz="Asia/Kolkata", unit=unit)
    assert one_column(pg_conn, table, "timestamp", array) == [dt.datetime(2026, 1, 15, 10, 30)]


@pytest.mark.parametrize(("tz", "hour"), [("UTC", 5), ("-03:00", 2), ("+05:30", 10)])
def test_utc_and_fixed_offsets(pg_conn: Conn, table: str, tz: str, hour: int) -> None:
    got = one_column(pg_conn, table, "timestamp", instants(dt.datetime(2026, 1, 15, 5), tz=tz))
    assert got == [dt.datetime(2026, 1, 15, hour, 30 if tz == "+05:30" else 0)]


def test_timestamptz_keeps_the_instant(pg_conn: Conn, table: str) -> None:
    at = dt.datetime(2026, 3, 8, 7, tzinfo=UTC)
    got: list[Any] = one_column(pg_conn, table, "timestamptz", instants(at.replace(tzinfo=None)))
    assert got == [at]


def test_tz_less_into_timestamp_is_unchanged(pg_conn: Conn, table: str) -> None:
    array = pa.array([dt.datetime(2026, 3, 8, 2, 30)], pa.timestamp("us"))  # TimestampNTZ
    assert one_column(pg_conn, table, "timestamp", array) == [dt.datetime(2026, 3, 8, 2, 30)]


def test_arrays_of_timestamps(pg_conn: Conn, table: str) -> None:
    stamps = [dt.datetime(2026, 1, 15, 5, tzinfo=UTC), None]
    array = pa.array([stamps, None], pa.list_(pa.timestamp("us", tz="UTC"))).cast(
        pa.list_(pa.timestamp("us", tz=NY))
    )
    got = one_column(pg_conn, table, "timestamp[]", array)
    assert got == [[dt.datetime(2026, 1, 15), None], None]


def test_out_of_range_after_the_shift_is_refused(pg_conn: Conn, table: str) -> None:
    from sqlsink.errors import WriteError

    # 4714-11-24 00:00 BC is PostgreSQL's first timestamp; in New York it is the day before
    first = -211_813_488_000_000_000 + 10_957 * 86_400_000_000
    array = pa.array([first + 10**9], pa.timestamp("us", tz=NY))
    with pytest.raises(WriteError, match="out of PostgreSQL's range"):
        one_column(pg_conn, table, "timestamp", array)
