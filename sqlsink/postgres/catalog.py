"""What the sink needs to know about a target table: its columns and their types."""

from __future__ import annotations

from dataclasses import dataclass

from sqlsink.postgres.connection import Connection
from sqlsink.tablename import TableName


@dataclass(frozen=True)
class TargetColumn:
    """One column of the target table, as the catalog describes it."""

    name: str
    type_oid: int  # pg_type oid of the column (for domains: of the base type)
    type_name: str  # format_type(), e.g. 'numeric(10,2)', 'timestamp with time zone', 'bigint[]'
    not_null: bool
    has_default: bool


_COLUMNS = """
SELECT a.attname,
       CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END,
       format_type(a.atttypid, a.atttypmod),
       a.attnotnull,
       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> ''
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def table_columns(conn: Connection, table: TableName) -> list[TargetColumn]:
    """The table's columns in order; an empty list when the table does not exist."""
    rows = conn.execute(_COLUMNS, (table.schema, table.name)).fetchall()
    return [
        TargetColumn(name, oid, type_name, not_null, has_default)
        for name, oid, type_name, not_null, has_default in rows
    ]


_UNIQUE_KEYS = """
SELECT i.indisprimary, array_agg(a.attname::text ORDER BY k.ord)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE n.nspname = %s AND c.relname = %s
  AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid, i.indisprimary
ORDER BY i.indisprimary DESC
"""


def unique_keys(conn: Connection, table: TableName) -> list[tuple[bool, tuple[str, ...]]]:
    """(is primary key, columns) of each plain unique index, the primary key first."""
    rows = conn.execute(_UNIQUE_KEYS, (table.schema, table.name)).fetchall()
    return [(bool(primary), tuple(columns)) for primary, columns in rows]
