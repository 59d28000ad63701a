"""Booleans into boolean."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sqlsink.postgres.encoding.buffers import bitmap_bits, validity
from sqlsink.postgres.encoding.fields import Encode, Fields, fixed_fields


def bool_encoder(arrow: pa.DataType, oid: int) -> Encode:
    def booleans(arr: pa.Array) -> Fields:
        n = len(arr)
        buf = arr.buffers()[1]
        values = np.zeros(n, np.bool_) if buf is None else bitmap_bits(buf, arr.offset, n)
        return fixed_fields(validity(arr), ("u1", values))

    return booleans
