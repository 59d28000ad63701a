"""Keeping the view right: what is there, what the sink refuses, create or replace (the
committer, under the sink lock, before each decision), and the check at planning."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from sqlsink.errors import ConfigError
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.views.definition import (
    FORMAT,
    SCHEMA_VERSION,
    ViewMark,
    comment_text,
    definition,
    parse_comment,
    quoted,
)
from sqlsink.postgres.views.triggers import INSERT_TRIGGERS, Trigger
from sqlsink.postgres.views.triggers import refusal as trigger_refusal
from sqlsink.tablename import TableName

log = logging.getLogger("sqlsink")

REPLACE_LOCK_TIMEOUT_S = 2.0  # readers of the view hold it: a replacement waits this long
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


# -- what is there -------------------------------------------------------------------------


_STATE = (
    """
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
                   AND d.batch_id = m.batch_id AND d.completed_at IS NULL)),
       (SELECT coalesce(json_agg(found ORDER BY found.relation, found.name), '[]')
        FROM ("""
    + INSERT_TRIGGERS
    + """) AS found)
FROM (SELECT) AS one
LEFT JOIN (pg_class t JOIN pg_namespace tn ON tn.oid = t.relnamespace)
       ON tn.nspname = %(tschema)s AND t.relname = %(tname)s AND t.relkind IN ('r', 'p')
LEFT JOIN (pg_class v JOIN pg_namespace vn ON vn.oid = v.relnamespace)
       ON vn.nspname = %(vschema)s AND v.relname = %(vname)s
"""
)


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
    # enabled triggers that fire on inserts into the table or a descendant (views.triggers)
    triggers: tuple[Trigger, ...] = ()

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
    role, may_delete, has_xid, table_cols, kind, owner, comment, view_cols, stale, found = row
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
        tuple(Trigger.of(t) for t in found),
    )


def refusal(
    state: State,
    view: TableName,
    table: TableName,
    sink_id: str | None,
    outcome: str = "Nothing was written",
) -> str | None:
    """Why the sink cannot keep this view (None: it can); ``sink_id`` None: not known yet
    (a stream whose id comes from its tasks), another sink's view then passes here.
    ``outcome``: what became of the batch, for the refusals that depend on the table."""
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
    if state.triggers:
        return trigger_refusal(option, str(table), state.triggers, outcome)
    return None


# -- keeping it right (the committer, under the sink lock) ---------------------------------


def keep_view(conn: Connection, view: TableName, table: TableName, sink_id: str) -> str:
    """Create, replace or keep the view; refuse another's. Returns what was done:
    "created", "replaced", "kept" (up to date), or "stale" (out of date, and replacing
    it failed: logged; it still shows whole batches, with its old columns)."""
    state = read_state(conn, view, table, sink_id)
    # a trigger made since planning: the batch's partitions have used it already
    outcome = "Nothing of the batch is committed (its prepared transactions are rolled back)"
    problem = refusal(state, view, table, sink_id, outcome)
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
        why = (
            f"{lock_holders(conn, view)} held it for {REPLACE_LOCK_TIMEOUT_S:g} s (a view's "
            "readers keep it until their transaction ends; SELECT pg_terminate_backend(pid) "
            "ends one); tried again at the next batch"
        )
    except psycopg.Error as exc:  # a renamed column, another owner: only a person can fix it
        why = (
            f"{exc.diag.message_primary}; to get the new columns, DROP VIEW {view} (the sink "
            "creates it again at its next batch: grant SELECT on it again)"
        )
    else:
        log.info(
            "sqlsink %s: replaced the consistent view %s (format %s, columns of %s)",
            sink_id,
            view,
            FORMAT,
            table,
        )
        return "replaced"
    log.warning(
        "sqlsink %s: the consistent view %s (format %s, columns %s) is out of date (format "
        "%s, the table %s has columns %s) and could not be replaced (%s). It still shows "
        "whole batches only",
        sink_id,
        view,
        state.mark.format if state.mark else "?",
        ", ".join(state.view_columns),
        FORMAT,
        table,
        ", ".join(state.table_columns),
        why,
    )
    return "stale"


_HOLDERS = """
SELECT l.pid, a.usename::text, a.application_name, a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.relation = to_regclass(%s)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.pid IS DISTINCT FROM pg_backend_pid()
ORDER BY a.xact_start NULLS FIRST, l.pid LIMIT 5
"""


def lock_holders(conn: Connection, view: TableName) -> str:
    """Who holds a lock on the view now, for a message: "session 123 (role alice,
    application 'psql', idle in transaction, its transaction open for 42 s)"."""
    try:
        rows = conn.execute(_HOLDERS, (view.identifier().as_string(conn),)).fetchall()
    except psycopg.Error as exc:  # the message must still be given
        return f"its readers (not listed: {exc.diag.message_primary})"
    named = []
    for pid, role, app, state, age in rows:
        if pid is None:
            named.append("a prepared transaction (see pg_prepared_xacts)")
            continue
        facts = [f"role {role}" if role else "role not visible to this one"]
        if app:
            facts.append(f"application {app!r}")
        if state:
            facts.append(state + (f", its transaction open for {age:.0f} s" if age else ""))
        named.append(f"session {pid} ({', '.join(facts)})")
    if not named:
        return "readers (gone since)"
    return "; ".join(named)


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


class ConsistentViews:
    """``core.backend.ViewKeeper`` for every view of a batch (the foreachBatch writer's
    tables, one view each, or the data source's one): kept in turn, in the order given."""

    def __init__(
        self, backend: PostgresBackend, views: Sequence[tuple[TableName, TableName]]
    ) -> None:
        self.views = [ConsistentView(backend, view, table) for view, table in views]

    def keep(self, sink_id: str) -> None:
        for view in self.views:
            view.keep(sink_id)


def check_before_writing(
    conn: Connection, view: TableName, table: TableName, sink_id: str | None
) -> None:
    """At planning, before any task writes: the refusals ``keep_view`` would make (the
    target's triggers included: ``views.triggers``)."""
    state = read_state(conn, view, table, sink_id or "")
    problem = refusal(state, view, table, sink_id)
    if problem is not None:
        raise ConfigError(problem, view=str(view))
