"""Booleans into boolean."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sqlsink.postgres.encoding.buffers import _bits, _validity
from sqlsink.postgres.encoding.fields import _Encode, _Fields, _fixed


def _bool_encoder(arrow: pa.DataType, oid: int) -> _Encode:
    def booleans(arr: pa.Array) -> _Fields:
        n = len(arr)
        buf = arr.buffers()[1]
        values = np.zeros(n, np.bool_) if buf is None else _bits(buf, arr.offset, n)
        return _fixed(_validity(arr), ("u1", values))

    return booleans
