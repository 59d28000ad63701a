"""The target table: created when asked (SQLAlchemy DDL), then matched to the DataFrame."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlsink.errors import ConfigError, TransientError
from sqlsink.options import Mode, SchemaEvolution, SinkOptions
from sqlsink.postgres.catalog import TargetColumn, table_columns, unique_keys
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.planning_errors import check_privileges, check_target_kind
from sqlsink.postgres.upsert import BOOL_OID, UpsertPlan
from sqlsink.tablename import TableName

if TYPE_CHECKING:
    import pyarrow as pa
    import sqlalchemy as sa

    from sqlsink.postgres.evolution import ColumnType, Evolution


@dataclass(frozen=True)
class TargetPlan:
    """Where each DataFrame column goes; pickled into the writer for the executors."""

    table: TableName
    columns: tuple[TargetColumn, ...]  # aligned with the DataFrame's fields
    upsert: UpsertPlan | None = None
    # the table's key, as far as the DataFrame writes it: the upsert's key, else the
    # primary key (() when there is none): the foreachBatch writer range-partitions by it
    key: tuple[str, ...] = ()


def create_table(conn: Connection, table: TableName, columns: Sequence[sa.Column[object]]) -> None:
    """CREATE TABLE IF NOT EXISTS from SQLAlchemy columns, on the sink's own connection."""
    import sqlalchemy as sa  # here: imported by DDL only (a commit never needs its ~0.1 s)
    from sqlalchemy.dialects import postgresql

    metadata = sa.MetaData(schema=table.schema)
    sa_table = sa.Table(table.name, metadata, *columns)
    ddl = sa.schema.CreateTable(sa_table, if_not_exists=True)
    statement = str(ddl.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
    conn.execute(statement.encode())


def plan_target(
    conn: Connection,
    options: SinkOptions,
    field_names: Sequence[str],
    create_columns: Sequence[sa.Column[object]] | None,
    arrow_schema: pa.Schema | None = None,
    column_type: ColumnType | None = None,
    *,
    before_changes: Callable[[Evolution], None] | None = None,
    replanned: bool = False,
) -> TargetPlan:
    """Match the DataFrame's columns to the table's, creating the table if asked and missing.

    Every problem (columns, keys, and, given the DataFrame's ``arrow_schema``, each matched
    (DataFrame column, table column) pair the encoder cannot write) is reported at once,
    before anything is written. With ``schemaEvolution`` (``column_type`` gives a DataFrame
    column's type, as createTable would create it) the table is first matched as it will
    be after its changes; when nothing is refused (``before_changes``, the caller's other
    refusals, given the changes, raises none either), the changes are made
    (``evolution.apply_evolution``) and the table planned again, which finds them.
    """
    table = options.table
    columns = table_columns(conn, table)
    if not columns and create_columns is not None:
        create_table(conn, table, create_columns)
        columns = table_columns(conn, table)
    if not columns:
        raise ConfigError(
            f"table {table} does not exist (or this role cannot see it): create it, "
            "or set the option createTable=true to create it from the DataFrame's schema"
        )
    check_target_kind(conn, table, upsert=options.mode is Mode.UPSERT)
    existing = {c.name for c in columns}  # before evolution: the columns privileges name
    evolution = None
    if options.schema_evolution is not SchemaEvolution.NONE and column_type is not None:
        from sqlsink.postgres.evolution import plan_evolution

        evolution = plan_evolution(conn, options, columns, field_names, arrow_schema, column_type)
        columns = list(evolution.columns)
    unaddable = evolution.unaddable if evolution is not None else ()
    matched, pairs, problems = _match(conn, columns, field_names, options, unaddable)
    upsert = None
    if options.mode is Mode.UPSERT:
        upsert, more = _plan_upsert(conn, options, [c.name for c in matched])
        problems += more
    key = _ordering_key(conn, options, upsert, pairs)
    if arrow_schema is not None:
        problems += _type_problems(arrow_schema, pairs)
    if evolution is not None:
        problems += evolution.problems
    if problems:
        # each type problem names its own fix; the generic one is for the others
        generic = any("Fix:" not in problem for problem in problems)
        raise ConfigError(
            f"the DataFrame does not fit table {table}: "
            + "; ".join(problems)
            + (
                ". Fix: select/rename the DataFrame's columns to the table's, or alter the table"
                if generic
                else ""
            )
        )
    written = [c.name for c in matched if c.name in existing and c.name != options.delete_column]
    keys = upsert.keys if upsert is not None else ()
    delete = options.delete_column is not None
    check_privileges(conn, table, options.mode.value, written, keys, delete)
    if evolution is not None and evolution.changes:
        if replanned:  # changed by someone else between the ALTER and its re-planning
            raise TransientError(
                f"table {table} changed while the sink evolved it; start again",
                table=str(table),
            )
        from sqlsink.postgres.evolution import apply_evolution

        if before_changes is not None:
            before_changes(evolution)
        apply_evolution(conn, options, evolution)
        return plan_target(
            conn, options, field_names, None, arrow_schema, column_type, replanned=True
        )
    return TargetPlan(table, tuple(matched), upsert, key)


def _match(
    conn: Connection,
    columns: Sequence[TargetColumn],
    field_names: Sequence[str],
    options: SinkOptions,
    unaddable: Sequence[str] = (),
) -> tuple[list[TargetColumn], list[tuple[str, TargetColumn]], list[str]]:
    """The table column of each DataFrame column (exact name, else case-insensitive), the
    (DataFrame name, column) pairs written, and every problem (but for the ``unaddable``
    columns, whose own problem schema evolution reports)."""
    table, delete_column = options.table, options.delete_column
    by_name = {c.name: c for c in columns}
    by_lower = {c.name.lower(): c for c in columns}
    matched: list[TargetColumn] = []
    problems: list[str] = []
    pairs: list[tuple[str, TargetColumn]] = []
    for name in field_names:
        if delete_column is not None and name == delete_column:
            matched.append(TargetColumn(name, BOOL_OID, "boolean", False, False))
            continue
        column = by_name.get(name) or by_lower.get(name.lower())
        if column is None and name in unaddable:
            continue
        if column is None:
            problems.append(f"column {name!r} of the DataFrame is not in table {table}")
        else:
            matched.append(column)
            pairs.append((name, column))
    written = {c.name for c in matched}
    for column in columns:
        if column.name not in written and column.not_null and not column.has_default:
            problem = (
                f"column {column.name!r} of table {table} is NOT NULL without a default, "
                "and the DataFrame has no such column"
            )
            if options.schema_evolution is not SchemaEvolution.NONE:  # the statement too
                from sqlsink.postgres.evolution import drop_not_null

                fix = drop_not_null(conn, table, column.name)
                problem += f". Fix: {fix} (its rows are then written NULL), or give it a value"
            problems.append(problem)
    if delete_column is not None and delete_column not in field_names:
        problems.append(f"deleteColumn {delete_column!r} is not a column of the DataFrame")
    return matched, pairs, problems


def _ordering_key(
    conn: Connection,
    options: SinkOptions,
    upsert: UpsertPlan | None,
    pairs: list[tuple[str, TargetColumn]],
) -> tuple[str, ...]:
    """The table's key in the DataFrame's spelling: the upsert's key, else the primary
    key; () unless the DataFrame writes all of it."""
    if options.mode is Mode.UPSERT:
        key = upsert.keys if upsert is not None else ()
    else:
        primary = [cols for is_primary, cols in unique_keys(conn, options.table) if is_primary]
        key = primary[0] if primary else ()
    spelled = {column.name: name for name, column in pairs}
    if not key or not all(k in spelled for k in key):
        return ()
    return tuple(spelled[k] for k in key)


def _type_problems(arrow_schema: pa.Schema, pairs: list[tuple[str, TargetColumn]]) -> list[str]:
    """Each (DataFrame column, table column) pair the encoder cannot write, with its fix."""
    from sqlsink.postgres.encoding import build_encoder

    problems = []
    for name, column in pairs:
        try:
            build_encoder([arrow_schema.field(name)], [column])
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def _plan_upsert(
    conn: Connection, options: SinkOptions, written: list[str]
) -> tuple[UpsertPlan | None, list[str]]:
    table = options.table
    keys_found = unique_keys(conn, table)
    keys = options.key_columns
    if not keys:
        primary = [cols for is_primary, cols in keys_found if is_primary]
        if not primary:
            return None, [
                f"mode=upsert needs a key: table {table} has no primary key; set the option "
                "keyColumns (with a unique index on those columns)"
            ]
        keys = primary[0]
    problems = [
        f"key column {k!r} is not among the DataFrame's columns" for k in keys if k not in written
    ]
    if not any(set(cols) == set(keys) for _, cols in keys_found):
        wanted = ", ".join(keys)
        problems.append(
            f"no unique index of table {table} is on exactly ({wanted}), which upsert's "
            f"ON CONFLICT needs: CREATE UNIQUE INDEX ON {table} ({wanted})"
        )
    return UpsertPlan(tuple(keys), options.delete_column), problems
