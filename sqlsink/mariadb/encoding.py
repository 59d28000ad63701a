"""Arrow record batches as the text ``LOAD DATA LOCAL INFILE`` reads, built by Arrow's
compute kernels (no Python loop over rows or values).

The format (``load_statement`` says it to the server): fields end at a tab, lines at a
newline, ``\\`` escapes, NULL is ``\\N``, the file's character set is ``binary`` (bytes
go to each column as they are: UTF-8 text into utf8mb4 columns, raw bytes into binary
ones). So a value round-trips exactly when its text does:

    NULL          \\N             (an empty string stays an empty field: not NULL)
    strings       UTF-8, with \\ -> \\\\, tab -> \\t, newline -> \\n, NUL -> \\0
    binary        the bytes, escaped the same way
    booleans      1 / 0
    integers      decimal digits
    floats        the shortest text that reads back as the same double (Arrow's);
                  NaN and +-Infinity refused (MariaDB's DOUBLE cannot hold them)
    decimals      their digits (38 of them fit DECIMAL(38, s))
    timestamps    'YYYY-MM-DD hh:mm:ss.ffffff' in UTC (the session's time_zone is
                  '+00:00'), microseconds
    dates         'YYYY-MM-DD'
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sqlsink.errors import WriteError

NULL = "\\N"
# the order matters: the backslash first, so that later escapes are not escaped again
_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\x00", "\\0"))


def quote_name(name: str) -> str:
    """An identifier in backticks (a backtick in it doubled)."""
    return "`" + name.replace("`", "``") + "`"


def load_statement(
    table: str, columns: Sequence[str], path: str, *, replace: bool = False
) -> tuple[str, tuple[str]]:
    """The LOAD DATA statement for this format (``table`` quoted already), and its
    argument (the file's path). ``replace``: a row whose unique key an earlier row of
    the file holds replaces it (upsert's staging table: the last row of a key wins)."""
    names = ", ".join(quote_name(c) for c in columns)
    how = "REPLACE " if replace else ""
    return (
        f"LOAD DATA LOCAL INFILE %s {how}INTO TABLE {table} CHARACTER SET binary "
        "FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' "
        f"({names})",
        (path,),
    )


class NotFinite(WriteError):
    """A NaN or an infinity in a floating-point column."""


def _text(column: pa.Array, name: str) -> pa.Array:
    """One column as text of the format (binary for binary columns), NULL as ``\\N``."""
    kind = column.type
    if pa.types.is_null(kind):
        return pa.array([NULL] * len(column), pa.string())
    if pa.types.is_boolean(kind):
        text = pc.cast(pc.cast(column, pa.int8()), pa.string())
    elif pa.types.is_integer(kind) or pa.types.is_decimal(kind) or pa.types.is_date32(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_floating(kind):
        finite = pc.is_finite(column)
        bad = pc.sum(pc.invert(pc.fill_null(finite, True))).as_py()
        if bad:
            raise NotFinite(
                f"column {name!r} holds {bad} NaN or infinite value(s), which MariaDB's "
                "DOUBLE and FLOAT cannot store. Fix: map them in Spark before the sink "
                f"(e.g. when(isnan(col('{name}')) | col('{name}').isin(float('inf'), "
                "float('-inf')), None).otherwise(...)) to NULL, or filter those rows",
                column=name,
            )
        text = pc.cast(column, pa.string())
    elif pa.types.is_timestamp(kind):
        if kind.unit == "ns":
            column = pc.cast(column, pa.timestamp("us", kind.tz), safe=False)
        # Arrow keeps a zoned timestamp in UTC: the zone is dropped, not applied
        naive = column.view(pa.timestamp(kind.unit if kind.unit != "ns" else "us"))
        if kind.unit in ("s", "ms"):
            naive = pc.cast(naive, pa.timestamp("us"))
        # "YYYY-MM-DD hh:mm:ss.ffffff": the same text as strftime("%Y-%m-%d %H:%M:%S") gives
        # for microseconds, at a tenth of its cost (benchmarks/results/mariadb_peers.md)
        text = pc.cast(naive, pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = _escaped(column)
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        text = _escaped(pc.cast(column, pa.binary()))
    elif pa.types.is_date64(kind):
        text = pc.cast(pc.cast(column, pa.date32()), pa.string())
    else:
        raise WriteError(
            f"column {name!r} has Arrow type {kind}, which the MariaDB load does not "
            "write. Fix: cast it in Spark to a string, a number, a decimal, a date or a "
            "timestamp",
            column=name,
        )
    return pc.fill_null(pc.cast(text, pa.binary()), NULL.encode())


def _escaped(column: pa.Array) -> pa.Array:
    for plain, escaped in _ESCAPES:
        column = pc.replace_substring(column, plain, escaped)
    return column


def encode(batch: pa.RecordBatch) -> bytes:
    """The batch's rows as lines of the format (empty for an empty batch)."""
    if not batch.num_rows:
        return b""
    fields = [_text(batch.column(i), batch.schema.field(i).name) for i in range(batch.num_columns)]
    line = pc.binary_join_element_wise(*fields, b"\t") if len(fields) > 1 else fields[0]
    lines = pc.binary_join_element_wise(line, b"", b"\n")
    lines = lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines
    offsets = lines.buffers()[1]
    data = lines.buffers()[2]
    assert offsets is not None and data is not None
    starts = pa.Array.from_buffers(pa.int32(), len(lines) + 1, [None, offsets], offset=lines.offset)
    first, last = starts[0].as_py(), starts[len(lines)].as_py()
    return bytes(data.slice(first, last - first).to_pybytes())
