"""Encode-only speed of the Arrow → binary COPY encoder: no Spark, no PostgreSQL.

    .venv/bin/python benchmarks/encode.py                  # every shape, 10,000-row batches
    .venv/bin/python benchmarks/encode.py --only benchmark --repeat 15

Every shape is a list of record batches built once (never timed), encoded again and again by
``BinaryCopyEncoder.encode``; a run encodes every batch of the shape once. The runs go
round-robin (every shape once per round), so a change of load on the machine hits every shape
alike; a shape's rate is its median run. MB/s counts the bytes of the encoded tuples; "rows/CPU
s" divides by the CPU time of this process instead of the wall time, which other work on the
machine disturbs less. "benchmark" is the Spark benchmark's rows (``workload.make_rows``:
bigint, timestamptz, integer, double precision, ~40-character text).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from workload import make_rows

from sqlsink.postgres.catalog import TargetColumn
from sqlsink.postgres.encoding import BinaryCopyEncoder, build_encoder

# The oid and the name of every PostgreSQL type a shape uses.
PG_TYPES = {
    "boolean": 16,
    "bigint": 20,
    "integer": 23,
    "text": 25,
    "jsonb": 3802,
    "double precision": 701,
    "date": 1082,
    "timestamp with time zone": 1184,
    "numeric": 1700,
    "uuid": 2950,
    "bytea": 17,
    "integer[]": 1007,
}


@dataclass(frozen=True)
class Shape:
    name: str
    batches: list[pa.RecordBatch]
    pg_types: list[str]  # one per column

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b in self.batches)


Build = Callable[[Sequence[pa.Field], Sequence[TargetColumn]], BinaryCopyEncoder]


def with_nulls(table: pa.Table, share: float, seed: int) -> pa.Table:
    """The table with about ``share`` of every column's values made NULL."""
    rng = np.random.default_rng(seed)
    columns = []
    for column in table.columns:
        mask = pa.array(rng.random(len(table)) < share)
        columns.append(pc.if_else(mask, pa.nulls(len(table), column.type), column))
    return pa.table(columns, names=table.column_names)


def texts(rng: np.random.Generator, n: int, low: int, high: int) -> pa.Array:
    """n ASCII strings of low..high characters."""
    lengths = rng.integers(low, high + 1, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 ", np.uint8)
    chars = alphabet[rng.integers(0, len(alphabet), int(offsets[-1]))]
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def shapes(rows: int, batch_rows: int) -> list[Shape]:
    rng = np.random.default_rng(7)
    bench = make_rows(1, rows)  # the Spark benchmark's rows
    bench_types = ["bigint", "timestamp with time zone", "integer", "double precision", "text"]
    ints = pa.table(
        {f"i{k}": rng.integers(-(2**31), 2**31, rows).astype(np.int64) for k in range(4)}
        | {f"j{k}": rng.integers(-(2**31), 2**31, rows).astype(np.int32) for k in range(4)}
    )
    heavy = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "a": texts(rng, rows, 5, 20),
            "b": texts(rng, rows, 40, 120),
            "c": texts(rng, rows, 0, 400),
            "d": texts(rng, rows, 100, 2000),  # some of 1 KiB and more
        }
    )
    uuids = rng.integers(0, 256, (rows, 16), dtype=np.uint8)
    mixed = pa.table(
        {
            "flag": pa.array(rng.random(rows) < 0.5),
            "day": pa.array(rng.integers(0, 20_000, rows).astype(np.int32), pa.date32()),
            "amount": pa.array(rng.integers(-(10**12), 10**12, rows)).cast(pa.decimal128(38, 4)),
            "doc": pa.array([f'{{"k":{k}}}' for k in range(rows)]),
            "key": pa.array([u.tobytes().hex() for u in uuids]),
            "blob": pa.array([u.tobytes() for u in uuids], pa.binary()),
            "tags": pa.array([list(range(k % 5)) for k in range(rows)], pa.list_(pa.int32())),
        }
    )
    mixed_types = ["boolean", "date", "numeric", "jsonb", "uuid", "bytea", "integer[]"]
    tables = [
        ("benchmark", bench, bench_types),
        ("benchmark, 10% NULLs", with_nulls(bench, 0.1, 1), bench_types),
        ("8 ints", ints, ["bigint"] * 4 + ["integer"] * 4),
        ("8 ints, 10% NULLs", with_nulls(ints, 0.1, 2), ["bigint"] * 4 + ["integer"] * 4),
        ("text-heavy", heavy, ["bigint"] + ["text"] * 4),
        ("mixed types", mixed, mixed_types),
    ]
    return [
        Shape(name, table.to_batches(max_chunksize=batch_rows), pg_types)
        for name, table, pg_types in tables
    ]


def encoder(shape: Shape, build: Build) -> BinaryCopyEncoder:
    schema = shape.batches[0].schema
    targets = [
        TargetColumn(field.name, PG_TYPES[pg], pg, not_null=False, has_default=False)
        for field, pg in zip(schema, shape.pg_types, strict=True)
    ]
    return build(list(schema), targets)


def run(encode: BinaryCopyEncoder, batches: Sequence[pa.RecordBatch]) -> tuple[float, float, int]:
    """Seconds (wall, then CPU of this process) to encode every batch once; the bytes encoded."""
    wall, cpu = time.perf_counter(), time.process_time()
    size = sum(len(encode.encode(batch)) for batch in batches)
    return time.perf_counter() - wall, time.process_time() - cpu, size


def measure(shapes: Sequence[Shape], repeat: int, build: Build = build_encoder) -> dict[str, Any]:
    """Per shape: the median seconds of a run (wall and CPU), rows/s, MB/s."""
    encoders = [encoder(shape, build) for shape in shapes]
    for shape, enc in zip(shapes, encoders, strict=True):
        run(enc, shape.batches[:2])  # warm up
    walls: list[list[float]] = [[] for _ in shapes]
    cpus: list[list[float]] = [[] for _ in shapes]
    sizes = [0] * len(shapes)
    for _ in range(repeat):
        for k, (shape, enc) in enumerate(zip(shapes, encoders, strict=True)):
            wall, cpu, sizes[k] = run(enc, shape.batches)
            walls[k].append(wall)
            cpus[k].append(cpu)
    results: dict[str, Any] = {}
    for k, shape in enumerate(shapes):
        wall, cpu = statistics.median(walls[k]), statistics.median(cpus[k])
        results[shape.name] = {
            "seconds": wall,
            "cpu_seconds": cpu,
            "rows_per_s": shape.rows / wall,
            "mb_per_s": sizes[k] / wall / 1e6,
            "rows_per_cpu_s": shape.rows / cpu,
            "bytes_per_row": sizes[k] / shape.rows,
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows per shape (200,000)")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per batch (10,000)")
    parser.add_argument("--repeat", type=int, default=7, help="runs per shape (7)")
    parser.add_argument("--only", default="", help="shapes whose name starts with this")
    args = parser.parse_args()
    chosen = [s for s in shapes(args.rows, args.batch) if s.name.startswith(args.only)]
    print(f"{args.rows:,} rows a shape in batches of {args.batch:,}, median of {args.repeat}")
    results = measure(chosen, args.repeat)
    print(f"{'':24} {'M rows/s':>8} {'MB/s':>8} {'M rows/CPU s':>13} {'bytes/row':>10}")
    for name, r in results.items():
        print(
            f"{name:24} {r['rows_per_s'] / 1e6:8.2f} {r['mb_per_s']:8.1f} "
            f"{r['rows_per_cpu_s'] / 1e6:13.2f} {r['bytes_per_row']:10.0f}"
        )


if __name__ == "__main__":
    main()
