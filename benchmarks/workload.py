"""The benchmark's rows, generated once as Parquet under ``benchmarks/work/data`` (never timed).

Every row is (id bigint, ts timestamptz, n int, x double, s text of ~40 characters). Ids are
unique across all data sets, so any of them can be loaded into the same table, whose primary
key is ``id``.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SPARK_SCHEMA = "id BIGINT, ts TIMESTAMP, n INT, x DOUBLE, s STRING"
COPY_TYPES = ("int8", "timestamptz", "int4", "float8", "text")
TABLE_DDL = (
    "CREATE TABLE {table} (id bigint PRIMARY KEY, ts timestamptz NOT NULL, "
    "n integer NOT NULL, x double precision NOT NULL, s text NOT NULL)"
)
_TS_BASE_US = 1_767_225_600_000_000  # 2026-01-01 00:00 UTC
_KINDS = ("view ", "click", "buy  ", "scan ", "login")
_FORMAT = 1  # bump when the generated rows change: cached data sets are then rebuilt


@dataclass(frozen=True)
class Dataset:
    """A directory of Parquet files holding ids [first, first + rows)."""

    path: Path
    first: int
    rows: int
    files: int


def make_rows(first: int, count: int) -> pa.Table:
    """Rows first .. first + count - 1, the same whatever process builds them."""
    ids = np.arange(first, first + count, dtype=np.int64)
    rng = np.random.default_rng(first)
    noise = rng.integers(0, 2**63 - 1, count, dtype=np.int64)
    text = [
        f"customer-{i:010d}/{h:016x}/{_KINDS[i % 5]}"
        for i, h in zip(ids.tolist(), noise.tolist(), strict=True)
    ]
    return pa.table(
        {
            "id": ids,
            "ts": pa.array(_TS_BASE_US + ids * 1_000, type=pa.timestamp("us", tz="UTC")),
            "n": (ids % 100_000).astype(np.int32),
            "x": rng.random(count),
            "s": pa.array(text, type=pa.string()),
        }
    )


def ensure_dataset(root: Path, name: str, first: int, rows: int, files: int) -> Dataset:
    """The data set's directory, written (atomically, by rename) unless already there."""
    path = root / f"{name}-v{_FORMAT}-{first}-{rows}-{files}"
    if not path.is_dir():
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for number, (start, count) in enumerate(split(first, rows, files)):
            pq.write_table(make_rows(start, count), partial / f"part-{number:04d}.parquet")
        partial.rename(path)
    return Dataset(path, first, rows, files)


def split(first: int, rows: int, parts: int) -> list[tuple[int, int]]:
    """(start, count) of ``parts`` nearly equal consecutive ranges."""
    bounds = [first + rows * k // parts for k in range(parts + 1)]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def write_file(path: Path, first: int, count: int) -> None:
    """One Parquet file, made visible at once (for a watched source directory)."""
    tmp = path.parent.parent / f".{path.name}.tmp"
    pq.write_table(make_rows(first, count), tmp)
    tmp.rename(path)


def load_tuples(dataset: Dataset) -> list[tuple[Any, ...]]:
    """The data set as Python tuples, in id order (for the plain COPY ceiling)."""
    table = pq.read_table(dataset.path).sort_by("id")
    columns = [column.to_pylist() for column in table.columns]
    return list(zip(*columns, strict=True))
