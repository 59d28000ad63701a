"""Arrow record batches to PostgreSQL binary COPY tuples, vectorised with numpy.

The binary COPY stream is a header (``COPY_HEADER``), tuples, and a trailer (``COPY_TRAILER``).
A tuple is an int16 field count followed by, for every field, an int32 length (-1 for NULL)
and that many bytes of the type's binary "send" format. All integers are big-endian.

Modules, by layer (as psycopg's ``types`` package is organised by type family):

* ``fields``: what a column encoder produces (``Fields``: per value a fixed-size prefix and
  optionally a variable-length body) and the vectorised helpers that make them;
  ``buffers``: Arrow arrays read as numpy arrays.
* The column encoders, one module per type family: ``numeric`` (integers, floats, decimals),
  ``booleans``, ``temporal`` (dates, timestamps, times, durations), ``text`` (strings and
  binaries into text, bytea, uuid, inet...), ``nested`` (struct/map/list into json/jsonb),
  ``arrays`` (list into T[]); ``oids`` names the PostgreSQL types.
* ``layout``: the fields of every column laid out in rows (``assemble``).
* ``builder``: the encoder of every (Arrow type, PostgreSQL type) pair (``build_encoder``), and
  the errors with their fixes for the pairs that have none.
* ``writer``: ``BinaryCopyEncoder`` (a batch's tuples) and the COPY stream (``write_batches``).
* ``screen``: with option deadLetterTable, the rows the sink knows the server would refuse,
  each with its column and reason, judged vectorised before encoding (``Screen.judge``).

Every column encoder is vectorised (no per-row Python) for the common types (integers, floats,
booleans, dates, times, timestamps, intervals, strings and binaries of every kind including
text/json/jsonb/uuid, decimals into numeric, arrays of all of these); ``layout`` says how.
Per-value Python is used only for floats into numeric, inet/cidr, and struct/map/list into
json/jsonb.

Semantics worth knowing:

* Timestamps are microseconds since 2000-01-01 00:00 UTC. Arrow stores tz-aware timestamps as
  UTC instants, so any Arrow time zone into ``timestamptz`` is exact. A tz-less Arrow timestamp
  (Spark's TimestampNTZ) into ``timestamptz`` is taken as UTC, into ``timestamp`` stored as it
  is; a tz-aware one into ``timestamp`` (without time zone) stores its wall time in its own
  zone, DST-aware (``temporal.timestamp_encoder``): Spark labels TimestampType batches with the
  session time zone, so 00:00 in New York stays 00:00. Nanoseconds are floored to the microsecond
  (toward negative infinity: the microsecond that contains the instant), as are nanosecond
  times and durations.
* Text goes to the server as UTF-8 bytes (Arrow strings are UTF-8), so the connection's
  ``client_encoding`` must be UTF8 (the psycopg default against a UTF8 server). The server
  checks the encoding, NUL bytes, varchar/char lengths, numeric precision, json/jsonb syntax
  (with deadLetterTable, ``screen`` checks all but the last before, and keeps those rows).
* Floats into numeric: NaN becomes numeric NaN, infinities are refused (not every server
  version has numeric infinity). The decimal digits are those of the shortest repr.
* struct/map/list into json/jsonb: ``json.dumps(..., separators=(",", ":"), default=str)``:
  maps become objects (non-string keys through ``str``), binaries base64, float NaN/infinities
  the strings "NaN"/"Infinity"/"-Infinity", decimals/dates/times through ``str``.
"""

from __future__ import annotations

from sqlsink.postgres.encoding.builder import build_encoder
from sqlsink.postgres.encoding.writer import (
    COPY_HEADER,
    COPY_TRAILER,
    BinaryCopyEncoder,
    CopyWriter,
    write_batches,
)

__all__ = [
    "COPY_HEADER",
    "COPY_TRAILER",
    "BinaryCopyEncoder",
    "CopyWriter",
    "build_encoder",
    "write_batches",
]
