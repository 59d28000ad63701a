"""Schema evolution (option ``schemaEvolution``): what planning changes in the target.

``addColumns``: a DataFrame column the table lacks is added as a nullable column of the
type ``createTable`` would give it (docs/reference/types.md). ``widen``: that, and a column
whose DataFrame type is wider than the column's is widened where PostgreSQL keeps every
stored value:

| column                 | DataFrame (its type-table type) | table rewritten |
|------------------------|---------------------------------|-----------------|
| smallint               | integer, bigint                 | yes             |
| integer                | bigint                          | yes             |
| real                   | double precision                | yes             |
| character varying(n)   | text                            | no              |
| numeric(p,s)           | numeric(p',s), p' > p           | no              |

PostgreSQL rewrites a table when a column's type changes unless the old type is binary
coercible to the new one (ALTER TABLE, "Notes"); a longer varchar, varchar to text and
a numeric's larger precision at the same scale are. A numeric's larger scale would
change every stored value (1.50 becomes 1.5000): refused, with the statement. Other
pairs are never changed (timestamp to timestamptz changes what a value means): they are
written as without the option, or refused as then.

Planning (``plan_evolution``) only reads; every problem joins the planner's one message
before anything changes. ``apply_evolution`` then locks the table and runs one ``ALTER
TABLE`` in its own short transaction, with a bounded lock wait whose error names the
holder. ``ADD COLUMN IF NOT EXISTS``, a widening made only if the column still has the
type planned (two queries widening at once never narrow it), and re-planning (which
finds the columns) make it idempotent across crashes, replays and races. A consistent
view is replaced to show the new columns by the committer before the batch's decision
(``views.keep_view``: its columns differ).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from sqlsink.errors import ConfigError, TransientError
from sqlsink.options import SchemaEvolution, SinkOptions
from sqlsink.postgres.catalog import TargetColumn
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.locks import describe_holders, relation_lock_holders
from sqlsink.tablename import TableName

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("sqlsink")

# an ALTER TABLE waiting for its lock queues every later reader and writer of the table
# behind it: it waits lockTimeout, but never longer than this
EVOLUTION_LOCK_TIMEOUT_S = 10.0

# the SQLAlchemy type a DataFrame column is created as (spark/types.column_type)
ColumnType = Callable[[str], Any]

_INTEGERS = {"smallint": 2, "integer": 4, "bigint": 8}
_INTEGER_NAMES = {2: "smallint", 4: "integer", 8: "bigint"}
_VARCHAR = re.compile(r"character varying\(\d+\)")
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")


@dataclass(frozen=True)
class Widening:
    column: str
    old_type: str
    new_type: str
    rewrite: bool  # the server rewrites the table (and its indexes)


@dataclass(frozen=True)
class Evolution:
    """What planning found: the table's columns as they will be, the changes, the problems."""

    columns: tuple[TargetColumn, ...]
    additions: tuple[tuple[str, str], ...] = ()  # (column, type)
    widenings: tuple[Widening, ...] = ()
    problems: tuple[str, ...] = ()
    unaddable: tuple[str, ...] = ()  # new columns without a PostgreSQL type (in problems)

    @property
    def changes(self) -> bool:
        return bool(self.additions or self.widenings)


def plan_evolution(
    conn: Connection,
    options: SinkOptions,
    columns: Sequence[TargetColumn],
    field_names: Sequence[str],
    arrow_schema: pa.Schema | None,
    column_type: ColumnType,
) -> Evolution:
    """The changes ``options.schema_evolution`` makes for this DataFrame, and what it
    refuses; reads the catalog only."""
    table = options.table
    by_name = {c.name: c for c in columns}
    by_lower = {c.name.lower(): c for c in columns}
    additions: list[tuple[str, str]] = []
    problems: list[str] = []
    unaddable: list[str] = []
    longest = _longest_name(conn)
    for name in field_names:
        if name == options.delete_column or name in by_name or name.lower() in by_lower:
            continue
        if len(name.encode()) > longest:  # the server would cut it: never found again
            problems.append(
                f"column {name!r} of the DataFrame: its name is {len(name.encode())} bytes "
                f"and PostgreSQL keeps {longest} (max_identifier_length), so the column "
                "added would have another name. Fix: rename the column in Spark"
            )
            unaddable.append(name)
            continue
        try:
            additions.append((name, _type_text(column_type(name))))
        except ConfigError as exc:  # no PostgreSQL type for its Spark type
            problems.append(str(exc))
            unaddable.append(name)
    widenings: list[Widening] = []
    if options.schema_evolution is SchemaEvolution.WIDEN and arrow_schema is not None:
        for name in field_names:
            column = by_name.get(name) or by_lower.get(name.lower())
            if column is None or name == options.delete_column:
                continue
            widening, problem = _widening(conn, table, column, arrow_schema.field(name).type)
            if widening is not None:
                widenings.append(widening)
            if problem is not None:
                problems.append(problem)
        problems += _view_problems(conn, table, widenings)
    oids = _type_oids(conn, [t for _, t in additions] + [w.new_type for w in widenings])
    widened = {w.column: w.new_type for w in widenings}
    evolved = [
        replace(c, type_oid=oids[widened[c.name]], type_name=widened[c.name])
        if c.name in widened
        else c
        for c in columns
    ]
    evolved += [TargetColumn(name, oids[type_], type_, False, False) for name, type_ in additions]
    return Evolution(
        tuple(evolved), tuple(additions), tuple(widenings), tuple(problems), tuple(unaddable)
    )


def _longest_name(conn: Connection) -> int:
    row = conn.execute("SELECT current_setting('max_identifier_length')::int").fetchone()
    return int(row[0]) if row else 63


def _type_text(sa_type: Any) -> str:
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return str(sa_type.compile(dialect=dialect)).lower()


def _type_oids(conn: Connection, types: list[str]) -> dict[str, int]:
    if not types:
        return {}
    rows = conn.execute(
        "SELECT t, t::regtype::oid::int FROM unnest(%s::text[]) AS t", (types,)
    ).fetchall()
    return {str(t): int(oid) for t, oid in rows}


def _widening(
    conn: Connection, table: TableName, column: TargetColumn, arrow: pa.DataType
) -> tuple[Widening | None, str | None]:
    """The widening this column needs for ``arrow`` (None: none, or none PostgreSQL keeps
    the values in, then with the problem that says so)."""
    import pyarrow as pa

    have = column.type_name
    if have in _INTEGERS and pa.types.is_signed_integer(arrow):
        want = max(2, arrow.bit_width // 8)
        if want > _INTEGERS[have]:
            return Widening(column.name, have, _INTEGER_NAMES[want], rewrite=True), None
    elif have == "real" and pa.types.is_float64(arrow):
        return Widening(column.name, have, "double precision", rewrite=True), None
    elif _VARCHAR.fullmatch(have) and (
        pa.types.is_string(arrow) or pa.types.is_large_string(arrow)
    ):
        return Widening(column.name, have, "text", rewrite=False), None
    elif (numeric := _NUMERIC.fullmatch(have)) and pa.types.is_decimal(arrow):
        precision, scale = int(numeric.group(1)), int(numeric.group(2))
        digits = max(precision - scale, arrow.precision - arrow.scale)
        if arrow.scale > scale:
            wanted = f"numeric({digits + arrow.scale},{arrow.scale})"
            return None, (
                f"column {column.name!r} of table {table} is {have} and the DataFrame's is "
                f"decimal({arrow.precision},{arrow.scale}): more decimal places would change "
                "every stored value (1.50 becomes 1.5000; PostgreSQL rewrites the table), so "
                "the sink does not widen it. Fix: "
                f"{alter_type(conn, table, column.name, wanted)}, or cast the column in Spark "
                f"to decimal({digits + scale},{scale})"
            )
        if digits > precision - scale:
            wanted = f"numeric({digits + scale},{scale})"
            return Widening(column.name, have, wanted, rewrite=False), None
    return None, None


_DEPENDENT_VIEWS = """
SELECT DISTINCT a.attname::text, v.oid::regclass::text
FROM pg_depend d
JOIN pg_rewrite r ON r.oid = d.objid
JOIN pg_class v ON v.oid = r.ev_class
JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
  AND d.refobjid = %s::regclass AND v.oid <> d.refobjid AND a.attname = ANY(%s)
ORDER BY 1, 2
"""


def _view_problems(conn: Connection, table: TableName, widenings: list[Widening]) -> list[str]:
    """PostgreSQL cannot change the type of a column a view reads (a consistent view
    among them): refused before anything changes, with the statements."""
    if not widenings:
        return []
    rows = conn.execute(
        _DEPENDENT_VIEWS, (quoted(conn, table), [w.column for w in widenings])
    ).fetchall()
    wanted = {w.column: w for w in widenings}
    problems = []
    for column, view in rows:
        widening = wanted[column]
        problems.append(
            f"column {column!r} of table {table} would be widened from {widening.old_type} "
            f"to {widening.new_type}, but view {view} reads it and PostgreSQL cannot change "
            f"the type of a column a view reads. Fix: DROP VIEW {view}; "
            f"{alter_type(conn, table, column, widening.new_type)}; then create the view "
            "again (a consistent view of the sink is created again by its next batch: grant "
            "SELECT on it again)"
        )
    return problems


def quoted(conn: Connection, table: TableName) -> str:
    return table.identifier().as_string(conn)


def alter_type(conn: Connection, table: TableName, column: str, type_: str) -> str:
    return (
        f"ALTER TABLE {quoted(conn, table)} ALTER COLUMN "
        f"{sql.Identifier(column).as_string(conn)} TYPE {type_}"
    )


def drop_not_null(conn: Connection, table: TableName, column: str) -> str:
    return (
        f"ALTER TABLE {quoted(conn, table)} ALTER COLUMN "
        f"{sql.Identifier(column).as_string(conn)} DROP NOT NULL"
    )


def _statement(table: TableName, evolution: Evolution) -> sql.Composed:
    parts = [
        sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(name), sql.SQL(type_))
        for name, type_ in evolution.additions
    ]
    parts += [
        sql.SQL("ALTER COLUMN {} TYPE {}").format(sql.Identifier(w.column), sql.SQL(w.new_type))
        for w in evolution.widenings
    ]
    return sql.SQL("ALTER TABLE {} ").format(table.identifier()) + sql.SQL(", ").join(parts)


def apply_evolution(conn: Connection, options: SinkOptions, evolution: Evolution) -> None:
    """One ALTER TABLE in its own short transaction; its lock wait is bounded, and the
    error names who holds the table (a prepared transaction, with the way to resolve it)."""
    table = options.table
    what = _described(evolution)
    rewritten = [w.column for w in evolution.widenings if w.rewrite]
    if rewritten:
        log.warning(
            "sqlsink: widening %s of table %s: PostgreSQL rewrites the table and its indexes "
            "(no reader or writer of it gets on until that is done)",
            ", ".join(repr(c) for c in rewritten),
            table,
        )
    timeout_s = min(options.lock_timeout_s, EVOLUTION_LOCK_TIMEOUT_S)
    try:
        with conn.transaction():
            conn.execute(
                "SELECT set_config('lock_timeout', %s, true)",
                (f"{max(int(timeout_s * 1000), 1)}ms",),
            )
            conn.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table.identifier())
            )
            evolution = _still_needed(conn, table, evolution)
            if evolution.changes:
                conn.execute(_statement(table, evolution))
    except psycopg.errors.LockNotAvailable:
        raise _lock_error(conn, table, what, timeout_s) from None
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(
            f"option schemaEvolution={options.schema_evolution.value}: cannot alter table "
            f"{table} ({exc.diag.message_primary}). Nothing was written. Fix: run the sink "
            f"as the table's owner, or run {_statement(table, evolution).as_string(conn)} "
            "as its owner",
            table=str(table),
        ) from None
    except (psycopg.ProgrammingError, psycopg.NotSupportedError) as exc:
        # what the catalog read above does not foresee: a generated column or a policy
        # reading the column, a partition's own column, ...
        detail = f" ({exc.diag.message_detail.rstrip('.')})" if exc.diag.message_detail else ""
        raise ConfigError(
            f"option schemaEvolution={options.schema_evolution.value}: PostgreSQL refused "
            f"{_statement(table, evolution).as_string(conn)}: {exc.diag.message_primary}"
            f"{detail}. Nothing was changed or written. Fix: change table {table} by hand "
            "so that the DataFrame fits it, or cast the DataFrame's columns to its types",
            table=str(table),
        ) from None
    if evolution.changes:  # else another session made them meanwhile
        log.info("sqlsink: table %s: %s", table, "; ".join(_described(evolution)))


def _described(evolution: Evolution) -> list[str]:
    what = [f"added column {name!r} ({type_})" for name, type_ in evolution.additions]
    return what + [
        f"widened column {w.column!r} from {w.old_type} to {w.new_type}"
        for w in evolution.widenings
    ]


def _still_needed(conn: Connection, table: TableName, evolution: Evolution) -> Evolution:
    """The changes still to make once the table is locked: a widening another session
    made meanwhile (to this type or a wider one) is not made again, which could narrow
    the column back (ADD COLUMN IF NOT EXISTS needs no such care)."""
    if not evolution.widenings:
        return evolution
    rows = conn.execute(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attname = ANY(%s) AND NOT attisdropped",
        (quoted(conn, table), [w.column for w in evolution.widenings]),
    ).fetchall()
    now = {str(name): str(type_) for name, type_ in rows}
    kept = tuple(w for w in evolution.widenings if now.get(w.column) == w.old_type)
    return replace(evolution, widenings=kept)


def _lock_error(
    conn: Connection, table: TableName, what: list[str], timeout_s: float
) -> TransientError:
    holders = relation_lock_holders(conn, [quoted(conn, table)])
    prepared = [h.gid for h in holders if h.gid is not None]
    fix = (
        "let that transaction finish, or end it (SELECT pg_terminate_backend(pid)), "
        "then start again"
    )
    if prepared:
        fix = "a prepared transaction holds it: " + _recover_advice(prepared)
    return TransientError(
        f"schema evolution of table {table} ({'; '.join(what)}) waited {timeout_s:g} s for "
        f"the table's lock, held by {describe_holders(holders)}. Nothing was changed or "
        f"written. Fix: {fix}",
        table=str(table),
        prepared=prepared,
    )


def _recover_advice(prepared: list[str]) -> str:
    from sqlsink.core.gid import Gid

    ours = [gid for text in prepared if (gid := Gid.parse(text)) is not None]
    if not ours:
        return "COMMIT PREPARED or ROLLBACK PREPARED it (it is not a sink's), then start again"
    first = ours[0]
    return (
        "sqlsink recover resolves those a stopped run left once the run is no longer live "
        f"(runTimeout), or at once with sqlsink recover --sink-id {first.sink_id} --force "
        f"--run-id {first.run_id} when you know run {first.run_id} is dead (a running "
        "query's own are finished by its commit); then start again"
    )
