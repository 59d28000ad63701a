"""Upsert and replace next to the sink's consistent views (docs/DESIGN.md invariant 13).

A batch of mode upsert or replace deletes rows and replaces them by new versions. Once
one of its partitions is committed, the old versions are gone, and the view hides the
new ones (their transaction's marker is visible) until the batch is complete: a reader
of the view sees those keys in no version at all. The option ``consistentView`` is
refused with those modes (``SinkOptions.parse``), per DataFrame. The checks here refuse
the same where one DataFrame cannot tell: a write of mode upsert or replace into a
table that a view of the same sink shows, whether the view was made by an earlier
batch, by the data source, or is given by another part of the same foreachBatch batch
(``sqlsink.spark.plan.check_part``). A view over a table shows its inheritance children
and partitions too: a table counts as shown when it is the view's table, one of its
descendants or one of its ancestors (``pg_inherits``).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlsink.errors import ConfigError
from sqlsink.options import Mode
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.views.definition import quoted
from sqlsink.postgres.views.status import ViewInfo, find_views
from sqlsink.tablename import TableName

_RELATED = """
WITH RECURSIVE target AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s),
down(oid) AS (SELECT oid FROM target
              UNION SELECT i.inhrelid FROM pg_inherits i JOIN down ON i.inhparent = down.oid),
up(oid) AS (SELECT oid FROM target
            UNION SELECT i.inhparent FROM pg_inherits i JOIN up ON i.inhrelid = up.oid)
SELECT n.nspname::text, c.relname::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid IN (SELECT oid FROM down UNION SELECT oid FROM up)
"""


def sharing_rows(conn: Connection, table: TableName) -> set[str]:
    """The table, its descendants and its ancestors, quoted as ``definition.quoted``: the
    tables whose views show rows of ``table``, or whose rows a view of ``table`` shows."""
    rows = conn.execute(_RELATED, (table.schema, table.name)).fetchall()
    return {quoted(TableName(str(schema), str(name))) for schema, name in rows} | {quoted(table)}


def rewrite_refusal(where: str, table: TableName, mode: Mode, view: str, shown: str) -> str:
    """The refusal of a write of ``mode`` into ``table`` that the view ``view`` (of the
    table ``shown``) shows: the same reason as the option's with that mode."""
    also = "" if shown == quoted(table) else f" (its table {shown} shares rows with {table})"
    return (
        f"{where}: table {table} cannot be written with mode={mode.value}: the sink's "
        f"consistent view {view} shows it{also}. A batch of that mode replaces and deletes "
        "rows, and once one of its transactions is committed the rows it replaced or "
        "deleted are gone, so no view can show the table as it was before the batch while "
        f"the rest commits: readers of {view} would see rows vanish. Fix: write {table} "
        f"with mode=append only, or, if no reader uses {view} any more, DROP VIEW {view} "
        "and give it no longer (view=..., option consistentView)"
    )


def check_rewrite(
    conn: Connection, table: TableName, mode: Mode, sink_id: str | None, where: str
) -> None:
    """At planning, before the job: refuse an upsert or replace into a table that a
    consistent view of the sink shows (views made by earlier batches, or by the data
    source). ``sink_id`` None: not known before the tasks run (a stream without sinkId
    whose checkpoint is not local): nothing to look up."""
    if mode is Mode.APPEND or not sink_id:
        return
    found = shown_by(conn, table, find_views(conn, sink_id))
    if found is not None:
        text = rewrite_refusal(where, table, mode, str(found.view), found.table)
        raise ConfigError(text + ". Nothing was written", sink_id=sink_id, view=str(found.view))


def shown_by(conn: Connection, table: TableName, views: Iterable[ViewInfo]) -> ViewInfo | None:
    """The first of ``views`` that shows rows of ``table`` (None: none does)."""
    views = list(views)
    if not views:
        return None
    related = sharing_rows(conn, table)
    return next((v for v in views if v.table in related), None)
