"""Lists into PostgreSQL arrays of any supported element type."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sqlsink.postgres.encoding.buffers import validity
from sqlsink.postgres.encoding.fields import (
    I4,
    Body,
    Encode,
    Fields,
    ValueProblem,
    exclusive_cumsum,
)
from sqlsink.postgres.encoding.layout import assemble


def array_encoder(element: Encode, element_oid: int) -> Encode:
    """list<T> into T[]: one-dimensional arrays, lower bound 1; an empty list has 0 dimensions."""

    def arrays(arr: pa.Array) -> Fields:
        n = len(arr)
        valid = validity(arr)
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
            except ValueProblem as p:
                row = int(np.searchsorted(ends, p.index, side="right"))
                at = p.index - int(begins[row]) + 1
                raise ValueProblem(row, f"array element {at}: {p.problem}") from None
            sizes = np.broadcast_to(fields.sizes, (len(child),))
            where = exclusive_cumsum(sizes)
            buf = assemble(len(child), [fields])
            src = where[begins]
            blens = where[ends] - src
            child_valid = validity(child)
            if child_valid is None:
                has_null = np.zeros(n, dtype=np.bool_)
            else:
                nulls = exclusive_cumsum(~child_valid)
                has_null = nulls[ends] > nulls[begins]
        else:
            buf = np.zeros(0, np.uint8)
            src = blens = np.zeros(n, np.int64)
            has_null = np.zeros(n, dtype=np.bool_)
        nonempty = counts > 0
        word = np.where(nonempty, 20 + blens, 12)
        widths = np.where(nonempty, 24, 16)
        cols = [(I4, v) for v in (word, nonempty, has_null, element_oid, counts, 1)]
        return Fields(cols, valid, widths, Body(buf, src, blens))

    return arrays
