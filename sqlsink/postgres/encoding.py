"""Arrow record batches to PostgreSQL binary COPY tuples, vectorised with numpy.

The binary COPY stream is a header (``COPY_HEADER``), tuples, and a trailer (``COPY_TRAILER``).
A tuple is an int16 field count followed by, for every field, an int32 length (-1 for NULL)
and that many bytes of the type's binary "send" format. All integers are big-endian.

How a batch is encoded: every column turns its Arrow array into *fields* -- per value a
prefix (the length word and any fixed-size head: a value, a jsonb version byte, an array
header...) given as big-endian columns (one numpy array, or one scalar, per part of the
prefix), and optionally a variable-length body (string bytes, numeric digits, array elements)
kept as runs of a source buffer. ``_assemble`` lays the rows out: the prefixes between two
bodies are written side by side, every column by one vectorised assignment to a strided view
of a scratch buffer, the bodies' bytes are copied after them, and Arrow's C++ ``take`` on a
binary array made of that buffer and offsets cutting it into pieces concatenates the pieces
in row order (and first drops the bytes NULLs leave unused). When no column has a body and no
value is NULL, the scratch buffer already is the answer. There is no per-row Python for the
common types (integers, floats, booleans, dates, times, timestamps, intervals, strings and
binaries of every kind including text/json/jsonb/uuid, decimals into numeric, arrays of all of
these). Per-value Python is used only for floats into numeric, inet/cidr, and struct/map/list
into json/jsonb.

Semantics worth knowing:

* Timestamps are microseconds since 2000-01-01 00:00 UTC. Arrow stores tz-aware timestamps as
  UTC instants, so any Arrow time zone into ``timestamptz`` is exact. A tz-less Arrow timestamp
  (Spark's TimestampNTZ) into ``timestamptz`` is taken as UTC; a tz-aware one into ``timestamp``
  (without time zone) stores its UTC wall time. Nanoseconds are floored to the microsecond
  (toward negative infinity: the microsecond that contains the instant), as are nanosecond
  times and durations.
* Text goes to the server as UTF-8 bytes (Arrow strings are UTF-8), so the connection's
  ``client_encoding`` must be UTF8 (the psycopg default against a UTF8 server). The server
  checks the encoding, NUL bytes, varchar/char lengths, numeric precision, json/jsonb syntax.
* Floats into numeric: NaN becomes numeric NaN, infinities are refused (not every server
  version has numeric infinity). The decimal digits are those of the shortest repr.
* struct/map/list into json/jsonb: ``json.dumps(..., separators=(",", ":"), default=str)``:
  maps become objects (non-string keys through ``str``), binaries base64, float NaN/infinities
  the strings "NaN"/"Infinity"/"-Infinity", decimals/dates/times through ``str``.
"""

from __future__ import annotations

import base64
import decimal
import ipaddress
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from sqlsink.errors import ConfigError, WriteError
from sqlsink.postgres.catalog import TargetColumn

__all__ = [
    "COPY_HEADER",
    "COPY_TRAILER",
    "BinaryCopyEncoder",
    "build_encoder",
    "write_batches",
]

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
COPY_TRAILER = b"\xff\xff"

Arr = npt.NDArray[Any]

# -- PostgreSQL type oids --------------------------------------------------------------------

BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, JSON = 16, 17, 19, 20, 21, 23, 25, 114
CIDR, FLOAT4, FLOAT8, INET, BPCHAR, VARCHAR = 650, 700, 701, 869, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL = 1082, 1083, 1114, 1184, 1186
NUMERIC, UUID, JSONB = 1700, 2950, 3802

_ARRAY_ELEMENT = {
    1000: BOOL, 1001: BYTEA, 1003: NAME, 1016: INT8, 1005: INT2, 1007: INT4, 1009: TEXT,
    199: JSON, 651: CIDR, 1021: FLOAT4, 1022: FLOAT8, 1041: INET, 1014: BPCHAR, 1015: VARCHAR,
    1182: DATE, 1183: TIME, 1115: TIMESTAMP, 1185: TIMESTAMPTZ, 1187: INTERVAL, 1231: NUMERIC,
    2951: UUID, 3807: JSONB,
}  # fmt: skip

# What to cast a Spark column to, per PostgreSQL type: (Spark types, cast(...) example).
_HINTS: dict[int, tuple[str, str]] = {
    INT2: ("an integer type (ByteType, ShortType, IntegerType, LongType)", "smallint"),
    INT4: ("an integer type (ByteType, ShortType, IntegerType, LongType)", "int"),
    INT8: ("an integer type (ByteType, ShortType, IntegerType, LongType)", "bigint"),
    FLOAT4: ("FloatType, DoubleType or an integer type", "float"),
    FLOAT8: ("DoubleType, FloatType or an integer type", "double"),
    NUMERIC: ("DecimalType, an integer type, FloatType or DoubleType", "decimal(38,18)"),
    BOOL: ("BooleanType", "boolean"),
    TEXT: ("StringType", "string"),
    VARCHAR: ("StringType", "string"),
    BPCHAR: ("StringType", "string"),
    NAME: ("StringType", "string"),
    JSON: ("StringType (JSON text), StructType, MapType or ArrayType", "string"),
    JSONB: ("StringType (JSON text), StructType, MapType or ArrayType", "string"),
    UUID: ("StringType (8-4-4-4-12 or 32 hex digits)", "string"),
    INET: ("StringType", "string"),
    CIDR: ("StringType", "string"),
    BYTEA: ("BinaryType", "binary"),
    DATE: ("DateType", "date"),
    TIME: ("TimeType", "time"),
    TIMESTAMP: ("TimestampNTZType or TimestampType", "timestamp_ntz"),
    TIMESTAMPTZ: ("TimestampType or TimestampNTZType", "timestamp"),
    INTERVAL: ("DayTimeIntervalType", "interval day to second"),
}

# PostgreSQL's limits (src/include/datatype/timestamp.h), in the units used here.
_PG_EPOCH_DAYS = 10_957  # 2000-01-01 - 1970-01-01
_PG_EPOCH_US = _PG_EPOCH_DAYS * 86_400_000_000
_MIN_DATE, _END_DATE = -2_451_545, 2_145_031_949  # days since 2000, [min, end)
_MIN_TS_UNIX_US = -211_813_488_000_000_000 + _PG_EPOCH_US  # 4714-11-24 BC, in unix µs
_I64_MAX = 2**63 - 1
_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1}


# -- fields: what a column encoder produces ----------------------------------------------------


class _ValueProblem(Exception):
    """A value that cannot be encoded; index is the position in the encoded array."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(problem)
        self.index = index
        self.problem = problem


@dataclass
class _Body:
    """Per value, the run data[src[i] : src[i] + lens[i]] (lens is 0 for NULLs)."""

    data: Arr  # uint8
    src: Arr  # int64
    lens: Arr  # int64


class _Fields:
    """The binary COPY fields of n values, to be laid out in rows by ``_assemble``.

    Value i starts with a fixed-size prefix: the big-endian ``cols`` side by side (the length
    word, then any fixed-size part), each given as an array of n values or as one scalar for
    all. Only the first ``widths[i]`` bytes of that prefix are kept (``widths`` None: all of
    them). The value's body run, if there is a body, follows. Where ``valid`` is False the
    value is NULL: its field is the length word -1 alone (the first column must then be that
    int32 word; the body run must be empty there).
    """

    __slots__ = ("body", "cols", "nulls", "width", "widths")

    def __init__(
        self,
        cols: Sequence[tuple[np.dtype[Any], Any]],
        valid: Arr | None = None,
        widths: Arr | None = None,
        body: _Body | None = None,
    ) -> None:
        self.cols = tuple(cols)
        self.width = sum(dt.itemsize for dt, _ in self.cols)
        self.nulls = None if valid is None else ~valid
        if widths is not None and valid is not None:
            widths = np.where(valid, widths, 4)
        self.widths = widths
        self.body = body

    def shortened(self) -> tuple[Arr, Arr | int, Arr] | None:
        """The values keeping fewer than ``width`` prefix bytes, how many bytes those keep, and
        how many bytes every value drops; None when every value keeps them all."""
        if self.widths is not None:
            rows = np.flatnonzero(self.widths < self.width)
            return rows, self.widths[rows], self.width - self.widths
        if self.nulls is not None and self.width > 4:
            return np.flatnonzero(self.nulls), 4, self.nulls * (self.width - 4)
        return None

    @property
    def sizes(self) -> Arr | int:
        """Every value's size in bytes (an int when all have the same)."""
        short = self.shortened()
        base: Arr | int = self.width if short is None else self.width - short[2]
        return base if self.body is None else base + self.body.lens


_Encode = Callable[[pa.Array], _Fields]

_I2, _I4, _U1 = np.dtype(">i2"), np.dtype(">i4"), np.dtype(np.uint8)


# -- vectorised primitives ---------------------------------------------------------------------

_IOTA: Arr = np.arange(1 << 16, dtype=np.int64)
_IOTA.setflags(write=False)


def _iota(start: int, stop: int) -> Arr:
    """np.arange(start, stop) as a read-only view of a cached array."""
    global _IOTA
    if stop > len(_IOTA):
        if stop > 1 << 24:
            return np.arange(start, stop, dtype=np.int64)
        grown = np.arange(max(stop, 2 * len(_IOTA)), dtype=np.int64)
        grown.setflags(write=False)
        _IOTA = grown
    return _IOTA[start:stop]


def _exclusive_cumsum(sizes: Arr) -> Arr:
    starts = np.empty(len(sizes) + 1, dtype=np.int64)
    starts[0] = 0
    np.cumsum(sizes, out=starts[1:])
    return starts


def _in_order(body: _Body) -> tuple[Arr, Arr, int, int]:
    """(data, src, lo, hi): the same runs, in increasing order without overlaps, in [lo, hi)."""
    data, src, lens = body.data, body.src, body.lens
    if len(src) > 1 and not np.all(src[1:] >= src[:-1] + lens[:-1]):
        # Never the case for the runs the encoders make (Arrow offsets only grow): gather them.
        starts = _exclusive_cumsum(lens)
        data = data[np.repeat(src - starts[:-1], lens) + _iota(0, int(starts[-1]))]
        src = starts[:-1]
    lo, hi = int(src[0]), int(src[-1] + lens[-1])
    if lo < 0 or hi > len(data):
        raise ValueError(f"malformed runs: [{lo}, {hi}) of {len(data)} bytes")
    return data, src, lo, hi


def _assemble(n: int, parts: Sequence[_Fields]) -> Arr:
    """n rows, row i being value i of every part in turn, as one uint8 array.

    A row is cut into *groups* of fixed-size prefixes (up to and including the prefix of a
    part with a body) and the bodies between them. Each group's prefixes go side by side into
    a scratch buffer, n rows of them, by assigning whole columns to strided views; the bodies'
    data follows. Arrow's ``take`` (C++) then concatenates pieces of that buffer (byte ranges
    given by offsets): once to drop what prefixes shortened by a NULL leave unused, once to
    put every row's groups and body runs in row order. Without a body, the buffer (which then
    holds a single group) is the answer once the unused bytes are gone.
    """
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    groups: list[list[_Fields]] = [[]]
    bodies: list[tuple[Arr, Arr, Arr, int, int]] = []
    for part in parts:
        groups[-1].append(part)
        if part.body is not None:
            bodies.append((part.body.lens, *_in_order(part.body)))
            groups.append([])
    widths = [sum(p.width for p in group) for group in groups]
    buf = np.empty(n * sum(widths) + sum(hi - lo for *_, lo, hi in bodies), dtype=np.uint8)
    holes: list[tuple[Arr, Arr]] = []  # (starts, ends) of the bytes shortened prefixes leave
    shrink: list[Arr | None] = []  # per group, per row: how many bytes those are
    base = 0
    for group, width in zip(groups, widths, strict=True):
        _fill(buf[base : base + n * width], width, group)
        at = base
        fewer: Arr | None = None
        for part in group:
            short = part.shortened()
            if short is not None and len(short[0]):
                rows, keep, less = short
                starts = rows * width + at
                holes.append((starts + keep, starts + part.width))
                fewer = less if fewer is None else fewer + less
            at += part.width
        shrink.append(fewer)
        base += n * width
    for _, data, _, lo, hi in bodies:
        buf[base : base + hi - lo] = data[lo:hi]
        base += hi - lo
    if holes:
        buf = _without(buf, holes)
    if not bodies:
        return buf
    # Every row's groups and body runs in row order: cut the buffer into one piece per row of
    # a group, two per value of a body (its run, then the gap to the next run), and take the
    # pieces that are not gaps.
    order = [(False, g) for g in range(len(groups)) if widths[g]]
    order += [(True, b) for b in range(len(bodies))]
    order.sort(key=lambda o: 2 * o[1] + o[0])  # group 0, body 0, group 1, body 1...
    cuts = np.empty(n * (len(order) + len(bodies)) + 1, dtype=np.int64)
    take = np.empty((n, len(order)), dtype=np.int64)
    rows = _iota(0, n)
    first = base = 0
    for g, width in enumerate(widths):
        if not width:
            continue
        starts = cuts[first : first + n]
        np.multiply(rows, width, out=starts)
        starts += base
        fewer = shrink[g]
        base += n * width
        if fewer is not None:
            removed = _exclusive_cumsum(fewer)
            starts -= removed[:-1]
            base -= int(removed[-1])
        np.add(rows, first, out=take[:, order.index((False, g))])
        first += n
    for b, (lens, _, src, lo, hi) in enumerate(bodies):
        pieces = cuts[first : first + 2 * n].reshape(n, 2)
        np.add(src, base - lo, out=pieces[:, 0])
        np.add(pieces[:, 0], lens, out=pieces[:, 1])
        column = take[:, order.index((True, b))]
        np.multiply(rows, 2, out=column)
        column += first
        first += 2 * n
        base += hi - lo
    cuts[-1] = base
    return _take(buf, cuts, take.reshape(-1))


def _fill(out: Arr, width: int, group: Sequence[_Fields]) -> None:
    """Writes the prefixes of the group's parts side by side, rows of width bytes, into out."""
    if not width:
        return
    n = len(out) // width
    template = np.zeros(width, dtype=np.uint8)  # the columns that are the same in every row
    columns: list[tuple[int, np.dtype[Any], Arr]] = []
    at = 0
    for part in group:
        for dt, values in part.cols:
            if isinstance(values, np.ndarray) and values.ndim:
                columns.append((at, dt, values))
            else:
                template[at : at + dt.itemsize] = np.array(values, dt).reshape(1).view(np.uint8)
            at += dt.itemsize
    if len(columns) < sum(len(part.cols) for part in group):
        rows = np.ndarray((n,), f"V{width}", buffer=out)  # a row a value: a fast fill
        rows[...] = template.view(f"V{width}")[0]
    for at, dt, values in columns:
        view: Arr = np.ndarray((n,), dt, buffer=out, offset=at, strides=(width,))
        view[...] = values
    at = 0
    for part in group:
        if part.nulls is not None:
            words: Arr = np.ndarray((n,), _I4, buffer=out, offset=at, strides=(width,))
            words[part.nulls] = -1
        at += part.width


def _without(buf: Arr, holes: Sequence[tuple[Arr, Arr]]) -> Arr:
    """buf without the bytes [starts[i], ends[i]) of every (starts, ends) in holes."""
    starts = np.concatenate([s for s, _ in holes])
    ends = np.concatenate([e for _, e in holes])
    if len(holes) > 1:
        order = np.argsort(starts, kind="stable")  # sorted runs: quick for timsort
        starts, ends = starts[order], ends[order]
    cuts = np.empty(2 * len(starts) + 2, dtype=np.int64)
    cuts[0], cuts[-1] = 0, len(buf)
    cuts[1:-1:2] = starts
    cuts[2:-1:2] = ends
    return _take(buf, cuts, np.arange(0, len(cuts) - 1, 2))


def _take(buf: Arr, cuts: Arr, take: Arr) -> Arr:
    """The pieces buf[cuts[j] : cuts[j + 1]] for every j of take, concatenated (by Arrow)."""
    if cuts[0] < 0 or cuts[-1] > len(buf) or not np.all(cuts[1:] >= cuts[:-1]):
        # Arrow trusts the offsets: never let it read outside buf (malformed input arrays).
        raise ValueError("the pieces of a batch's rows are out of order: a malformed array?")
    source = pa.Array.from_buffers(
        pa.large_binary(), len(cuts) - 1, [None, pa.py_buffer(cuts), pa.py_buffer(buf)]
    )
    joined = source.take(pa.array(take))
    offsets = np.frombuffer(joined.buffers()[1], np.int64, count=joined.offset + len(joined) + 1)
    lo, hi = int(offsets[joined.offset]), int(offsets[-1])
    if hi == lo:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(joined.buffers()[2], np.uint8, count=hi - lo, offset=lo)


def _bits(buf: pa.Buffer, offset: int, n: int) -> Arr:
    """n bits of an Arrow bitmap, from bit offset, as a bool array."""
    raw = np.frombuffer(buf, dtype=np.uint8, count=(offset + n + 7) // 8)
    return np.unpackbits(raw, count=offset + n, bitorder="little")[offset:].view(np.bool_)


def _validity(arr: pa.Array) -> Arr | None:
    """Which values are not NULL, or None when none is NULL."""
    if arr.null_count == 0:
        return None
    buf = arr.buffers()[0]
    if buf is None:  # the null type
        return np.zeros(len(arr), dtype=np.bool_)
    return _bits(buf, arr.offset, len(arr))


def _raw(arr: pa.Array, dtype: npt.DTypeLike, index: int = 1) -> Arr:
    """The fixed-width values of an array (garbage in NULL slots)."""
    dt = np.dtype(dtype)
    buf = arr.buffers()[index]
    if buf is None or len(arr) == 0:
        return np.zeros(len(arr), dtype=dt)
    return np.frombuffer(buf, dtype=dt, count=len(arr), offset=arr.offset * dt.itemsize)


def _values(arr: pa.Array, dtype: npt.DTypeLike) -> tuple[Arr, Arr | None]:
    """The values (garbage in NULL slots) and the validity."""
    return _raw(arr, dtype), _validity(arr)


def _first(bad: Arr) -> int:
    return int(np.argmax(bad))


def _first_valid(bad: Arr, valid: Arr | None) -> int | None:
    """The first value that is bad and not NULL, if any."""
    if not bad.any():
        return None
    if valid is not None:
        bad = bad & valid
        if not bad.any():
            return None
    return _first(bad)


def _show(value: object) -> str:
    """A value for an error message: never more than about 100 characters."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value[:120]).decode("utf-8", "replace")
    text = repr(value)
    return text if len(text) <= 100 else text[:96] + "...'"


def _fixed(valid: Arr | None, *cols: tuple[str, Any]) -> _Fields:
    """Fixed-size values: the length word then the columns, each as (big-endian dtype, values)."""
    dts = [(np.dtype(d), values) for d, values in cols]
    return _Fields([(_I4, sum(dt.itemsize for dt, _ in dts)), *dts], valid)


def _fixed_bytes(payload: Arr, valid: Arr | None) -> _Fields:
    """Fixed-size values given as an (n, w) uint8 matrix."""
    width = payload.shape[1]
    cols: list[tuple[np.dtype[Any], Any]] = [(_I4, width)]
    if width:
        cols.append((np.dtype(f"V{width}"), np.ascontiguousarray(payload).view(f"V{width}")[:, 0]))
    return _Fields(cols, valid)


def _all_null(arr: pa.Array) -> _Fields:
    return _Fields([(_I4, -1)])


def _from_python(values: Sequence[bytes | None]) -> _Fields:
    """Fields from per-value Python encodings (None for NULL)."""
    n = len(values)
    lengths = np.fromiter((-1 if v is None else len(v) for v in values), np.int64, n)
    lens = np.maximum(lengths, 0)
    data = np.frombuffer(b"".join(v for v in values if v), dtype=np.uint8)
    body = _Body(data, _exclusive_cumsum(lens)[:-1], lens)
    return _Fields([(_I4, lengths)], body=body)


def _python(arr: pa.Array, one: Callable[[Any], bytes]) -> _Fields:
    """Per-value Python: one(value) for every non-NULL value of arr.to_pylist()."""
    out: list[bytes | None] = []
    for i, value in enumerate(arr.to_pylist()):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(one(value))
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise _ValueProblem(i, f"{_show(value)}: {exc}") from None
    return _from_python(out)


# -- column encoders ---------------------------------------------------------------------------

_INT_TARGETS = {INT2: (">i2", "smallint"), INT4: (">i4", "integer"), INT8: (">i8", "bigint")}


def _int_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    src = np.dtype(arrow.to_pandas_dtype())
    if oid in _INT_TARGETS:
        be, label = _INT_TARGETS[oid]
        info = np.iinfo(np.dtype(be))
        own = np.iinfo(src)
        check = own.min < info.min or own.max > info.max

        def ints(arr: pa.Array) -> _Fields:
            values, valid = _values(arr, src)
            if check and len(values):
                lo, hi = values.min(), values.max()
                if lo < info.min or hi > info.max:
                    i = _first_valid((values < info.min) | (values > info.max), valid)
                    if i is not None:
                        raise _ValueProblem(
                            i,
                            f"{values[i]} is out of range for {label} ({info.min}..{info.max})",
                        )
            return _fixed(valid, (be, values))

        return ints
    if oid in (FLOAT4, FLOAT8):
        be = ">f4" if oid == FLOAT4 else ">f8"

        def floats(arr: pa.Array) -> _Fields:
            values, valid = _values(arr, src)
            return _fixed(valid, (be, values))

        return floats

    def numeric(arr: pa.Array) -> _Fields:
        values, valid = _values(arr, src)
        if valid is not None:  # NULLs must have no digits
            values = np.where(valid, values, 0).astype(values.dtype, copy=False)
        if src.kind == "u":
            mag = values.astype(np.uint64)
            neg = np.zeros(len(values), dtype=np.bool_)
        else:
            wide = values.astype(np.int64)
            neg = wide < 0
            mag = wide.view(np.uint64)
            mag = np.where(neg, ~mag + np.uint64(1), mag)
        limbs = [mag & np.uint64(0xFFFFFFFF), mag >> np.uint64(32)]
        return _numeric_fields(neg, limbs, 0, valid)

    return numeric


def _float_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    src = np.dtype(arrow.to_pandas_dtype())
    if oid in (FLOAT4, FLOAT8):
        be = ">f4" if oid == FLOAT4 else ">f8"
        narrowing = oid == FLOAT4 and src.itemsize > 4

        def floats(arr: pa.Array) -> _Fields:
            values, valid = _values(arr, src)
            if narrowing and len(values):
                too_big = np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)
                i = _first_valid(too_big, valid)
                if i is not None:
                    raise _ValueProblem(i, f"{values[i]!r} is out of range for real")
            return _fixed(valid, (be, values))

        return floats

    single = src.itemsize <= 4

    def numeric(arr: pa.Array) -> _Fields:
        values, valid = _values(arr, src)
        out: list[bytes | None] = []
        texts = [str(v) for v in values] if single else [repr(v) for v in values.tolist()]
        for i, text in enumerate(texts):
            if valid is not None and not valid[i]:
                out.append(None)
            elif text == "nan":
                out.append(_NUMERIC_NAN)
            elif text in ("inf", "-inf"):
                raise _ValueProblem(i, f"{text} cannot be stored in numeric")
            else:
                sign, digits, exponent = decimal.Decimal(text).as_tuple()
                assert isinstance(exponent, int)
                mag = int("".join(map(str, digits)))
                out.append(_numeric_bytes(bool(sign) and mag != 0, mag, -exponent))
        return _from_python(out)

    return numeric


_NUMERIC_NAN = b"\x00\x00\x00\x00\xc0\x00\x00\x00"


def _numeric_bytes(neg: bool, mag: int, scale: int) -> bytes:
    """PostgreSQL's binary numeric for (-1)**neg * mag * 10**-scale, dscale max(scale, 0)."""
    p = -scale
    k = p // 4
    m = p - 4 * k
    mag, low = divmod(mag, 10 ** (4 - m))
    groups = [low * 10**m]  # base-10000 digits, least significant first
    while mag:
        mag, low = divmod(mag, 10_000)
        groups.append(low)
    nonzero = [i for i, g in enumerate(groups) if g]
    if not nonzero:
        return b"\x00\x00\x00\x00\x00\x00" + max(scale, 0).to_bytes(2, "big")
    lo, hi = nonzero[0], nonzero[-1]
    digits = groups[lo : hi + 1][::-1]
    head = [len(digits), k + hi, 0x4000 if neg else 0, max(scale, 0)]
    return b"".join(x.to_bytes(2, "big", signed=True) for x in head[:2]) + b"".join(
        x.to_bytes(2, "big") for x in head[2:] + digits
    )


def _divmod_limbs(limbs: list[Arr], divisor: int) -> Arr:
    """Divide the numbers held as 32-bit limbs (in uint64, least significant first) in place."""
    d = np.uint64(divisor)
    rem = np.zeros(len(limbs[0]), dtype=np.uint64)
    for j in range(len(limbs) - 1, -1, -1):
        cur = (rem << np.uint64(32)) | limbs[j]
        limbs[j] = cur // d
        rem = cur - limbs[j] * d
    return rem


def _numeric_fields(neg: Arr, limbs: list[Arr], scale: int, valid: Arr | None) -> _Fields:
    """Binary numerics, vectorised: (-1)**neg * magnitude * 10**-scale.

    The magnitude is given as 32-bit limbs held in uint64 arrays, least significant first.
    Digits are base 10000 aligned on the decimal point; dscale is max(scale, 0).
    """
    n = len(neg)
    p = -scale
    k = p // 4  # weight of the least significant group
    m = p - 4 * k
    limbs = list(limbs)
    groups = [_divmod_limbs(limbs, 10 ** (4 - m)) * np.uint64(10**m)]
    while limbs and not limbs[-1].any():
        limbs.pop()
    while limbs:
        groups.append(_divmod_limbs(limbs, 10_000))
        while limbs and not limbs[-1].any():
            limbs.pop()
    count = len(groups)
    g = np.stack(groups[::-1], axis=1).astype(">u2")  # most significant first
    nz = g != 0
    some = nz.any(axis=1)
    first = np.argmax(nz, axis=1)
    last = count - 1 - np.argmax(nz[:, ::-1], axis=1)
    ndigits = np.where(some, last - first + 1, 0)
    weight = np.where(some, k + (count - 1 - first), 0)
    sign = np.where(neg & some, 0x4000, 0)
    blens = 2 * ndigits
    byte_col = _iota(0, 2 * count) // 2
    keep = (byte_col >= first[:, None]) & (byte_col <= last[:, None]) & some[:, None]
    data = g.view(np.uint8).reshape(n, 2 * count)[keep]
    body = _Body(data, _exclusive_cumsum(blens)[:-1], blens)
    cols: list[tuple[np.dtype[Any], Any]] = [
        (_I4, 8 + blens),
        (_I2, ndigits),
        (_I2, weight),
        (np.dtype(">u2"), sign),
        (_I2, max(scale, 0)),
    ]
    return _Fields(cols, valid, body=body)


def _decimal_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    width = arrow.byte_width
    scale = arrow.scale

    def numeric(arr: pa.Array) -> _Fields:
        n = len(arr)
        buf = arr.buffers()[1]
        words = np.frombuffer(
            buf, dtype="<u4", count=n * width // 4, offset=arr.offset * width
        ).reshape(n, width // 4)
        valid = _validity(arr)
        neg = (words[:, -1] >> 31).astype(np.bool_)
        limbs = [words[:, j].astype(np.uint64) for j in range(width // 4)]
        if valid is not None:
            neg &= valid
            limbs = [np.where(valid, limb, np.uint64(0)) for limb in limbs]
        if neg.any():  # two's complement negation of the negative ones
            carry = neg.astype(np.uint64)
            for j, limb in enumerate(limbs):
                flipped = np.where(neg, limb ^ np.uint64(0xFFFFFFFF), limb) + carry
                limbs[j] = flipped & np.uint64(0xFFFFFFFF)
                carry = flipped >> np.uint64(32)
        return _numeric_fields(neg, limbs, scale, valid)

    return numeric


def _bool_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    def booleans(arr: pa.Array) -> _Fields:
        n = len(arr)
        buf = arr.buffers()[1]
        values = np.zeros(n, np.bool_) if buf is None else _bits(buf, arr.offset, n)
        return _fixed(_validity(arr), ("u1", values))

    return booleans


def _date_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    is64 = pa.types.is_date64(arrow)

    def dates(arr: pa.Array) -> _Fields:
        values, valid = _values(arr, np.int64 if is64 else np.int32)
        days = (values // 86_400_000 if is64 else values.astype(np.int64)) - _PG_EPOCH_DAYS
        i = _first_valid((days < _MIN_DATE) | (days >= _END_DATE), valid)
        if i is not None:
            raise _ValueProblem(
                i,
                f"date {values[i]} ({'ms' if is64 else 'days'} since 1970) is out of "
                "PostgreSQL's date range",
            )
        return _fixed(valid, (">i4", days))

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


def _timestamp_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    unit = arrow.unit

    def timestamps(arr: pa.Array) -> _Fields:
        values, valid = _values(arr, np.int64)
        us, overflow = _to_us(values, unit)
        bad = us < _MIN_TS_UNIX_US
        if overflow is not None:
            bad |= overflow
        i = _first_valid(bad, valid)
        if i is not None:
            raise _ValueProblem(
                i, f"timestamp {values[i]} ({unit} since 1970) is out of PostgreSQL's range"
            )
        return _fixed(valid, (">i8", us - _PG_EPOCH_US))

    return timestamps


def _time_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    unit = arrow.unit
    dtype = np.int32 if pa.types.is_time32(arrow) else np.int64

    def times(arr: pa.Array) -> _Fields:
        values, valid = _values(arr, dtype)
        us, _ = _to_us(values.astype(np.int64), unit)  # a time of day cannot overflow
        return _fixed(valid, (">i8", us))

    return times


def _duration_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    unit = arrow.unit

    def intervals(arr: pa.Array) -> _Fields:
        values, valid = _values(arr, np.int64)
        us, overflow = _to_us(values, unit)
        i = None if overflow is None else _first_valid(overflow, valid)
        if i is not None:
            raise _ValueProblem(i, f"duration {values[i]} {unit} is out of range for interval")
        return _fixed(valid, (">i8", us), (">i4", 0), (">i4", 0))

    return intervals


def _var_parts(arr: pa.Array) -> tuple[Arr, Arr, Arr, Arr | None]:
    """(data, starts, lengths with 0 for NULLs, validity) of a string or binary array."""
    n = len(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    buffers = arr.buffers()
    offsets = np.frombuffer(
        buffers[1], dtype=np.int64 if large else np.int32, count=n + 1,
        offset=arr.offset * (8 if large else 4),
    ).astype(np.int64)  # fmt: skip
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    starts = offsets[:-1]
    lens = offsets[1:] - starts
    valid = _validity(arr)
    if valid is not None:
        lens = np.where(valid, lens, 0)
    return data, starts, lens, valid


def _bytes_encoder(head: bytes = b"") -> _Encode:
    """string/binary values as they are (text, varchar, json, bytea...), after a constant head."""

    def var(arr: pa.Array) -> _Fields:
        data, starts, lens, valid = _var_parts(arr)
        body = _Body(data, starts, lens)
        cols: list[tuple[np.dtype[Any], Any]] = [(_I4, lens + len(head))]
        cols += [(_U1, byte) for byte in head]
        return _Fields(cols, valid, body=body)

    return var


def _string_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    if oid == UUID:
        return _uuid_from_strings
    if oid in (INET, CIDR):
        return _inet_encoder(oid == CIDR)
    return _bytes_encoder(b"\x01" if oid == JSONB else b"")


def _binary_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    return _bytes_encoder()


def _fixed_binary_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    width = arrow.byte_width

    def fixed(arr: pa.Array) -> _Fields:
        n = len(arr)
        buf = arr.buffers()[1]
        payload = np.frombuffer(buf, np.uint8, count=n * width, offset=arr.offset * width)
        return _fixed_bytes(payload.reshape(n, width), _validity(arr))

    return fixed


_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_UUID_36 = np.array([i for i in range(36) if i not in (8, 13, 18, 23)], dtype=np.int64)
_UUID_DASHES = np.array([8, 13, 18, 23], dtype=np.int64)


def _uuid_from_strings(arr: pa.Array) -> _Fields:
    """Canonical (8-4-4-4-12) or 32-hex-digit strings, any case, vectorised."""
    data, starts, lens, valid = _var_parts(arr)
    present = np.ones(len(arr), np.bool_) if valid is None else valid
    bad = present & (lens != 36) & (lens != 32)
    rows = np.flatnonzero(present & ~bad)
    dashed = lens[rows] == 36
    pos = np.where(dashed[:, None], _UUID_36, _iota(0, 32))
    nibbles = _HEX[data[starts[rows, None] + pos]]
    wrong = (nibbles == 255).any(axis=1)
    dash_rows = rows[dashed]
    wrong[dashed] |= (data[starts[dash_rows, None] + _UUID_DASHES] != ord("-")).any(axis=1)
    bad[rows[wrong]] = True
    if bad.any():
        i = _first(bad)
        value = bytes(data[starts[i] : starts[i] + min(int(lens[i]), 120)])
        raise _ValueProblem(
            i, f"{_show(value)} is not a UUID (32 hex digits, optionally as 8-4-4-4-12)"
        )
    payload = np.zeros((len(arr), 16), dtype=np.uint8)
    payload[rows] = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    return _fixed_bytes(payload, valid)


def _inet_encoder(cidr: bool) -> _Encode:
    def one(text: str) -> bytes:
        if cidr:
            net = ipaddress.ip_network(text.strip(), strict=True)
            address, bits = net.network_address, net.prefixlen
        else:
            iface = ipaddress.ip_interface(text.strip())
            address, bits = iface.ip, iface.network.prefixlen
        packed = address.packed
        family = 2 if address.version == 4 else 3  # PGSQL_AF_INET, PGSQL_AF_INET6
        return bytes([family, bits, int(cidr), len(packed)]) + packed

    def inets(arr: pa.Array) -> _Fields:
        return _python(arr, one)

    return inets


def _jsonable(value: Any, arrow: pa.DataType) -> Any:
    """A to_pylist() value as json.dumps should see it, guided by its Arrow type."""
    if value is None:
        return None
    if pa.types.is_struct(arrow):
        return {
            arrow.field(i).name: _jsonable(value.get(arrow.field(i).name), arrow.field(i).type)
            for i in range(arrow.num_fields)
        }
    if pa.types.is_map(arrow):
        return {
            k if isinstance(k, str) else str(_jsonable(k, arrow.key_type)): _jsonable(
                v, arrow.item_type
            )
            for k, v in value
        }
    if _is_list(arrow):
        return [_jsonable(v, arrow.value_type) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def _json_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    head = b"\x01" if oid == JSONB else b""

    def one(value: Any) -> bytes:
        text = json.dumps(
            _jsonable(value, arrow), separators=(",", ":"), default=str, ensure_ascii=False
        )
        return head + text.encode("utf-8")

    def documents(arr: pa.Array) -> _Fields:
        return _python(arr, one)

    return documents


def _is_list(arrow: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(arrow)
        or pa.types.is_large_list(arrow)
        or pa.types.is_fixed_size_list(arrow)
        or pa.types.is_list_view(arrow)
        or pa.types.is_large_list_view(arrow)
    )


def _array_encoder(element: _Encode, element_oid: int) -> _Encode:
    """list<T> into T[]: one-dimensional arrays, lower bound 1; an empty list has 0 dimensions."""

    def arrays(arr: pa.Array) -> _Fields:
        n = len(arr)
        valid = _validity(arr)
        offsets = arr.offsets.to_numpy().astype(np.int64)
        counts = offsets[1:] - offsets[:-1]
        if valid is not None:
            counts = np.where(valid, counts, 0)
        ends = np.cumsum(counts)
        begins = ends - counts
        child = arr.flatten()  # honours the slice, skips what NULL lists point at
        if len(child):
            try:
                fields = element(child)
            except _ValueProblem as p:
                row = int(np.searchsorted(ends, p.index, side="right"))
                at = p.index - int(begins[row]) + 1
                raise _ValueProblem(row, f"array element {at}: {p.problem}") from None
            sizes = np.broadcast_to(fields.sizes, (len(child),))
            where = _exclusive_cumsum(sizes)
            buf = _assemble(len(child), [fields])
            src = where[begins]
            blens = where[ends] - src
            child_valid = _validity(child)
            if child_valid is None:
                has_null = np.zeros(n, dtype=np.bool_)
            else:
                nulls = _exclusive_cumsum(~child_valid)
                has_null = nulls[ends] > nulls[begins]
        else:
            buf = np.zeros(0, np.uint8)
            src = blens = np.zeros(n, np.int64)
            has_null = np.zeros(n, dtype=np.bool_)
        nonempty = counts > 0
        word = np.where(nonempty, 20 + blens, 12)
        widths = np.where(nonempty, 24, 16)
        cols = [(_I4, v) for v in (word, nonempty, has_null, element_oid, counts, 1)]
        return _Fields(cols, valid, widths, _Body(buf, src, blens))

    return arrays


# -- choosing an encoder -----------------------------------------------------------------------

_Factory = Callable[[pa.DataType, int], _Encode]
_TEXTUAL = (TEXT, VARCHAR, BPCHAR, NAME, JSON, JSONB)
_RULES: list[tuple[Callable[[pa.DataType], bool], tuple[int, ...], _Factory]] = [
    (pa.types.is_integer, (INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC), _int_encoder),
    (pa.types.is_floating, (FLOAT4, FLOAT8, NUMERIC), _float_encoder),
    (pa.types.is_decimal, (NUMERIC,), _decimal_encoder),
    (pa.types.is_boolean, (BOOL,), _bool_encoder),
    (
        lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        (*_TEXTUAL, UUID, INET, CIDR),
        _string_encoder,
    ),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), (BYTEA,), _binary_encoder),
    (pa.types.is_fixed_size_binary, (BYTEA,), _fixed_binary_encoder),
    (lambda t: pa.types.is_fixed_size_binary(t) and t.byte_width == 16, (UUID,),
     _fixed_binary_encoder),
    (lambda t: pa.types.is_date32(t) or pa.types.is_date64(t), (DATE,), _date_encoder),
    (pa.types.is_timestamp, (TIMESTAMP, TIMESTAMPTZ), _timestamp_encoder),
    (lambda t: pa.types.is_time32(t) or pa.types.is_time64(t), (TIME,), _time_encoder),
    (pa.types.is_duration, (INTERVAL,), _duration_encoder),
    (
        lambda t: pa.types.is_struct(t) or pa.types.is_map(t) or _is_list(t),
        (JSON, JSONB),
        _json_encoder,
    ),
]  # fmt: skip


def _normalized(arrow: pa.DataType) -> tuple[pa.DataType, list[Callable[[pa.Array], pa.Array]]]:
    """Types read through another one: extension types, dictionaries, views, fixed lists.

    Returns the type to encode and the conversions (in order) that give arrays of it.
    """
    steps: list[Callable[[pa.Array], pa.Array]] = []
    while True:
        if isinstance(arrow, pa.BaseExtensionType):
            arrow = arrow.storage_type
            steps.append(lambda a: a.storage)
            continue
        if pa.types.is_dictionary(arrow):
            arrow = arrow.value_type
            steps.append(lambda a: a.dictionary_decode())
            continue
        target: pa.DataType | None = None
        if pa.types.is_string_view(arrow):
            target = pa.large_string()
        elif pa.types.is_binary_view(arrow):
            target = pa.large_binary()
        elif pa.types.is_fixed_size_list(arrow):
            target = pa.list_(arrow.value_field)
        if target is None:
            return arrow, steps
        steps.append(_caster(target))
        arrow = target


def _caster(target: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    def cast(arr: pa.Array) -> pa.Array:
        return arr.cast(target)

    return cast


def _scalar(arrow: pa.DataType, oid: int) -> _Encode | None:
    """The encoder of (arrow type, pg oid), or None when the pair is not supported."""
    arrow, steps = _normalized(arrow)
    encode: _Encode | None = None
    if pa.types.is_null(arrow) and (oid in _HINTS or oid in _ARRAY_ELEMENT):
        encode = _all_null
    elif oid in _ARRAY_ELEMENT and (pa.types.is_list(arrow) or pa.types.is_large_list(arrow)):
        element = _scalar(arrow.value_type, _ARRAY_ELEMENT[oid])
        if element is not None:
            encode = _array_encoder(element, _ARRAY_ELEMENT[oid])
    else:
        for accepts, oids, factory in _RULES:
            if oid in oids and accepts(arrow):
                encode = factory(arrow, oid)
                break
    if encode is None or not steps:
        return encode
    inner = encode

    def converted(arr: pa.Array) -> _Fields:
        for step in steps:
            arr = step(arr)
        return inner(arr)

    return converted


def _unsupported(field: pa.Field, column: TargetColumn) -> ConfigError:
    oid = column.type_oid
    hint = _HINTS.get(_ARRAY_ELEMENT.get(oid, oid))
    where = (
        f"column {column.name!r}: cannot write Arrow type {field.type} (Spark column "
        f"{field.name!r}) into PostgreSQL type {column.type_name}"
    )
    if hint is None:
        return ConfigError(
            f"{where}: the sink cannot encode PostgreSQL type {column.type_name}. Fix: make the "
            f"column a supported type (e.g. text, jsonb, numeric, timestamptz), or load into a "
            f"staging table with such a column and cast in SQL (e.g. INSERT ... SELECT "
            f"{column.name}::{column.type_name})",
            column=column.name,
            arrow_type=str(field.type),
            pg_type=column.type_name,
        )
    types, example = hint
    nested = ""
    if oid in _ARRAY_ELEMENT:
        types, example = f"an ArrayType of {types}", f"array<{example}>"
        if _is_list(field.type) and _is_list(field.type.value_type):
            nested = (
                " (nested lists are not written as multi-dimensional arrays: flatten them with "
                "F.flatten, or write them into a json/jsonb column)"
            )
    return ConfigError(
        f"{where}{nested}. Fix: cast the column in Spark to {types}, e.g. "
        f"df.withColumn({field.name!r}, F.col({field.name!r}).cast({example!r})), or change "
        f"the PostgreSQL column's type",
        column=column.name,
        arrow_type=str(field.type),
        pg_type=column.type_name,
    )


# -- the public API ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Column:
    name: str
    type_name: str
    arrow_type: pa.DataType
    encode: _Encode


class BinaryCopyEncoder:
    """Encodes record batches of one schema into binary COPY tuples for a list of columns."""

    def __init__(self, columns: Sequence[_Column]) -> None:
        self._columns = list(columns)
        self._count = _Fields([(_I2, len(columns))])  # a tuple's field count

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self._columns]

    def encode(self, batch: pa.RecordBatch) -> bytes | bytearray | memoryview:
        """The batch's tuples (no header, no trailer), for ``Copy.write()``.

        Every call returns a new buffer. Raises WriteError for a value its column cannot hold.
        """
        n = batch.num_rows
        if batch.num_columns != len(self._columns):
            raise ConfigError(
                f"a batch has {batch.num_columns} columns, the encoder was built for "
                f"{len(self._columns)} ({', '.join(self.column_names)})"
            )
        if n == 0:
            return b""
        parts: list[_Fields] = []
        for i, column in enumerate(self._columns):
            arr = batch.column(i)
            if arr.type != column.arrow_type:
                raise ConfigError(
                    f"column {column.name!r}: a batch has Arrow type {arr.type}, the encoder "
                    f"was built for {column.arrow_type}"
                )
            try:
                parts.append(column.encode(arr))
            except _ValueProblem as p:
                raise WriteError(
                    f"column {column.name!r} ({column.type_name}), row {p.index} of the batch: "
                    f"{p.problem}. Fix: correct or filter the value in Spark, or change the "
                    f"column's type",
                    column=column.name,
                    row=p.index,
                ) from None
        return _assemble(n, [self._count, *parts]).data


def build_encoder(fields: Sequence[pa.Field], columns: Sequence[TargetColumn]) -> BinaryCopyEncoder:
    """An encoder writing fields[i] into columns[i].

    Raises ConfigError for a pair of (Arrow type, PostgreSQL type) the sink cannot encode.
    """
    if len(fields) != len(columns):
        raise ConfigError(
            f"{len(fields)} Arrow fields for {len(columns)} PostgreSQL columns "
            f"({', '.join(c.name for c in columns)})"
        )
    built: list[_Column] = []
    for field, column in zip(fields, columns, strict=True):
        encode = _scalar(field.type, column.type_oid)
        if encode is None:
            raise _unsupported(field, column)
        built.append(_Column(column.name, column.type_name, field.type, encode))
    return BinaryCopyEncoder(built)


class CopyWriter(Protocol):
    """What write_batches needs of a psycopg ``Copy`` (its ``write`` method)."""

    def write(self, buffer: bytes | bytearray | memoryview) -> None: ...


def write_batches(
    copy: CopyWriter, encoder: BinaryCopyEncoder, batches: Iterable[pa.RecordBatch]
) -> int:
    """Send a whole binary COPY stream: header, every batch's tuples, trailer; the row count.

    psycopg's ``Copy.write()`` sends its buffer as it is in binary format: it adds the header
    (and trailer) only when rows go through ``write_row()`` or nothing is written at all, so
    the header and trailer are written here, once per COPY. Use inside
    ``with cur.copy("COPY ... FROM STDIN (FORMAT BINARY)") as copy:``.
    """
    copy.write(COPY_HEADER)
    rows = 0
    for batch in batches:
        if batch.num_rows:
            copy.write(encoder.encode(batch))
            rows += batch.num_rows
    copy.write(COPY_TRAILER)
    return rows
