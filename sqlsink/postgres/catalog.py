"""What the sink needs to know about a target table: its columns and their types."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from sqlsink.postgres.connection import Connection


@dataclass(frozen=True)
class TargetColumn:
    """One column of the target table, as the catalog describes it."""

    name: str
    type_oid: int  # pg_type oid of the column (for domains: of the base type)
    type_name: str  # format_type(), e.g. 'numeric(10,2)', 'timestamp with time zone', 'bigint[]'
    not_null: bool
    has_default: bool


@dataclass(frozen=True)
class TableName:
    """A schema-qualified table name; rendered quoted, never interpolated raw."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> TableName:
        """'public.events', 'events' or '"My Schema"."My Table"' (quotes keep case and dots);
        an unqualified name is in ``default_schema``."""
        parts: list[str] = []
        current, quoted, i = "", False, 0
        while i < len(text):
            ch = text[i]
            if quoted:
                if ch == '"' and text[i + 1 : i + 2] == '"':
                    current += '"'
                    i += 1
                elif ch == '"':
                    quoted = False
                else:
                    current += ch
            elif ch == '"':
                quoted = True
            elif ch == ".":
                parts.append(current)
                current = ""
            else:
                current += ch.lower()
            i += 1
        parts.append(current)
        if quoted or len(parts) > 2 or any(not part for part in parts):
            raise ValueError(
                f"invalid table name {text!r}: use 'table', 'schema.table' or "
                '\'"Schema"."Table"\' for names with capitals, dots or quotes'
            )
        return cls(default_schema, parts[0]) if len(parts) == 1 else cls(parts[0], parts[1])

    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


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
