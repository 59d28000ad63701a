"""The binary COPY stream: the encoder of a batch's tuples, and the header and trailer."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from sqlsink.errors import ConfigError, WriteError
from sqlsink.postgres.encoding.fields import I2, Encode, Fields, ValueProblem
from sqlsink.postgres.encoding.layout import assemble
from sqlsink.postgres.timing import PartTimes, phase

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
COPY_TRAILER = b"\xff\xff"


@dataclass(frozen=True)
class Column:
    name: str
    type_name: str
    arrow_type: pa.DataType
    encode: Encode


class BinaryCopyEncoder:
    """Encodes record batches of one schema into binary COPY tuples for a list of columns."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self._columns = list(columns)
        self._count = Fields([(I2, len(columns))])  # a tuple's field count

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
        parts: list[Fields] = []
        for i, column in enumerate(self._columns):
            arr = batch.column(i)
            if arr.type != column.arrow_type:
                raise ConfigError(
                    f"column {column.name!r}: a batch has Arrow type {arr.type}, the encoder "
                    f"was built for {column.arrow_type}"
                )
            try:
                parts.append(column.encode(arr))
            except ValueProblem as p:
                raise WriteError(
                    f"column {column.name!r} ({column.type_name}), row {p.index} of the batch: "
                    f"{p.problem}. Fix: correct or filter the value in Spark, or change the "
                    f"column's type",
                    column=column.name,
                    row=p.index,
                    problem=p.problem,
                ) from None
        return assemble(n, [self._count, *parts]).data


class CopyWriter(Protocol):
    """What write_batches needs of a psycopg ``Copy`` (its ``write`` method)."""

    def write(self, buffer: bytes | bytearray | memoryview) -> None: ...


# Told a row the encoder refuses (its index in the batch, column, problem): the batch
# without it, the row kept elsewhere (dead letters); or it raises.
OnProblem = Callable[[pa.RecordBatch, int, str, str], pa.RecordBatch]


def write_batches(
    copy: CopyWriter,
    encoder: BinaryCopyEncoder,
    batches: Iterable[pa.RecordBatch],
    times: PartTimes | None = None,
    on_problem: OnProblem | None = None,
) -> int:
    """Send a whole binary COPY stream: header, every batch's tuples, trailer; the row count.

    psycopg's ``Copy.write()`` sends its buffer as it is in binary format: it adds the header
    (and trailer) only when rows go through ``write_row()`` or nothing is written at all, so
    the header and trailer are written here, once per COPY. Use inside
    ``with cur.copy("COPY ... FROM STDIN (FORMAT BINARY)") as copy:``. ``on_problem``: told
    each value the encoder refuses, it gives the batch without that row, encoded again.
    """
    copy.write(COPY_HEADER)
    rows = 0
    for batch in batches:
        if batch.num_rows:
            with phase(times, "encode"):  # timed apart for benchmarks only (timing.py)
                buffer, batch = _encoded(encoder, batch, on_problem)
            with phase(times, "send"):
                copy.write(buffer)
            rows += batch.num_rows
    copy.write(COPY_TRAILER)
    return rows


def _encoded(
    encoder: BinaryCopyEncoder, batch: pa.RecordBatch, on_problem: OnProblem | None
) -> tuple[bytes | bytearray | memoryview, pa.RecordBatch]:
    """The batch's tuples, and the batch they are of (without the rows on_problem took)."""
    while True:
        try:
            return encoder.encode(batch), batch
        except WriteError as exc:
            if on_problem is None or "problem" not in exc.context:
                raise
            context = exc.context
            batch = on_problem(batch, context["row"], context["column"], context["problem"])
