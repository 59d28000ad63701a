"""The view's statement and its comment (the mark that makes a view the sink's).

Format 2 (the module docstring of ``sqlsink.postgres.views`` says why)::

    SELECT <columns> FROM <table>
    WHERE NOT EXISTS (SELECT FROM sqlsink.markers WHERE sink_id = <sink>)
       OR xmin <> ALL (ARRAY(SELECT xid FROM sqlsink.markers
                             WHERE sink_id = <sink> AND xid IS NOT NULL))

Format 1 was a ``UNION ALL`` of the table under a one-time filter and the table
filtered by the xids; ``keep_view`` replaces a view of an older format in place.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from sqlsink.tablename import TableName

FORMAT = 2  # of the definition: a view of an older format is replaced
SCHEMA_VERSION = 5  # the commit log's version whose markers record their xid
_COMMENT = re.compile(
    r"^sqlsink consistent view \(format (?P<format>\d+)\) of sink (?P<sink>[A-Za-z0-9-]+) "
    r'over table (?P<table>"(?:[^"]|"")*"\."(?:[^"]|"")*")'
)


def quoted(table: TableName) -> str:
    """``"schema"."name"``: how the comment names the table."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in (table.schema, table.name))


def comment_text(sink_id: str, table: TableName) -> str:
    """The comment that makes a view the sink's (``parse_comment`` reads it back)."""
    return (
        f"sqlsink consistent view (format {FORMAT}) of sink {sink_id} over table "
        f"{quoted(table)}: the table's rows of complete batches only (option "
        "consistentView). Created and replaced by the sink; do not edit it"
    )


@dataclass(frozen=True)
class ViewMark:
    """What a sqlsink view's comment says."""

    format: int
    sink_id: str
    table: str  # quoted, as ``quoted``


def parse_comment(text: str | None) -> ViewMark | None:
    match = _COMMENT.match(text or "")
    if match is None:
        return None
    return ViewMark(int(match["format"]), match["sink"], match["table"])


def definition(
    view: TableName, table: TableName, columns: Sequence[str], sink_id: str, *, replace: bool
) -> sql.Composed:
    """The view's statement (format 2, above); every name quoted, the sink a literal.

    Both subqueries are uncorrelated: each becomes an InitPlan, run at most once per
    query, in the query's snapshot, by the leader of a parallel plan. The scan's filter
    is ``(NOT $0) OR xmin <> ALL ($1)``: with nothing in flight ``$0`` is false and the
    second operand (and its InitPlan) is never evaluated."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    return sql.SQL(
        "CREATE {or_replace}VIEW {view} AS SELECT {cols} FROM {table} "
        "WHERE NOT EXISTS (SELECT FROM sqlsink.markers WHERE sink_id = {sink}) "
        "OR xmin <> ALL (ARRAY("
        "SELECT xid FROM sqlsink.markers WHERE sink_id = {sink} AND xid IS NOT NULL))"
    ).format(
        or_replace=sql.SQL("OR REPLACE " if replace else ""),
        view=view.identifier(),
        cols=cols,
        table=table.identifier(),
        sink=sql.Literal(sink_id),
    )
