"""What ``sqlsink status`` and ``sqlsink check`` show: the sink's views, what they hide."""

from __future__ import annotations

from dataclasses import dataclass

from sqlsink.core.admin import HiddenBatch
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.schema import installed_version
from sqlsink.postgres.views.definition import SCHEMA_VERSION, parse_comment
from sqlsink.tablename import TableName

# -- what status and check show -------------------------------------------------------------


@dataclass(frozen=True)
class ViewInfo:
    """A consistent view of some sink in this database, found by its comment."""

    view: TableName
    sink_id: str
    table: str  # quoted
    owner: str
    format: int


def find_views(conn: Connection, sink_id: str | None = None) -> list[ViewInfo]:
    """Every sqlsink view of the database (of one sink), ordered by name."""
    rows = conn.execute(
        "SELECT n.nspname::text, c.relname::text, pg_get_userbyid(c.relowner)::text, "
        "       obj_description(c.oid, 'pg_class') "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'v' AND obj_description(c.oid, 'pg_class') "
        "      LIKE 'sqlsink consistent view (format %%' "
        "ORDER BY 1, 2"
    ).fetchall()
    found = []
    for schema, name, owner, comment in rows:
        mark = parse_comment(comment)
        if mark is not None and (sink_id is None or mark.sink_id == sink_id):
            found.append(
                ViewInfo(TableName(schema, name), mark.sink_id, mark.table, owner, mark.format)
            )
    return found


def hidden_batches(conn: Connection, sink_id: str) -> list[HiddenBatch]:
    """What a consistent view of the sink hides right now (what a reader of the bare
    table sees as part of a batch): committed partitions of batches whose markers are
    still there. Markers written before schema version 5 hide nothing."""
    if installed_version(conn) < SCHEMA_VERSION:
        return []
    rows = conn.execute(
        "SELECT m.batch_id, count(*), coalesce(sum(m.rows), 0), cardinality(d.gids), "
        "       d.batch_id IS NULL OR d.completed_at IS NOT NULL "
        "FROM sqlsink.markers m LEFT JOIN sqlsink.decisions d "
        "  ON d.sink_id = m.sink_id AND d.batch_id = m.batch_id "
        "WHERE m.sink_id = %s AND m.xid IS NOT NULL "
        "GROUP BY m.batch_id, d.batch_id, d.gids, d.completed_at ORDER BY m.batch_id",
        (sink_id,),
    ).fetchall()
    return [
        HiddenBatch(int(b), int(n), int(r), None if of is None else int(of), bool(done))
        for b, n, r, of, done in rows
    ]
