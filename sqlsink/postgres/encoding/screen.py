"""Judging a batch's rows before they are encoded: the rows the sink knows the server would
refuse, each with its column and reason (option deadLetterTable, postgres/dead_letters.py).

Every check is vectorised (numpy, pyarrow.compute): a batch whose rows are all good costs a
pass over each checked column and a mask, never per-row Python. The checks here are the
ones the encoders leave to the server (NUL in text and in text[] elements, invalid UTF-8,
NULL into NOT NULL, varchar/char length, numeric precision) and the cheap ones the
encoders make anyway (integer ranges, real range, infinity into numeric). What an encoder
still refuses (a date out of range, a string that is not a UUID...) is caught by
``write_batches``'s ``on_problem``, one row at a time: rare rows, at the cost of encoding
the batch again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sqlsink.postgres.catalog import TargetColumn
from sqlsink.postgres.encoding.buffers import validity, values_and_validity, var_parts
from sqlsink.postgres.encoding.builder import normalized
from sqlsink.postgres.encoding.fields import Arr
from sqlsink.postgres.encoding.oids import (
    ARRAY_ELEMENT,
    BPCHAR,
    FLOAT4,
    INT2,
    INT4,
    INT8,
    JSON,
    JSONB,
    NAME,
    NUMERIC,
    TEXT,
    VARCHAR,
)

# A check: the values of one column it refuses (None: none), and why.
Check = Callable[[pa.Array], "tuple[Arr | None, str]"]

_TEXTUAL = (TEXT, VARCHAR, BPCHAR, NAME, JSON, JSONB)
_INT_RANGE = {INT2: (-(2**15), 2**15 - 1, "smallint"), INT4: (-(2**31), 2**31 - 1, "integer")}


@dataclass(frozen=True)
class Judged:
    """A batch judged: its good rows, and per bad row its index in the batch, column, reason."""

    good: pa.RecordBatch
    bad: Arr  # int64 indices into the judged batch, increasing
    columns: tuple[str, ...]
    reasons: tuple[str, ...]


class Screen:
    """The checks of every column of a target, for batches of one Arrow schema."""

    def __init__(self, fields: Sequence[pa.Field], columns: Sequence[TargetColumn]) -> None:
        self._checks = [
            (column.name, i, _column_checks(field.type, column))
            for i, (field, column) in enumerate(zip(fields, columns, strict=True))
        ]

    def judge(self, batch: pa.RecordBatch) -> Judged:
        n = batch.num_rows
        which: Arr | None = None  # per row: the index of its first failed check, or -1
        labels: list[tuple[str, str]] = []
        for name, i, checks in self._checks:
            if not checks:
                continue
            arr = batch.column(i)
            for check in checks:
                bad, reason = check(arr)
                if bad is None or not bad.any():
                    continue
                if which is None:
                    which = np.full(n, -1, dtype=np.int64)
                which[bad & (which < 0)] = len(labels)
                labels.append((name, reason))
        if which is None:
            return Judged(batch, np.zeros(0, np.int64), (), ())
        rows = np.flatnonzero(which >= 0)
        good = batch.filter(pa.array(which < 0))
        found = [labels[k] for k in which[rows].tolist()]
        return Judged(good, rows, tuple(c for c, _ in found), tuple(r for _, r in found))


def _column_checks(arrow: pa.DataType, column: TargetColumn) -> list[Check]:
    checks: list[Check] = []
    if column.not_null:
        checks.append(_not_null)
    base, steps = normalized(arrow)

    def through(check: Check) -> Check:
        if not steps:
            return check

        def converted(arr: pa.Array) -> tuple[Arr | None, str]:
            for step in steps:
                arr = step(arr)
            return check(arr)

        return converted

    oid = column.type_oid
    if (pa.types.is_string(base) or pa.types.is_large_string(base)) and oid in _TEXTUAL:
        checks += [through(_utf8), through(_nul)]
        length = _declared_length(column.type_name) if oid in (VARCHAR, BPCHAR) else None
        if length is not None:
            checks.append(through(_too_long(length, column.type_name)))
    elif _text_list(base) and ARRAY_ELEMENT.get(oid) in _TEXTUAL:  # text[]: its elements
        checks += [through(_in_elements(_utf8)), through(_in_elements(_nul))]
    elif pa.types.is_integer(base) and oid in _INT_RANGE:
        checks.append(through(_int_range(base, *_INT_RANGE[oid])))
    elif pa.types.is_integer(base) and oid == INT8 and base == pa.uint64():
        checks.append(through(_int_range(base, -(2**63), 2**63 - 1, "bigint")))
    elif pa.types.is_floating(base) and oid == FLOAT4 and base.bit_width > 32:
        checks.append(through(_real_range))
    elif pa.types.is_floating(base) and oid == NUMERIC:
        checks.append(through(_infinite))
    if oid == NUMERIC and (pa.types.is_decimal(base) or pa.types.is_integer(base)):
        precision = _declared_precision(column.type_name)
        if precision is not None:
            checks.append(through(_numeric_overflow(*precision, column.type_name)))
    return checks


def _text_list(arrow: pa.DataType) -> bool:
    if not (pa.types.is_list(arrow) or pa.types.is_large_list(arrow)):
        return False
    value: pa.DataType = arrow.value_type
    return bool(pa.types.is_string(value) or pa.types.is_large_string(value))


def _in_elements(check: Check) -> Check:
    """A check of text values, of the elements of a list column: a row is refused when
    one of its elements is."""

    def lifted(arr: pa.Array) -> tuple[Arr | None, str]:
        values = arr.flatten()  # the elements of the valid lists, in order
        bad, reason = check(values)
        if bad is None or not bad.any():
            return None, ""
        parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
        rows = np.zeros(len(arr), np.bool_)
        rows[parents[np.asarray(bad, np.bool_)]] = True
        return rows, f"{reason} in an array element"

    return lifted


def _not_null(arr: pa.Array) -> tuple[Arr | None, str]:
    valid = validity(arr)
    return (None if valid is None else ~valid), "NULL into a NOT NULL column"


def _utf8(arr: pa.Array) -> tuple[Arr | None, str]:
    try:
        arr.validate(full=True)
        return None, ""
    except pa.ArrowInvalid:  # rare: find the values, one by one
        pass
    data, starts, lens, _ = var_parts(arr)
    bad = np.zeros(len(arr), np.bool_)
    for i in range(len(arr)):
        try:
            bytes(data[starts[i] : starts[i] + lens[i]]).decode("utf-8")
        except UnicodeDecodeError:
            bad[i] = True
    return bad, "invalid UTF-8"


def _nul(arr: pa.Array) -> tuple[Arr | None, str]:
    data, starts, lens, _ = var_parts(arr)
    if not len(arr):
        return None, ""
    lo, hi = int(starts[0]), int(starts[-1] + lens[-1])
    at = np.flatnonzero(data[lo:hi] == 0)
    if not len(at):
        return None, ""
    rows = np.searchsorted(starts, at + lo, side="right") - 1
    bad = np.zeros(len(arr), np.bool_)
    bad[rows[lens[rows] > 0]] = True
    return bad, "a NUL character (text cannot hold it)"


def _declared_length(type_name: str) -> int | None:
    found = re.search(r"\((\d+)\)$", type_name)
    return int(found.group(1)) if found else None


def _declared_precision(type_name: str) -> tuple[int, int] | None:
    found = re.search(r"\((\d+)(?:,(\d+))?\)$", type_name)
    return (int(found.group(1)), int(found.group(2) or 0)) if found else None


def _too_long(length: int, type_name: str) -> Check:
    def check(arr: pa.Array) -> tuple[Arr | None, str]:
        long = pc.greater(pc.utf8_length(arr), length)
        if not pc.any(long).as_py():
            return None, ""
        # PostgreSQL cuts trailing spaces beyond the length instead of refusing them
        trimmed = pc.greater(pc.utf8_length(pc.utf8_rtrim(arr, characters=" ")), length)
        bad = trimmed.to_numpy(zero_copy_only=False)
        return bad.astype(np.bool_) & ~_nulls(arr), f"longer than {type_name} allows"

    return check


def _nulls(arr: pa.Array) -> Arr:
    valid = validity(arr)
    return np.zeros(len(arr), np.bool_) if valid is None else ~valid


def _int_range(arrow: pa.DataType, low: int, high: int, label: str) -> Check:
    src = np.dtype(arrow.to_pandas_dtype())
    own = np.iinfo(src)
    if own.min >= low and own.max <= high:
        return lambda arr: (None, "")

    def check(arr: pa.Array) -> tuple[Arr | None, str]:
        values, valid = values_and_validity(arr, src)
        if not len(values) or (values.min() >= low and values.max() <= high):
            return None, ""
        bad = (values < low) | (values > high) if src.kind == "i" else values > high
        return (bad if valid is None else bad & valid), f"out of range for {label}"

    return check


def _real_range(arr: pa.Array) -> tuple[Arr | None, str]:
    values, valid = values_and_validity(arr, np.dtype(arr.type.to_pandas_dtype()))
    bad = np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)
    return (bad if valid is None else bad & valid), "out of range for real"


def _infinite(arr: pa.Array) -> tuple[Arr | None, str]:
    values, valid = values_and_validity(arr, np.dtype(arr.type.to_pandas_dtype()))
    bad = np.isinf(values)
    return (bad if valid is None else bad & valid), "infinity cannot be stored in numeric"


def _numeric_overflow(precision: int, scale: int, type_name: str) -> Check:
    """numeric(p, s) holds absolute values under 10^(p - s) once rounded to s places."""

    def check(arr: pa.Array) -> tuple[Arr | None, str]:
        if pa.types.is_integer(arr.type):
            if precision - scale >= 20:
                return None, ""
            arr = arr.cast(pa.decimal128(20, 0))
        digits = precision - scale
        if arr.type.precision - arr.type.scale <= digits:
            return None, ""
        try:
            rounded = pc.round(arr, ndigits=scale) if arr.type.scale > scale else arr
        except pa.ArrowInvalid:  # rounding overflowed the type: compare unrounded
            rounded = arr
        widened = rounded.cast(pa.decimal128(38, max(rounded.type.scale, 0)))
        limit = pa.scalar(10**digits, pa.decimal128(38, 0)).cast(widened.type)
        over = pc.fill_null(pc.greater_equal(pc.abs(widened), limit), False)
        mask = over.to_numpy(zero_copy_only=False).astype(np.bool_)
        return mask, f"out of range for {type_name}"

    return check
