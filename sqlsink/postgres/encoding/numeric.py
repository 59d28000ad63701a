"""Integers, floats and decimals into smallint, integer, bigint, real, double precision, numeric."""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np
import pyarrow as pa

from sqlsink.postgres.encoding.buffers import validity, values_and_validity
from sqlsink.postgres.encoding.fields import (
    I2,
    I4,
    Arr,
    Body,
    Encode,
    Fields,
    ValueProblem,
    exclusive_cumsum,
    first_valid,
    fixed_fields,
    from_python,
    iota,
)
from sqlsink.postgres.encoding.oids import FLOAT4, FLOAT8, INT2, INT4, INT8

_INT_TARGETS = {INT2: (">i2", "smallint"), INT4: (">i4", "integer"), INT8: (">i8", "bigint")}


def int_encoder(arrow: pa.DataType, oid: int) -> Encode:
    src = np.dtype(arrow.to_pandas_dtype())
    if oid in _INT_TARGETS:
        be, label = _INT_TARGETS[oid]
        info = np.iinfo(np.dtype(be))
        own = np.iinfo(src)
        check = own.min < info.min or own.max > info.max

        def ints(arr: pa.Array) -> Fields:
            values, valid = values_and_validity(arr, src)
            if check and len(values):
                lo, hi = values.min(), values.max()
                if lo < info.min or hi > info.max:
                    i = first_valid((values < info.min) | (values > info.max), valid)
                    if i is not None:
                        raise ValueProblem(
                            i,
                            f"{values[i]} is out of range for {label} ({info.min}..{info.max})",
                        )
            return fixed_fields(valid, (be, values))

        return ints
    if oid in (FLOAT4, FLOAT8):
        be = ">f4" if oid == FLOAT4 else ">f8"

        def floats(arr: pa.Array) -> Fields:
            values, valid = values_and_validity(arr, src)
            return fixed_fields(valid, (be, values))

        return floats

    def numeric(arr: pa.Array) -> Fields:
        values, valid = values_and_validity(arr, src)
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


def float_encoder(arrow: pa.DataType, oid: int) -> Encode:
    src = np.dtype(arrow.to_pandas_dtype())
    if oid in (FLOAT4, FLOAT8):
        be = ">f4" if oid == FLOAT4 else ">f8"
        narrowing = oid == FLOAT4 and src.itemsize > 4

        def floats(arr: pa.Array) -> Fields:
            values, valid = values_and_validity(arr, src)
            if narrowing and len(values):
                too_big = np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)
                i = first_valid(too_big, valid)
                if i is not None:
                    raise ValueProblem(i, f"{values[i]!r} is out of range for real")
            return fixed_fields(valid, (be, values))

        return floats

    single = src.itemsize <= 4

    def numeric(arr: pa.Array) -> Fields:
        values, valid = values_and_validity(arr, src)
        out: list[bytes | None] = []
        texts = [str(v) for v in values] if single else [repr(v) for v in values.tolist()]
        for i, text in enumerate(texts):
            if valid is not None and not valid[i]:
                out.append(None)
            elif text == "nan":
                out.append(_NUMERIC_NAN)
            elif text in ("inf", "-inf"):
                raise ValueProblem(i, f"{text} cannot be stored in numeric")
            else:
                sign, digits, exponent = decimal.Decimal(text).as_tuple()
                assert isinstance(exponent, int)
                mag = int("".join(map(str, digits)))
                out.append(numeric_bytes(bool(sign) and mag != 0, mag, -exponent))
        return from_python(out)

    return numeric


_NUMERIC_NAN = b"\x00\x00\x00\x00\xc0\x00\x00\x00"


def numeric_bytes(neg: bool, mag: int, scale: int) -> bytes:
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


def _numeric_fields(neg: Arr, limbs: list[Arr], scale: int, valid: Arr | None) -> Fields:
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
    byte_col = iota(0, 2 * count) // 2
    keep = (byte_col >= first[:, None]) & (byte_col <= last[:, None]) & some[:, None]
    data = g.view(np.uint8).reshape(n, 2 * count)[keep]
    body = Body(data, exclusive_cumsum(blens)[:-1], blens)
    cols: list[tuple[np.dtype[Any], Any]] = [
        (I4, 8 + blens),
        (I2, ndigits),
        (I2, weight),
        (np.dtype(">u2"), sign),
        (I2, max(scale, 0)),
    ]
    return Fields(cols, valid, body=body)


def decimal_encoder(arrow: pa.DataType, oid: int) -> Encode:
    width = arrow.byte_width
    scale = arrow.scale

    def numeric(arr: pa.Array) -> Fields:
        n = len(arr)
        buf = arr.buffers()[1]
        words = np.frombuffer(
            buf, dtype="<u4", count=n * width // 4, offset=arr.offset * width
        ).reshape(n, width // 4)
        valid = validity(arr)
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
