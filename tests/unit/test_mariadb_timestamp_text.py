"""The MariaDB load's text of a timestamp is 'YYYY-MM-DD hh:mm:ss.ffffff' for every value
DATETIME(6) holds (years 1000 to 9999) and beyond, zoned or not, in every unit Spark's
Arrow batches use: the text Arrow's cast gives, checked against strftime's over the whole
range (the load encodes with the cast, a tenth of strftime's cost)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sqlsink.mariadb.encoding import encode

FIRST = int(datetime(1, 1, 1).replace(tzinfo=timezone.utc).timestamp() * 1_000_000)
LAST = int(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc).timestamp() * 1e6)


def _lines(values: pa.Array) -> list[str]:
    return encode(pa.record_batch([values], names=["t"])).decode().splitlines()


def test_the_text_is_strftimes_over_the_whole_range() -> None:
    rng = np.random.default_rng(7)
    micros = np.concatenate(
        [rng.integers(FIRST, LAST, 200_000), [FIRST, LAST, 0, -1, 1, 999_999, -999_999]]
    )
    values = pa.array(micros, pa.timestamp("us"))
    expected = pc.strftime(values, format="%Y-%m-%d %H:%M:%S").to_pylist()
    assert _lines(values) == expected
    assert _lines(pa.array([0, -1], pa.timestamp("us"))) == [
        "1970-01-01 00:00:00.000000",
        "1969-12-31 23:59:59.999999",
    ]


def test_zones_units_and_nulls() -> None:
    instant = datetime(2026, 3, 29, 1, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    zoned = pa.array([instant, None], pa.timestamp("us", "Europe/Berlin"))
    assert _lines(zoned) == ["2026-03-28 23:30:00.123456", "\\N"]  # the instant in UTC
    assert _lines(pa.array([1_500], pa.timestamp("ms"))) == ["1970-01-01 00:00:01.500000"]
    assert _lines(pa.array([2], pa.timestamp("s", "UTC"))) == ["1970-01-01 00:00:02.000000"]
    nanos = pa.array([1_234_567_891], pa.timestamp("ns"))
    assert _lines(nanos) == ["1970-01-01 00:00:01.234567"]
