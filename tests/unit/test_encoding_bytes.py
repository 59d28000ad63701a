"""The binary COPY encoder, byte for byte, against per-row Python references (no server).

tests/pg/test_encoding.py checks what PostgreSQL reads back; these check the exact bytes over
many random batches: NULL masks (none, some, all), empty, non-ASCII and long (≥ 1 KiB)
strings, NULL slots that still hold data, sliced arrays (non-zero offsets), 0- and 1-row
batches; and the row assembly (``assemble``) on its own against a naive one.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from sqlsink.postgres.catalog import TargetColumn
from sqlsink.postgres.encoding import build_encoder
from sqlsink.postgres.encoding.fields import Body, Fields
from sqlsink.postgres.encoding.layout import assemble
from sqlsink.postgres.encoding.numeric import numeric_bytes

UTC = dt.timezone.utc
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=UTC)
NULL = b"\xff\xff\xff\xff"

# -- the per-row reference -----------------------------------------------------------------------


def field(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def us_since_2000(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - PG_EPOCH) // dt.timedelta(microseconds=1)


def numeric(value: decimal.Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    mag = int("".join(map(str, digits)) or "0")
    return numeric_bytes(bool(sign) and mag != 0, mag, -exponent)


def int_array(values: list[int | None], oid: int, pack: str) -> bytes:
    if not values:
        return struct.pack(">iii", 0, 0, oid)
    head = struct.pack(">iiiii", 1, None in values, oid, len(values), 1)
    return head + b"".join(NULL if v is None else field(struct.pack(pack, v)) for v in values)


PAYLOAD: dict[str, tuple[int, Callable[[Any], bytes]]] = {
    "smallint": (21, lambda v: struct.pack(">h", v)),
    "integer": (23, lambda v: struct.pack(">i", v)),
    "bigint": (20, lambda v: struct.pack(">q", v)),
    "real": (700, lambda v: struct.pack(">f", v)),
    "double precision": (701, lambda v: struct.pack(">d", v)),
    "boolean": (16, lambda v: b"\x01" if v else b"\x00"),
    "text": (25, lambda v: v.encode()),
    "bytea": (17, bytes),
    "jsonb": (3802, lambda v: b"\x01" + v.encode()),
    "uuid": (2950, lambda v: uuid.UUID(v).bytes),
    "date": (1082, lambda v: struct.pack(">i", (v - dt.date(2000, 1, 1)).days)),
    "timestamptz": (1184, lambda v: struct.pack(">q", us_since_2000(v))),
    "numeric": (1700, numeric),
    "integer[]": (1007, lambda v: int_array(v, 23, ">i")),
    "bigint[]": (1016, lambda v: int_array(v, 20, ">q")),
}


def reference(batch: pa.RecordBatch, pg_types: list[str]) -> bytes:
    columns = [c.to_pylist() for c in batch.columns]
    out = bytearray()
    for row in zip(*columns, strict=True):
        out += struct.pack(">h", len(row))
        for value, pg in zip(row, pg_types, strict=True):
            out += NULL if value is None else field(PAYLOAD[pg][1](value))
    return bytes(out)


def encoded(batch: pa.RecordBatch, pg_types: list[str]) -> bytes:
    targets = [
        TargetColumn(f.name, PAYLOAD[pg][0], pg, not_null=False, has_default=False)
        for f, pg in zip(batch.schema, pg_types, strict=True)
    ]
    return bytes(build_encoder(list(batch.schema), targets).encode(batch))


# -- random columns --------------------------------------------------------------------------------


def with_validity(arr: pa.Array, valid: np.ndarray) -> pa.Array:
    """arr with NULLs where not valid, its values left in the NULL slots (dirty slots)."""
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(arr.type, len(arr), [bitmap, *arr.buffers()[1:]])


def text(rng: np.random.Generator) -> str:
    kind = rng.integers(0, 6)
    if kind == 0:
        return ""
    if kind == 1:  # 1 KiB and more
        return "x" * int(rng.integers(1024, 3000))
    if kind == 2:  # multi-byte UTF-8
        return "".join(rng.choice(["é", "€", "𝄞", "ß", "a", "中"], int(rng.integers(1, 20))))
    return "".join(rng.choice(list("abcdef 0123456789"), int(rng.integers(1, 60))))


def column(rng: np.random.Generator, pg: str, n: int) -> pa.Array:
    """n random values for a PostgreSQL type, with random NULLs, sliced out of a longer array."""
    skip = int(rng.integers(0, 5))
    m = n + skip + int(rng.integers(0, 3))
    share = rng.choice([0.0, 0.0, 0.1, 0.5, 1.0])
    valid = rng.random(m) >= share
    if pg in ("smallint", "integer", "bigint"):
        bits = {"smallint": 16, "integer": 32, "bigint": 64}[pg]
        source = rng.choice([8, 16, 32, 64])
        bits = min(bits, source)
        values = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), m, dtype=np.int64)
        arr = pa.array(values.astype(f"int{source}"))
    elif pg in ("real", "double precision"):
        values = rng.standard_normal(m) * 10.0 ** rng.integers(-5, 30, m)
        arr = pa.array(values.astype(np.float32 if pg == "real" else rng.choice(["f4", "f8"])))
    elif pg == "boolean":
        arr = pa.array(rng.random(m) < 0.5)
    elif pg in ("text", "jsonb", "bytea"):
        strings = [f'"{text(rng)}"' if pg == "jsonb" else text(rng) for _ in range(m)]
        large = bool(rng.integers(0, 2))
        if pg == "bytea":
            kind = pa.large_binary() if large else pa.binary()
            arr = pa.array([s.encode() for s in strings], kind)
        else:
            arr = pa.array(strings, pa.large_string() if large else pa.string())
    elif pg == "uuid":
        arr = pa.array(
            [
                str(uuid.UUID(bytes=rng.bytes(16)))
                if rng.random() < 0.5
                else rng.bytes(16).hex().upper()
                for _ in range(m)
            ]
        )
    elif pg == "date":
        arr = pa.array(rng.integers(-700_000, 700_000, m).astype(np.int32), pa.date32())
    elif pg == "timestamptz":
        unit = rng.choice(["s", "ms", "us"])
        scale = {"s": 10**6, "ms": 10**3, "us": 1}[unit]
        values = rng.integers(-6 * 10**16, 2 * 10**17, m) // scale  # years 70..8300
        arr = pa.array(values, pa.timestamp(unit, tz=rng.choice([None, "UTC", "Asia/Tokyo"])))
    elif pg == "numeric":
        scale = int(rng.integers(0, 10))
        digits = rng.integers(-(10**17), 10**17, m)
        arr = pa.array(
            [decimal.Decimal(int(d)).scaleb(-scale) for d in digits], pa.decimal128(38, scale)
        )
    elif pg in ("integer[]", "bigint[]"):
        lists = [
            [None if rng.random() < 0.2 else int(v) for v in rng.integers(-1000, 1000, k)]
            for k in rng.integers(0, 5, m)
        ]
        arr = pa.array(lists, pa.list_(pa.int32() if pg == "integer[]" else pa.int64()))
    else:
        raise AssertionError(pg)
    if pg not in ("integer[]", "bigint[]") and bool(rng.integers(0, 2)):
        arr = with_validity(arr, valid)  # NULL slots keep their values
    else:
        arr = pa.array(arr.to_pylist(), arr.type, mask=~valid)
    return arr.slice(skip, n)


@pytest.mark.parametrize("seed", range(60))
def test_random_batches_match_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pg_types = list(rng.choice(sorted(PAYLOAD), int(rng.integers(1, 8))))
    n = int(rng.choice([0, 1, 2, 7, 100, 1000]))
    batch = pa.record_batch(
        [column(rng, pg, n) for pg in pg_types], names=[f"c{k}" for k in range(len(pg_types))]
    )
    assert encoded(batch, pg_types) == reference(batch, pg_types)


def test_the_benchmark_shape_matches_the_reference() -> None:
    rng = np.random.default_rng(1)
    n = 10_000
    batch = pa.record_batch(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "ts": pa.array(rng.integers(0, 10**15, n), pa.timestamp("us", tz="UTC")),
            "n": pa.array(rng.integers(-(2**31), 2**31, n).astype(np.int32)),
            "x": pa.array(rng.standard_normal(n)),
            "s": pa.array([f"customer-{i:010d}/{i * 7919:016x}/view " for i in range(n)]),
        }
    )
    pg_types = ["bigint", "timestamptz", "integer", "double precision", "text"]
    assert encoded(batch, pg_types) == reference(batch, pg_types)
    sliced = batch.slice(3, 5000)
    assert encoded(sliced, pg_types) == reference(sliced, pg_types)


# -- the row assembly on its own -----------------------------------------------------------------

DTYPES = [np.dtype(t) for t in (">i2", ">i4", ">i8", ">f8", "u1", ">u2", "V3")]


def random_fields(rng: np.random.Generator, n: int) -> tuple[Fields, list[bytes]]:
    """A part (length word first) and, per row, the bytes it stands for."""
    cols: list[tuple[np.dtype[Any], Any]] = [(np.dtype(">i4"), rng.integers(0, 99, n))]
    for _ in range(int(rng.integers(0, 4))):
        dtype = DTYPES[int(rng.integers(0, len(DTYPES)))]
        if dtype.kind == "V":
            raw = rng.integers(0, 256, (n, dtype.itemsize), dtype=np.uint8)
            cols.append((dtype, raw.view(dtype)[:, 0]))
        elif rng.random() < 0.5:
            cols.append((dtype, int(rng.integers(0, 100))))
        else:
            cols.append((dtype, rng.integers(0, 100, n)))
    width = sum(d.itemsize for d, _ in cols)
    valid = rng.random(n) >= rng.choice([0.0, 0.3]) if rng.random() < 0.7 else None
    widths = rng.integers(4, width + 1, n) if rng.random() < 0.3 else None
    body = None
    if rng.random() < 0.6:
        lens = rng.integers(0, 40, n)
        if rng.random() < 0.3:
            lens[rng.random(n) < 0.5] = 0
        if rng.random() < 0.5:  # in order, maybe with gaps
            gaps = rng.integers(0, 3, n) * (rng.random() < 0.5)
            src = np.cumsum(lens + gaps) - lens
            size = int(src[-1] + lens[-1]) + int(rng.integers(0, 9))
        else:  # anywhere: out of order, overlapping
            size = int(lens.max()) + int(rng.integers(0, 200))
            src = rng.integers(0, size - lens + 1)
        data = rng.integers(0, 256, size, dtype=np.uint8)
        if valid is not None:
            lens = np.where(valid, lens, 0)
        body = Body(data, src.astype(np.int64), lens.astype(np.int64))
    rows = []
    for i in range(n):
        if valid is not None and not valid[i]:
            rows.append(NULL)
            continue
        prefix = b"".join(
            np.array(v[i] if isinstance(v, np.ndarray) else v, d).tobytes() for d, v in cols
        )
        keep = width if widths is None else int(widths[i])
        run = b"" if body is None else body.data[body.src[i] : body.src[i] + body.lens[i]]
        rows.append(prefix[:keep] + bytes(run))
    return Fields(cols, valid, widths, body), rows


@pytest.mark.parametrize("seed", range(200))
def test_assemble_matches_a_naive_layout(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 2, 3, 50, 500]))
    parts = [random_fields(rng, n) for _ in range(int(rng.integers(1, 6)))]
    want = b"".join(b"".join(rows[i] for _, rows in parts) for i in range(n))
    assert bytes(assemble(n, [p for p, _ in parts])) == want
    for fields, rows in parts:  # what arrays of arrays rely on
        sizes = np.broadcast_to(fields.sizes, (n,))
        assert sizes.tolist() == [len(r) for r in rows]
