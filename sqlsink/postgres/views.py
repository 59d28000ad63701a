"""The consistent view (option ``consistentView``; docs/DESIGN.md invariant 13).

Readers of the bare table may see a batch committed in part: the driver commits its
partitions one ``COMMIT PREPARED`` after the other, and a driver that dies in that
loop leaves it so until the next run or ``sqlsink recover``. The view shows whole
batches only. Every partition transaction inserts its marker row in the same
transaction as its rows, and the marker records that transaction's id (``xid``,
schema version 5), which is also the ``xmin`` of every row it inserted. A batch's
markers are deleted in one statement once every partition is committed
(``commit_log.mark_complete``). So, in any one snapshot: a committed partition of an
incomplete batch has a visible marker; a complete batch has none; a prepared one is
invisible anyway. The view hides the rows whose ``xmin`` is the ``xid`` of a visible
marker of its sink::

    SELECT <columns> FROM (
        SELECT <columns>, true AS "sqlsink: nothing in flight", NULL::xid AS "sqlsink: row xid"
        FROM <table>
        UNION ALL
        SELECT <columns>, false, xmin FROM <table>
    ) AS sqlsink_rows
    WHERE "sqlsink: nothing in flight" = NOT EXISTS (<a visible marker of the sink>)
      AND ("sqlsink: nothing in flight"
           OR "sqlsink: row xid" <> ALL (ARRAY(<the xids of the sink's visible markers>)))

The planner folds the flag into each branch: the first becomes the bare table's own
plan under a one-time filter (an InitPlan: one probe of ``sqlsink.markers`` per
query), the second the table filtered by the xids, under the opposite filter; only
one of them runs. The branches carry no WHERE of their own, so PostgreSQL flattens
the UNION ALL (no Subquery Scan per row) and can aggregate it in parallel; quals
such as a primary-key lookup are pushed into both. Measured in
``benchmarks/view_cost.py``.

The view is the sink's: its comment names the sink and the table (``comment_text``).
The committer creates it when missing and replaces it when its columns are out of
date, under the sink lock before each decision (``ConsistentView.keep``); any other
object of that name is refused. Readers need SELECT on the view only: a view reads
its tables with its owner's rights.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from sqlsink.errors import ConfigError
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.catalog import TableName
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.schema import installed_version

log = logging.getLogger("sqlsink")

FORMAT = 1  # of the definition: a view of an older format is replaced
SCHEMA_VERSION = 5  # the commit log's version whose markers record their xid
FLAG = "sqlsink: nothing in flight"
ROW_XID = "sqlsink: row xid"
REPLACE_LOCK_TIMEOUT_S = 2.0  # readers of the view hold it: a replacement waits this long
_COMMENT = re.compile(
    r"^sqlsink consistent view \(format (?P<format>\d+)\) of sink (?P<sink>[A-Za-z0-9-]+) "
    r'over table (?P<table>"(?:[^"]|"")*"\."(?:[^"]|"")*")'
)
_KINDS = {
    "r": "table",
    "p": "partitioned table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
    "S": "sequence",
    "i": "index",
    "I": "partitioned index",
    "c": "composite type",
    "t": "TOAST table",
}


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
    """The view's statement (module docstring); every name quoted, the sink a literal."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    return sql.SQL(
        "CREATE {or_replace}VIEW {view} AS SELECT {cols} FROM ("
        "SELECT {cols}, true AS {flag}, NULL::xid AS {row_xid} FROM {table} "
        "UNION ALL "
        "SELECT {cols}, false, xmin FROM {table}"
        ") AS sqlsink_rows "
        "WHERE {flag} = NOT EXISTS (SELECT FROM sqlsink.markers WHERE sink_id = {sink}) "
        "AND ({flag} OR {row_xid} <> ALL (ARRAY("
        "SELECT xid FROM sqlsink.markers WHERE sink_id = {sink} AND xid IS NOT NULL)))"
    ).format(
        or_replace=sql.SQL("OR REPLACE " if replace else ""),
        view=view.identifier(),
        cols=cols,
        flag=sql.Identifier(FLAG),
        row_xid=sql.Identifier(ROW_XID),
        table=table.identifier(),
        sink=sql.Literal(sink_id),
    )


# -- what is there -------------------------------------------------------------------------


_STATE = """
SELECT current_user::text,
       has_table_privilege('sqlsink.markers', 'DELETE'),
       EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'sqlsink.markers'::regclass
               AND attname = 'xid' AND NOT attisdropped),
       ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = t.oid AND attnum > 0
             AND NOT attisdropped ORDER BY attnum),
       v.relkind::text, pg_get_userbyid(v.relowner)::text, obj_description(v.oid, 'pg_class'),
       ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = v.oid AND attnum > 0
             AND NOT attisdropped ORDER BY attnum),
       EXISTS (SELECT FROM sqlsink.markers m WHERE m.sink_id = %(sink)s AND NOT EXISTS (
                   SELECT FROM sqlsink.decisions d WHERE d.sink_id = m.sink_id
                   AND d.batch_id = m.batch_id AND d.completed_at IS NULL))
FROM (SELECT) AS one
LEFT JOIN (pg_class t JOIN pg_namespace tn ON tn.oid = t.relnamespace)
       ON tn.nspname = %(tschema)s AND t.relname = %(tname)s AND t.relkind IN ('r', 'p')
LEFT JOIN (pg_class v JOIN pg_namespace vn ON vn.oid = v.relnamespace)
       ON vn.nspname = %(vschema)s AND v.relname = %(vname)s
"""


@dataclass(frozen=True)
class State:
    """The view's name, the table and the sink's markers, as the server has them now."""

    role: str
    may_delete_markers: bool
    markers_have_xid: bool  # the commit log is at version 5 or later
    table_columns: tuple[str, ...]  # () when the table does not exist
    kind: str | None  # relkind of what bears the view's name; None: nothing
    owner: str | None
    comment: str | None
    view_columns: tuple[str, ...]
    stale_markers: bool  # markers of the sink whose batch is not incomplete

    @property
    def mark(self) -> ViewMark | None:
        return parse_comment(self.comment) if self.kind == "v" else None


def read_state(conn: Connection, view: TableName, table: TableName, sink_id: str) -> State:
    row = conn.execute(
        _STATE,
        {
            "sink": sink_id,
            "tschema": table.schema,
            "tname": table.name,
            "vschema": view.schema,
            "vname": view.name,
        },
    ).fetchone()
    assert row is not None
    role, may_delete, has_xid, table_cols, kind, owner, comment, view_cols, stale = row
    return State(
        str(role),
        bool(may_delete),
        bool(has_xid),
        tuple(table_cols),
        None if kind is None else str(kind),
        None if owner is None else str(owner),
        None if comment is None else str(comment),
        tuple(view_cols or ()),
        bool(stale),
    )


def refusal(state: State, view: TableName, table: TableName, sink_id: str | None) -> str | None:
    """Why the sink cannot keep this view (None: it can); ``sink_id`` None: not known yet
    (a stream whose id comes from its tasks), another sink's view then passes here."""
    option = f"option consistentView={view}"
    if state.kind is not None:
        mark = state.mark
        what = f"{view} is a {_KINDS.get(state.kind, 'relation')} owned by {state.owner}"
        if mark is None:
            return (
                f"{option}: {what}, not a view the sink made (its comment does not name a "
                "sqlsink sink). The sink replaces only its own views. Fix: name another "
                f"view in consistentView, or drop {view} if it is unused"
            )
        if sink_id is not None and mark.sink_id != sink_id:
            return (
                f"{option}: {what}: the consistent view of sink {mark.sink_id} over table "
                f"{mark.table}, not of this sink ({sink_id}). Two sinks cannot share a view "
                f"(each hides its own batches only). Fix: name another view, or, if sink "
                f"{mark.sink_id} is retired, DROP VIEW {view} (this sink then creates its own)"
            )
        if mark.table != quoted(table):
            return (
                f"{option}: {what}: this sink's view of table {mark.table}, not of "
                f"{quoted(table)}. Fix: give each table its own view name, or DROP VIEW "
                f"{view} if the old table is no longer written"
            )
    if not state.table_columns:
        return f"{option}: the table {table} does not exist"
    if {FLAG, ROW_XID} & set(state.table_columns):
        return f"{option}: the table {table} has a column named {FLAG!r} or {ROW_XID!r}"
    if not state.may_delete_markers:
        return (
            f"{option}: role {state.role} may not DELETE FROM sqlsink.markers, so the "
            "markers of complete batches would stay and the view would hide those batches "
            "for good. Nothing was written. Fix: GRANT DELETE ON sqlsink.markers TO "
            f"{state.role} (or run the sink as the owner of schema sqlsink)"
        )
    if not state.markers_have_xid:
        return (
            f"{option}: the commit log is below version {SCHEMA_VERSION} (its markers do "
            "not record their transaction): restart the query, whose planning upgrades it"
        )
    return None


# -- keeping it right (the committer, under the sink lock) ---------------------------------


def keep_view(conn: Connection, view: TableName, table: TableName, sink_id: str) -> str:
    """Create, replace or keep the view; refuse another's. Returns what was done:
    "created", "replaced", "kept" (up to date), or "stale" (out of date, and replacing
    it failed: logged; it still shows whole batches, with its old columns)."""
    state = read_state(conn, view, table, sink_id)
    problem = refusal(state, view, table, sink_id)
    if problem is not None:
        raise ConfigError(problem, view=str(view), sink_id=sink_id)
    if state.kind is None:
        done = _create(conn, state, view, table, sink_id)
    elif state.view_columns != state.table_columns or (state.mark and state.mark.format != FORMAT):
        done = _replace(conn, state, view, table, sink_id)
    else:
        done = "kept"
    if state.stale_markers:
        delete_stale_markers(conn, sink_id)
    return done


def _create(conn: Connection, state: State, view: TableName, table: TableName, sink_id: str) -> str:
    try:
        with conn.transaction():  # with its comment, or not at all: the comment makes it ours
            conn.execute(definition(view, table, state.table_columns, sink_id, replace=False))
            _comment(conn, view, sink_id, table)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(
            f"option consistentView={view}: role {state.role} cannot create the view "
            f"({exc.diag.message_primary}). Nothing was written. Fix: GRANT CREATE ON SCHEMA "
            f"{sql_name(view.schema)} TO {state.role}, or name a view in a schema this role "
            "may create in (readers then need USAGE on that schema and SELECT on the view)",
            view=str(view),
        ) from None
    except (psycopg.errors.DuplicateTable, psycopg.errors.DuplicateObject) as exc:
        raise ConfigError(  # made meanwhile by someone else, or a type of that name
            f"option consistentView={view}: cannot create the view: "
            f"{exc.diag.message_primary}. Nothing was written. Fix: name another view",
            view=str(view),
        ) from None
    log.info("sqlsink %s: created the consistent view %s of table %s", sink_id, view, table)
    return "created"


def _replace(
    conn: Connection, state: State, view: TableName, table: TableName, sink_id: str
) -> str:
    """Only ever CREATE OR REPLACE (never DROP): readers' grants stay, and a view that
    cannot be replaced still shows whole batches, with its old columns."""
    try:
        with conn.transaction():
            timeout = f"{int(REPLACE_LOCK_TIMEOUT_S * 1000)}ms"
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
            conn.execute(definition(view, table, state.table_columns, sink_id, replace=True))
            _comment(conn, view, sink_id, table)
    except psycopg.errors.LockNotAvailable:
        why = f"readers held it for {REPLACE_LOCK_TIMEOUT_S:g} s; tried again at the next batch"
    except psycopg.Error as exc:  # a renamed column, another owner: only a person can fix it
        why = (
            f"{exc.diag.message_primary}; to get the new columns, DROP VIEW {view} (the sink "
            "creates it again at its next batch: grant SELECT on it again)"
        )
    else:
        log.info(
            "sqlsink %s: replaced the consistent view %s (columns of %s)", sink_id, view, table
        )
        return "replaced"
    log.warning(
        "sqlsink %s: the consistent view %s has columns %s, the table %s has %s, and it "
        "could not be replaced (%s). It still shows whole batches only",
        sink_id,
        view,
        ", ".join(state.view_columns),
        table,
        ", ".join(state.table_columns),
        why,
    )
    return "stale"


def _comment(conn: Connection, view: TableName, sink_id: str, table: TableName) -> None:
    conn.execute(
        sql.SQL("COMMENT ON VIEW {} IS {}").format(
            view.identifier(), sql.Literal(comment_text(sink_id, table))
        )
    )


def delete_stale_markers(conn: Connection, sink_id: str) -> int:
    """Markers of the sink whose batch is not incomplete (complete, or its decision pruned
    or settled by hand): kept by a role without DELETE before, they would hide those
    batches from the view. Under the sink lock: a prepared marker is invisible here."""
    cur = conn.execute(
        "DELETE FROM sqlsink.markers m WHERE m.sink_id = %(sink)s AND NOT EXISTS ("
        "  SELECT FROM sqlsink.decisions d WHERE d.sink_id = m.sink_id "
        "  AND d.batch_id = m.batch_id AND d.completed_at IS NULL)",
        {"sink": sink_id},
    )
    return cur.rowcount


def sql_name(name: str) -> str:
    """An identifier as SQL text, quoted only when it needs to be (for messages)."""
    plain = re.fullmatch(r"[a-z_][a-z0-9_$]*", name) is not None
    return name if plain else '"' + name.replace('"', '""') + '"'


class ConsistentView:
    """``core.backend.ViewKeeper`` on the committer's session."""

    def __init__(self, backend: PostgresBackend, view: TableName, table: TableName) -> None:
        self.backend = backend
        self.view = view
        self.table = table

    def keep(self, sink_id: str) -> None:
        with self.backend.standby.bounded(f"keeping the consistent view {self.view}", sink=sink_id):
            keep_view(self.backend.conn, self.view, self.table, sink_id)


def check_before_writing(
    conn: Connection, view: TableName, table: TableName, sink_id: str | None
) -> None:
    """At planning, before any task writes: the refusals ``keep_view`` would make."""
    state = read_state(conn, view, table, sink_id or "")
    problem = refusal(state, view, table, sink_id)
    if problem is not None:
        raise ConfigError(problem, view=str(view))


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


@dataclass(frozen=True)
class HiddenBatch:
    """A batch with committed partitions that the sink's consistent views hide now."""

    batch_id: int
    partitions: int  # committed partitions hidden (their markers are visible)
    rows: int
    of_partitions: int | None  # the partitions its decision names (None: no decision)
    complete: bool  # decided complete (or its decision is gone), its markers kept


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
