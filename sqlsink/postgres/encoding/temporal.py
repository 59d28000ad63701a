"""Dates, timestamps, times and durations into date, timestamp[tz], time and interval."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sqlsink.postgres.encoding.buffers import values_and_validity
from sqlsink.postgres.encoding.fields import (
    Arr,
    Encode,
    Fields,
    ValueProblem,
    first_valid,
    fixed_fields,
)
from sqlsink.postgres.encoding.oids import TIMESTAMP

# PostgreSQL's limits (src/include/datatype/timestamp.h), in the units used here.
_PG_EPOCH_DAYS = 10_957  # 2000-01-01 - 1970-01-01
_PG_EPOCH_US = _PG_EPOCH_DAYS * 86_400_000_000
_MIN_DATE, _END_DATE = -2_451_545, 2_145_031_949  # days since 2000, [min, end)
_MIN_TS_UNIX_US = -211_813_488_000_000_000 + _PG_EPOCH_US  # 4714-11-24 BC, in unix µs
_I64_MAX = 2**63 - 1
_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1}


def date_encoder(arrow: pa.DataType, oid: int) -> Encode:
    is64 = pa.types.is_date64(arrow)

    def dates(arr: pa.Array) -> Fields:
        values, valid = values_and_validity(arr, np.int64 if is64 else np.int32)
        days = (values // 86_400_000 if is64 else values.astype(np.int64)) - _PG_EPOCH_DAYS
        i = first_valid((days < _MIN_DATE) | (days >= _END_DATE), valid)
        if i is not None:
            raise ValueProblem(
                i,
                f"date {values[i]} ({'ms' if is64 else 'days'} since 1970) is out of "
                "PostgreSQL's date range",
            )
        return fixed_fields(valid, (">i4", days))

    return dates


def _to_us(values: Arr, unit: str) -> tuple[Arr, Arr | None]:
    """int64 values of a unit to microseconds (floored), and which overflowed."""
    if unit == "ns":
        return np.floor_divide(values, 1000), None
    mult = _UNIT_US[unit]
    if mult == 1:
        return values, None
    bad = (values > _I64_MAX // mult) | (values < -(_I64_MAX // mult))
    return values * mult, (bad if bad.any() else None)


def timestamp_encoder(arrow: pa.DataType, oid: int) -> Encode:
    """Instants into ``timestamptz``, exactly; into ``timestamp`` (without time zone), a
    tz-aware Arrow timestamp becomes its wall time in its own zone (DST-aware, vectorised
    by ``pyarrow.compute.local_timestamp``). Spark labels a TimestampType column with the
    session time zone (``spark.sql.session.timeZone``) in the Arrow batches it hands the
    sink, so 00:00 in New York is stored as 00:00, as Spark's JDBC writer stores it when
    the JVM's zone is the session's. A tz-less one (TimestampNTZ) is stored as it is."""
    unit = arrow.unit
    wall = oid == TIMESTAMP and arrow.tz is not None

    def timestamps(arr: pa.Array) -> Fields:
        if wall:
            arr = pc.local_timestamp(arr)
        values, valid = values_and_validity(arr, np.int64)
        us, overflow = _to_us(values, unit)
        bad = us < _MIN_TS_UNIX_US
        if overflow is not None:
            bad |= overflow
        i = first_valid(bad, valid)
        if i is not None:
            raise ValueProblem(
                i, f"timestamp {values[i]} ({unit} since 1970) is out of PostgreSQL's range"
            )
        return fixed_fields(valid, (">i8", us - _PG_EPOCH_US))

    return timestamps


def time_encoder(arrow: pa.DataType, oid: int) -> Encode:
    unit = arrow.unit
    dtype = np.int32 if pa.types.is_time32(arrow) else np.int64

    def times(arr: pa.Array) -> Fields:
        values, valid = values_and_validity(arr, dtype)
        us, _ = _to_us(values.astype(np.int64), unit)  # a time of day cannot overflow
        return fixed_fields(valid, (">i8", us))

    return times


def duration_encoder(arrow: pa.DataType, oid: int) -> Encode:
    unit = arrow.unit

    def intervals(arr: pa.Array) -> Fields:
        values, valid = values_and_validity(arr, np.int64)
        us, overflow = _to_us(values, unit)
        i = None if overflow is None else first_valid(overflow, valid)
        if i is not None:
            raise ValueProblem(i, f"duration {values[i]} {unit} is out of range for interval")
        return fixed_fields(valid, (">i8", us), (">i4", 0), (">i4", 0))

    return intervals
