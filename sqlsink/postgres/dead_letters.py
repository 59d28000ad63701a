"""The dead-letter table (option deadLetterTable): the rows the sink judges unwritable
before sending them, kept instead of failing the batch.

The table is created at planning on the driver when missing (``ensure_table``: its DDL
is here only). On an executor, ``DeadLetters`` sits between the partition's batches and
the COPY: it lets the good rows through (``encoding.screen``: vectorised) and keeps the
bad ones as JSON; ``insert`` writes them with the partition's session, after the COPY
and before the marker row and PREPARE TRANSACTION, so they commit exactly when the
batch's rows do: exactly once, as the rows (docs/DESIGN.md). Rows only the server can
refuse (a CHECK, a foreign key, a unique violation) still fail the batch.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
from psycopg import sql

from sqlsink.core.model import TaskIdentity
from sqlsink.errors import ConfigError
from sqlsink.postgres.catalog import TargetColumn
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.encoding.screen import Screen
from sqlsink.tablename import TableName

_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    id bigserial PRIMARY KEY,
    sink_id text NOT NULL,
    target_table text NOT NULL,
    batch_id bigint NOT NULL,
    partition_id integer NOT NULL,
    row_number bigint NOT NULL,
    column_name text,
    reason text NOT NULL,
    row_json jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
)
"""
_COLUMNS = (
    "sink_id",
    "target_table",
    "batch_id",
    "partition_id",
    "row_number",
    "column_name",
    "reason",
    "row_json",
)
_NUL_NOTE = " (NUL characters are written as the text \\u0000 in row_json: jsonb refuses them)"


def create_statement(table: TableName) -> sql.Composed:
    """The table's DDL (``row_number``: the row's position in its partition, from 0)."""
    return sql.SQL(_DDL.strip()).format(table=table.identifier())


def ensure_table(conn: Connection, table: TableName, target: TableName) -> None:
    """At planning: create the table if missing; refuse one the sink cannot insert into."""
    # the name as SQL text (quoted): to_regclass and the privilege functions parse it,
    # folding an unquoted name to lower case
    regclass = table.identifier().as_string(conn)
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (regclass,)).fetchone()
    if not (exists and exists[0]):
        try:
            with conn.transaction():
                conn.execute(create_statement(table))
        except psycopg.errors.InsufficientPrivilege:
            user = conn.info.user
            raise ConfigError(
                f"option deadLetterTable: table {table} is missing and role {user!r} may not "
                f"create it in schema {table.schema!r}. Fix: GRANT CREATE ON SCHEMA "
                f"{sql.Identifier(table.schema).as_string(conn)} TO "
                f"{sql.Identifier(user).as_string(conn)}, or create it yourself: "
                f"{create_statement(table).as_string(conn)}",
                table=str(table),
            ) from None
    _check_shape(conn, table, regclass)
    row = conn.execute(
        "SELECT has_table_privilege(%s, 'INSERT'), has_sequence_privilege("
        "pg_get_serial_sequence(%s, 'id'), 'USAGE')",
        (regclass, regclass),
    ).fetchone()
    if row is None or not row[0] or row[1] is False:
        user = conn.info.user
        raise ConfigError(
            f"option deadLetterTable: role {user!r} may not insert into table {table} "
            f"(the dead letters of table {target}). Fix: GRANT INSERT ON {table} TO "
            f"{sql.Identifier(user).as_string(conn)} and GRANT USAGE ON its id sequence",
            table=str(table),
        )


def _check_shape(conn: Connection, table: TableName, regclass: str) -> None:
    """A table found (the user's, or an older one): the columns the sink writes, and an
    id it need not give; else refused now, not at the stream's first bad row."""
    found = {
        str(name): (bool(not_null), bool(default))
        for name, not_null, default in conn.execute(
            "SELECT attname, attnotnull, atthasdef OR attidentity <> '' "
            "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped",
            (regclass,),
        ).fetchall()
    }
    problems = [f"column {c!r} is missing" for c in _COLUMNS if c not in found]
    if "id" in found and found["id"][0] and not found["id"][1]:
        problems.append("column 'id' has no default (the sink does not give one)")
    own = {*_COLUMNS, "id", "recorded_at"}
    extra = [c for c, (not_null, default) in found.items() if c not in own and not_null]
    extra = [c for c in extra if not found[c][1]]
    problems += [f"column {c!r} is NOT NULL without a default" for c in extra]
    if problems:
        raise ConfigError(
            f"option deadLetterTable: table {table} exists but is not a dead-letter table "
            f"the sink can write: {'; '.join(problems)}. Fix: name another table (the sink "
            f"creates it), or drop or alter this one to: "
            f"{create_statement(table).as_string(conn)}",
            table=str(table),
        )


class DeadLetters:
    """One partition's dead letters: between its batches and the COPY (``screened``,
    ``take_row``), then written by ``insert``."""

    def __init__(
        self,
        table: TableName,
        target: TableName,
        task: TaskIdentity,
        columns: Sequence[TargetColumn],
    ) -> None:
        self.table = table
        self.target = str(target)
        self.task = task
        self.columns = list(columns)
        self.rows: list[tuple[int, str, str, str]] = []  # position, column, reason, JSON
        self._positions: Any = None  # of the current batch's rows in the partition
        self._names: list[str] = []

    def screened(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches without the rows the screen refuses, kept here."""
        screen: Screen | None = None
        offset = 0
        for batch in batches:
            if screen is None:
                screen = Screen(list(batch.schema), self.columns)
                self._names = [c.name for c in self.columns]
            judged = screen.judge(batch)
            positions = np.arange(offset, offset + batch.num_rows, dtype=np.int64)
            offset += batch.num_rows
            if len(judged.bad):
                self._keep(batch, judged.bad, positions, judged.columns, judged.reasons)
                positions = np.delete(positions, judged.bad)
            self._positions = positions
            yield judged.good

    def take_row(
        self, batch: pa.RecordBatch, row: int, column: str, problem: str
    ) -> pa.RecordBatch:
        """``write_batches``'s on_problem: keep the row the encoder refused; the batch
        without it."""
        positions = self._positions
        if positions is None or len(positions) != batch.num_rows:  # not a screened batch
            positions = np.arange(batch.num_rows, dtype=np.int64)
        self._keep(batch, np.array([row]), positions, (column,), (problem,))
        self._positions = np.delete(positions, row)
        keep = np.ones(batch.num_rows, np.bool_)
        keep[row] = False
        return batch.filter(pa.array(keep))

    def _keep(
        self,
        batch: pa.RecordBatch,
        rows: Any,
        positions: Any,
        columns: Sequence[str],
        reasons: Sequence[str],
    ) -> None:
        bad = batch.take(pa.array(rows))
        names = self._names or [c.name for c in self.columns]
        for j, record in enumerate(_records(bad, names)):
            text, had_nul = _json(record)
            reason = reasons[j] + (_NUL_NOTE if had_nul else "")
            self.rows.append((int(positions[rows[j]]), columns[j], reason, text))

    def insert(self, conn: Connection) -> None:
        """Inside the partition's transaction, before its marker and PREPARE."""
        if not self.rows:
            return
        names = sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS)
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(self.table.identifier(), names)
        task = self.task
        with conn.cursor() as cur, cur.copy(statement) as copy:
            for position, column, reason, text in self.rows:
                copy.write_row(
                    (
                        task.sink_id,
                        self.target,
                        task.batch_id,
                        task.partition_id,
                        position,
                        column,
                        reason,
                        text,
                    )
                )


def _records(batch: pa.RecordBatch, names: Sequence[str]) -> list[dict[str, Any]]:
    """The rows as dicts of Python values, by target column (invalid UTF-8 kept readable)."""
    values: list[list[Any]] = []
    for i in range(min(batch.num_columns, len(names))):  # not upsert's ordinal
        arr = batch.column(i)
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            raw = arr.cast(pa.large_binary()).to_pylist()
            values.append([None if v is None else v.decode("utf-8", "replace") for v in raw])
        else:
            values.append(_python_values(arr))
    return [dict(zip(names, row, strict=False)) for row in zip(*values, strict=True)]


def _python_values(arr: pa.Array) -> list[Any]:
    """The values as Python's; one Python cannot hold (a date beyond year 9999) as its
    Arrow storage, e.g. "2147483647 (date32[day])"."""
    try:
        return list(arr.to_pylist())
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    out: list[Any] = []
    for i in range(len(arr)):
        try:
            out.append(arr[i].as_py())
        except (OverflowError, ValueError, pa.ArrowException):
            width = arr.type.bit_width if hasattr(arr.type, "bit_width") else 0
            try:
                raw = arr.slice(i, 1).view(pa.int32() if width == 32 else pa.int64())[0]
                out.append(f"{raw.as_py()} ({arr.type})")
            except (ValueError, pa.ArrowException):
                out.append(f"(a value of {arr.type} Python cannot show)")
    return out


def _json(record: dict[str, Any]) -> tuple[str, bool]:
    """The row as JSON text jsonb accepts, and whether it held a NUL character."""
    found = [False]

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            if "\x00" in value:
                found[0] = True
                return value.replace("\x00", "\\u0000")
            return value
        if isinstance(value, dict):
            return {str(clean(k)): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, (bytes, bytearray)):
            return base64.b64encode(value).decode("ascii")
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return value

    text = json.dumps(clean(record), default=str, allow_nan=False)
    return text, found[0]
