"""Rows from fields: the values of every column laid out in binary COPY tuples, vectorised.

How a batch is encoded: every column turns its Arrow array into *fields* -- per value a
prefix (the length word and any fixed-size head: a value, a jsonb version byte, an array
header...) given as big-endian columns (one numpy array, or one scalar, per part of the
prefix), and optionally a variable-length body (string bytes, numeric digits, array elements)
kept as runs of a source buffer. ``assemble`` lays the rows out: the prefixes between two
bodies are written side by side, every column by one vectorised assignment to a strided view
of a scratch buffer, the bodies' bytes are copied after them, and Arrow's C++ ``take`` on a
binary array made of that buffer and offsets cutting it into pieces concatenates the pieces
in row order (and first drops the bytes NULLs leave unused). When no column has a body and no
value is NULL, the scratch buffer already is the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sqlsink.postgres.encoding.fields import (
    I4,
    Arr,
    Body,
    Fields,
    exclusive_cumsum,
    iota,
)


def _in_order(body: Body) -> tuple[Arr, Arr, int, int]:
    """(data, src, lo, hi): the same runs, in increasing order without overlaps, in [lo, hi)."""
    data, src, lens = body.data, body.src, body.lens
    if len(src) > 1 and not np.all(src[1:] >= src[:-1] + lens[:-1]):
        # Never the case for the runs the encoders make (Arrow offsets only grow): gather them.
        starts = exclusive_cumsum(lens)
        data = data[np.repeat(src - starts[:-1], lens) + iota(0, int(starts[-1]))]
        src = starts[:-1]
    lo, hi = int(src[0]), int(src[-1] + lens[-1])
    if lo < 0 or hi > len(data):
        raise ValueError(f"malformed runs: [{lo}, {hi}) of {len(data)} bytes")
    return data, src, lo, hi


# A body with its runs in order: (lens, data, src, lo, hi), as ``_in_order`` gives them.
_Runs = tuple[Arr, Arr, Arr, int, int]


def assemble(n: int, parts: Sequence[Fields]) -> Arr:
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
    groups: list[list[Fields]] = [[]]
    bodies: list[_Runs] = []
    for part in parts:
        groups[-1].append(part)
        if part.body is not None:
            bodies.append((part.body.lens, *_in_order(part.body)))
            groups.append([])
    widths = [sum(p.width for p in group) for group in groups]
    buf, shrink = _scratch(n, groups, widths, bodies)
    if not bodies:
        return buf
    cuts, take = _row_order(n, widths, shrink, bodies)
    return _take(buf, cuts, take)


def _scratch(
    n: int, groups: Sequence[Sequence[Fields]], widths: Sequence[int], bodies: Sequence[_Runs]
) -> tuple[Arr, list[Arr | None]]:
    """The scratch buffer: every group's prefixes (n rows of them, group after group), then
    the bodies' data, without the bytes prefixes shortened by a NULL leave unused; and per
    group, per row, how many bytes were so removed (None: none)."""
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
    return buf, shrink


def _row_order(
    n: int, widths: Sequence[int], shrink: Sequence[Arr | None], bodies: Sequence[_Runs]
) -> tuple[Arr, Arr]:
    """Every row's groups and body runs in row order, as (cuts, take) for ``_take``: the
    scratch buffer cut into one piece per row of a group, two per value of a body (its run,
    then the gap to the next run), and the pieces that are not gaps, row after row."""
    order = [(False, g) for g in range(len(widths)) if widths[g]]
    order += [(True, b) for b in range(len(bodies))]
    order.sort(key=lambda o: 2 * o[1] + o[0])  # group 0, body 0, group 1, body 1...
    cuts = np.empty(n * (len(order) + len(bodies)) + 1, dtype=np.int64)
    take = np.empty((n, len(order)), dtype=np.int64)
    rows = iota(0, n)
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
            removed = exclusive_cumsum(fewer)
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
    return cuts, take.reshape(-1)


def _fill(out: Arr, width: int, group: Sequence[Fields]) -> None:
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
            words: Arr = np.ndarray((n,), I4, buffer=out, offset=at, strides=(width,))
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
