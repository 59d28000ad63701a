"""Arrow arrays read as numpy arrays: values, validity, variable-length parts; list types."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from sqlsink.postgres.encoding.fields import Arr


def bitmap_bits(buf: pa.Buffer, offset: int, n: int) -> Arr:
    """n bits of an Arrow bitmap, from bit offset, as a bool array."""
    raw = np.frombuffer(buf, dtype=np.uint8, count=(offset + n + 7) // 8)
    return np.unpackbits(raw, count=offset + n, bitorder="little")[offset:].view(np.bool_)


def validity(arr: pa.Array) -> Arr | None:
    """Which values are not NULL, or None when none is NULL."""
    if arr.null_count == 0:
        return None
    buf = arr.buffers()[0]
    if buf is None:  # the null type
        return np.zeros(len(arr), dtype=np.bool_)
    return bitmap_bits(buf, arr.offset, len(arr))


def _raw(arr: pa.Array, dtype: npt.DTypeLike, index: int = 1) -> Arr:
    """The fixed-width values of an array (garbage in NULL slots)."""
    dt = np.dtype(dtype)
    buf = arr.buffers()[index]
    if buf is None or len(arr) == 0:
        return np.zeros(len(arr), dtype=dt)
    return np.frombuffer(buf, dtype=dt, count=len(arr), offset=arr.offset * dt.itemsize)


def values_and_validity(arr: pa.Array, dtype: npt.DTypeLike) -> tuple[Arr, Arr | None]:
    """The values (garbage in NULL slots) and the validity."""
    return _raw(arr, dtype), validity(arr)


def var_parts(arr: pa.Array) -> tuple[Arr, Arr, Arr, Arr | None]:
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
    valid = validity(arr)
    if valid is not None:
        lens = np.where(valid, lens, 0)
    return data, starts, lens, valid


def is_list_type(arrow: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(arrow)
        or pa.types.is_large_list(arrow)
        or pa.types.is_fixed_size_list(arrow)
        or pa.types.is_list_view(arrow)
        or pa.types.is_large_list_view(arrow)
    )
