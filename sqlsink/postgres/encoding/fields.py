"""Fields: what a column encoder produces for n values, and helpers to make them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Arr = npt.NDArray[Any]


class ValueProblem(Exception):
    """A value that cannot be encoded; index is the position in the encoded array."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(problem)
        self.index = index
        self.problem = problem


@dataclass
class Body:
    """Per value, the run data[src[i] : src[i] + lens[i]] (lens is 0 for NULLs)."""

    data: Arr  # uint8
    src: Arr  # int64
    lens: Arr  # int64


class Fields:
    """The binary COPY fields of n values, to be laid out in rows by ``assemble``.

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
        body: Body | None = None,
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


Encode = Callable[[pa.Array], Fields]

I2, I4, U1 = np.dtype(">i2"), np.dtype(">i4"), np.dtype(np.uint8)


# -- vectorised primitives ---------------------------------------------------------------------

_IOTA: Arr = np.arange(1 << 16, dtype=np.int64)
_IOTA.setflags(write=False)


def iota(start: int, stop: int) -> Arr:
    """np.arange(start, stop) as a read-only view of a cached array."""
    global _IOTA
    if stop > len(_IOTA):
        if stop > 1 << 24:
            return np.arange(start, stop, dtype=np.int64)
        grown = np.arange(max(stop, 2 * len(_IOTA)), dtype=np.int64)
        grown.setflags(write=False)
        _IOTA = grown
    return _IOTA[start:stop]


def exclusive_cumsum(sizes: Arr) -> Arr:
    starts = np.empty(len(sizes) + 1, dtype=np.int64)
    starts[0] = 0
    np.cumsum(sizes, out=starts[1:])
    return starts


# -- errors ------------------------------------------------------------------------------------


def first_bad(bad: Arr) -> int:
    return int(np.argmax(bad))


def first_valid(bad: Arr, valid: Arr | None) -> int | None:
    """The first value that is bad and not NULL, if any."""
    if not bad.any():
        return None
    if valid is not None:
        bad = bad & valid
        if not bad.any():
            return None
    return first_bad(bad)


def shown_value(value: object) -> str:
    """A value for an error message: never more than about 100 characters."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value[:120]).decode("utf-8", "replace")
    text = repr(value)
    return text if len(text) <= 100 else text[:96] + "...'"


# -- making fields ------------------------------------------------------------------------------


def fixed_fields(valid: Arr | None, *cols: tuple[str, Any]) -> Fields:
    """Fixed-size values: the length word then the columns, each as (big-endian dtype, values)."""
    dts = [(np.dtype(d), values) for d, values in cols]
    return Fields([(I4, sum(dt.itemsize for dt, _ in dts)), *dts], valid)


def fixed_bytes(payload: Arr, valid: Arr | None) -> Fields:
    """Fixed-size values given as an (n, w) uint8 matrix."""
    width = payload.shape[1]
    cols: list[tuple[np.dtype[Any], Any]] = [(I4, width)]
    if width:
        cols.append((np.dtype(f"V{width}"), np.ascontiguousarray(payload).view(f"V{width}")[:, 0]))
    return Fields(cols, valid)


def all_null(arr: pa.Array) -> Fields:
    return Fields([(I4, -1)])


def from_python(values: Sequence[bytes | None]) -> Fields:
    """Fields from per-value Python encodings (None for NULL)."""
    n = len(values)
    lengths = np.fromiter((-1 if v is None else len(v) for v in values), np.int64, n)
    lens = np.maximum(lengths, 0)
    data = np.frombuffer(b"".join(v for v in values if v), dtype=np.uint8)
    body = Body(data, exclusive_cumsum(lens)[:-1], lens)
    return Fields([(I4, lengths)], body=body)


def per_value(arr: pa.Array, one: Callable[[Any], bytes]) -> Fields:
    """Per-value Python: one(value) for every non-NULL value of arr.to_pylist()."""
    out: list[bytes | None] = []
    for i, value in enumerate(arr.to_pylist()):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(one(value))
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise ValueProblem(i, f"{shown_value(value)}: {exc}") from None
    return from_python(out)
