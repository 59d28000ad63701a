"""The decisions and the markers: what the protocol reads and writes on the commit log.

The tables (``sql/*.sql``): ``sinks`` (one row per sink: the writer it is bound to),
``decisions`` (one row per decided batch: exactly the gids to commit) and
``markers`` (one row per partition transaction, written inside it). What each row
proves is in docs/DESIGN.md ("The commit log"). Functions take an open autocommit
connection; those that must be atomic open their own transaction.

This module owns what a task reads before and after it writes, its marker, the
sink's binding, and the decision row from its writing to its completion. The runs
registry is ``run_registry.py``'s, what leaves the log (pruning, forgetting a
sink) ``retention.py``'s, the checkpoint check's rows ``checkpoint_records.py``'s.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Collection, Iterable

import psycopg
from psycopg.types.json import Jsonb

from sqlsink.core.faults import crash_point
from sqlsink.core.model import (
    BatchFigures,
    Binding,
    Decision,
    Fate,
    Handover,
    NewDecision,
    TaskState,
)
from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection

log = logging.getLogger("sqlsink")


@functools.cache
def warn_markers_kept() -> None:
    """Once per process: every later batch would say the same."""
    log.warning(
        "sqlsink: this role may not DELETE FROM sqlsink.markers, so the markers "
        "of complete batches are kept (the table grows, and a consistent view of the "
        "sink, option consistentView, would hide those batches): "
        "GRANT DELETE ON sqlsink.markers TO the sink's role"
    )


# -- what a task reads before and after it writes, and its marker -------------------------


_TASK_STATE = """
SELECT (SELECT coalesce(superseded_by, 'operator') FROM sqlsink.runs
         WHERE sink_id = %(sink)s AND run_id = %(run)s AND superseded_at IS NOT NULL),
       EXISTS (SELECT 1 FROM sqlsink.decisions WHERE sink_id = %(sink)s AND batch_id = %(batch)s),
       s.writer, s.query_id, s.sink_id IS NOT NULL,
       (SELECT max(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s),
       ARRAY(SELECT gid FROM pg_prepared_xacts
             WHERE gid LIKE %(prefix)s AND database = current_database())
FROM (SELECT) AS one LEFT JOIN sqlsink.sinks s ON s.sink_id = %(sink)s
"""


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching strings that start with ``prefix`` (taken literally)."""
    return prefix.replace("\\", "\\\\").replace("%", r"\%").replace("_", r"\_") + "%"


def task_state(
    conn: Connection, sink_id: str, run_id: str, batch_id: int, gid_prefix: str
) -> TaskState:
    """What the task must know before writing, in one read (whether its run is fenced
    too: a fenced run is refused even where its writer is not checked)."""
    params = {
        "sink": sink_id,
        "run": run_id,
        "batch": batch_id,
        "prefix": like_prefix(gid_prefix),
    }
    row = conn.execute(_TASK_STATE, params).fetchone()
    assert row is not None
    fenced_by, decided, writer, query_id, exists, highest, prepared = row
    return TaskState(
        None if fenced_by is None else str(fenced_by),
        bool(decided),
        binding_of(writer, query_id) if exists else None,
        None if highest is None else int(highest),
        tuple(str(g) for g in prepared),
    )


def binding_of(writer: object, query_id: object) -> Binding:
    """The binding a row of ``sqlsink.sinks`` records (its ``writer`` and ``query_id``)."""
    if writer in ("stream", "load"):
        return Binding(str(writer), None if query_id is None else str(query_id))
    return Binding("unknown", None if query_id is None else str(query_id))


def attempt_fate(conn: Connection, sink_id: str, run_id: str, batch_id: int, gid: str) -> Fate:
    """After PREPARE: is the attempt's batch decided (with it?), aborted, its run fenced?"""
    row = conn.execute(
        "SELECT (SELECT %(gid)s = ANY(gids) FROM sqlsink.decisions "
        "         WHERE sink_id = %(sink)s AND batch_id = %(batch)s), "
        "       coalesce(r.superseded_at IS NOT NULL, false), "
        "       coalesce(r.aborted_batch >= %(batch)s, false) "
        "FROM (SELECT) AS one LEFT JOIN sqlsink.runs r "
        "  ON r.sink_id = %(sink)s AND r.run_id = %(run)s",
        {"gid": gid, "sink": sink_id, "batch": batch_id, "run": run_id},
    ).fetchone()
    assert row is not None
    return Fate(None if row[0] is None else bool(row[0]), bool(row[1]), bool(row[2]))


def insert_marker(
    conn: Connection, gid: str, sink_id: str, batch_id: int, partition_id: int, rows: int
) -> None:
    """Inside the partition's transaction: its marker commits exactly when its rows do."""
    conn.execute(
        "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
        "VALUES (%s, %s, %s, %s, %s)",
        (gid, sink_id, batch_id, partition_id, rows),
    )


# -- binding -------------------------------------------------------------------------------


def binding(conn: Connection, sink_id: str) -> Binding | None:
    """The writer the sink is bound to; None when the sink has no row yet."""
    row = conn.execute(
        "SELECT writer, query_id FROM sqlsink.sinks WHERE sink_id = %s", (sink_id,)
    ).fetchone()
    return None if row is None else binding_of(row[0], row[1])


def bind(conn: Connection, sink_id: str, writer: Binding) -> None:
    conn.execute(
        "INSERT INTO sqlsink.sinks (sink_id, writer, query_id) VALUES (%s, %s, %s) "
        "ON CONFLICT (sink_id) DO UPDATE SET writer = excluded.writer, "
        "query_id = excluded.query_id, bound_at = now()",
        (sink_id, writer.kind, writer.query_id),
    )


def highest_decided(conn: Connection, sink_id: str) -> int | None:
    row = conn.execute(
        "SELECT max(batch_id) FROM sqlsink.decisions WHERE sink_id = %s", (sink_id,)
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


# -- decisions -----------------------------------------------------------------------------


def decisions(
    conn: Connection, sink_id: str | None, batch_ids: Iterable[tuple[str, int]] = ()
) -> dict[tuple[str, int], Decision]:
    """The decisions of these (sink, batch) pairs plus every incomplete one.

    Their ``tables`` are read through the row's JSON, NULL where the column is missing:
    the upgrade that adds it (version 8) can be deferred (postgres/schema.py). Only for
    the rows returned (a lookup by key each): a whole-row reference to ``d`` would build
    every scanned row, and doubled the query's time on a log of 1,000 decisions."""
    pairs = sorted(set(batch_ids))
    rows = conn.execute(
        "SELECT d.sink_id, d.batch_id, d.gids, d.rows, d.decided_at, "
        "       d.completed_at IS NOT NULL, d.query_id, d.run_id, "
        "       extract(epoch FROM clock_timestamp() - d.decided_at)::float8, "
        "       (SELECT to_jsonb(t) -> 'tables' FROM sqlsink.decisions t "
        "         WHERE t.sink_id = d.sink_id AND t.batch_id = d.batch_id) "
        "FROM sqlsink.decisions d "
        "LEFT JOIN unnest(%s::text[], %s::bigint[]) AS w(sink_id, batch_id) "
        "  ON w.sink_id = d.sink_id AND w.batch_id = d.batch_id "
        "WHERE w.sink_id IS NOT NULL "
        "   OR (d.completed_at IS NULL AND (%s::text IS NULL OR d.sink_id = %s::text))",
        ([s for s, _ in pairs], [b for _, b in pairs], sink_id, sink_id),
    ).fetchall()
    return {
        (s, b): Decision(s, b, frozenset(g), r, at, c, q, run, age, _tables(t))
        for s, b, g, r, at, c, q, run, age, t in rows
    }


def _tables(value: object) -> tuple[str, ...] | None:
    """A decision's tables as read (a JSON array, or NULL: unknown)."""
    return tuple(str(t) for t in value) if isinstance(value, list) and value else None


def insert_decision(conn: Connection, decision: NewDecision) -> bool:
    """Write the decision durably unless one exists; True if this call wrote it.
    Its ``tables`` (schema.name) are recorded from schema version 8 on (an upgrade to it
    can be deferred, ``has_decision_tables``)."""
    sink_id, batch_id, gids = decision.sink_id, decision.batch_id, list(decision.gids)
    query_id = decision.query_id
    columns = "sink_id, batch_id, gids, rows, query_id, run_id, partitions, first_write_at, "
    values = "%s, %s, %s, %s, %s, %s, %s, to_timestamp(%s), "
    args: list[object] = [
        sink_id,
        batch_id,
        gids,
        decision.rows,
        query_id,
        decision.run_id,
        decision.partitions,
        decision.first_write_at,
    ]
    if has_decision_tables(conn):
        columns, values = columns + "tables, ", values + "%s, "
        args.append(list(decision.tables) or None)
    args.append(gids)  # complete at once when it names no transaction
    # one pipeline: the transaction's statements go in one round trip, and its COMMIT in
    # a second (synced first, so that "in_decision" finds them run, inside it)
    with conn.pipeline() as pipeline, conn.transaction():
        # the decision must be durable before anything is committed
        conn.execute("SET LOCAL synchronous_commit = on")
        writer = Binding.of(query_id)
        # a row made by a run's registration says no writer yet: the first decision's.
        # The row is locked only when it is bound here (ON CONFLICT DO UPDATE would lock
        # it whatever its WHERE says): a driver paused inside this transaction must not
        # keep the next run from registering (schema version 6, invariant 11)
        conn.execute(
            "INSERT INTO sqlsink.sinks (sink_id, writer, query_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (sink_id) DO NOTHING",
            (sink_id, writer.kind, writer.query_id),
        )
        conn.execute(
            "UPDATE sqlsink.sinks SET writer = %s, query_id = %s "
            "WHERE sink_id = %s AND writer IS NULL",
            (writer.kind, writer.query_id, sink_id),
        )
        cur = conn.execute(
            f"INSERT INTO sqlsink.decisions ({columns}completed_at) VALUES ({values}"
            "CASE WHEN cardinality(%s::text[]) = 0 THEN clock_timestamp() END) "
            "ON CONFLICT (sink_id, batch_id) DO NOTHING",
            args,
        )
        pipeline.sync()  # run, and their errors raised, before the crash point
        crash_point("in_decision", batch_id)  # inside the transaction (tests pause here)
        return cur.rowcount == 1


# connections whose database has every optional column of decisions: a column is never
# dropped, so one look per session (kept sessions serve many batches); until then, one
# per decision
_DECISION_COLUMNS_ALL: weakref.WeakSet[Connection] = weakref.WeakSet()
_OPTIONAL_DECISION_COLUMNS = ("tables", "figures")  # of versions 8 and 9


def decision_columns(conn: Connection) -> frozenset[str]:
    """Which columns that later versions add to ``sqlsink.decisions`` are there, in one
    look. An upgrade stops below a migration that must lock sqlsink.markers while prepared
    partitions hold it (postgres/schema.py: version 4 below 5 today), and the sink works at
    that version meanwhile: its decisions then name no table and keep no figures (NULL, as
    those written before)."""
    if conn in _DECISION_COLUMNS_ALL:
        return frozenset(_OPTIONAL_DECISION_COLUMNS)
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass('sqlsink.decisions') "
        "AND attname = ANY(%s) AND NOT attisdropped",
        (list(_OPTIONAL_DECISION_COLUMNS),),
    ).fetchall()
    found = frozenset(str(r[0]) for r in rows)
    if found == frozenset(_OPTIONAL_DECISION_COLUMNS):
        _DECISION_COLUMNS_ALL.add(conn)
    return found


def has_decision_tables(conn: Connection) -> bool:
    """Whether decisions record their tables (version 8; ``decision_columns``)."""
    return "tables" in decision_columns(conn)


def record_metrics(
    conn: Connection,
    sink_id: str,
    batch_id: int,
    commit_ms: float,
    orphans: int,
    *,
    figures: BatchFigures | None = None,
) -> None:
    """Figures only: committed without waiting for their WAL flush (a crash may lose them,
    nothing else), in one round trip and one UPDATE. ``figures`` (version 9; an upgrade
    to it can be deferred, ``decision_columns``): None keeps those recorded, and then
    commit_ms and orphans too, unless none were (a replayed commit after the first one
    recorded its figures must not make the row say two commit times)."""
    columns = "commit_ms = coalesce(commit_ms, %s), orphans = coalesce(orphans, %s)"
    args: list[object] = [commit_ms, orphans]
    if figures is not None:
        columns = "commit_ms = %s, orphans = %s"
        if "figures" in decision_columns(conn):
            columns += ", figures = %s"
            args.append(Jsonb(figures.to_json()))
    with conn.pipeline(), conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = off")
        conn.execute(
            f"UPDATE sqlsink.decisions SET {columns} WHERE sink_id = %s AND batch_id = %s",
            (*args, sink_id, batch_id),
        )


def visible_markers(conn: Connection, gids: Collection[str]) -> set[str]:
    """Those of the gids whose partition marker row is committed."""
    if not gids:
        return set()
    rows = conn.execute(
        "SELECT gid FROM sqlsink.markers WHERE gid = ANY(%s)", (list(gids),)
    ).fetchall()
    return {str(r[0]) for r in rows}


def mark_complete(conn: Connection, sink_id: str, batch_ids: Collection[int]) -> None:
    """The batches are complete: say so, and delete their markers in the same
    transaction. Markers are read only to verify the gids of incomplete decisions, so
    once a batch is complete they go, and the commit log grows by one row per batch
    only. The consistent view shows a batch exactly when its markers are gone
    (invariant 13): one DELETE, so a reader sees all of them or none, and never the
    completion without the deletion (a crash between the two would hide the batch
    from the view for good)."""
    args = {"sink": sink_id, "batches": list(batch_ids)}
    try:  # one statement, so one round trip and one transaction
        conn.execute(_COMPLETE_AND_DELETE_MARKERS, args)
    except psycopg.errors.InsufficientPrivilege:  # no DELETE on markers: checked before
        conn.execute(_COMPLETE, args)  # anything changed, so the completion alone
        warn_markers_kept()


_COMPLETE = (
    "UPDATE sqlsink.decisions SET completed_at = clock_timestamp() "
    "WHERE sink_id = %(sink)s AND batch_id = ANY(%(batches)s) AND completed_at IS NULL "
    "RETURNING batch_id"
)
_COMPLETE_AND_DELETE_MARKERS = (
    f"WITH done AS ({_COMPLETE}) "
    "DELETE FROM sqlsink.markers WHERE sink_id = %(sink)s "
    "AND batch_id IN (SELECT batch_id FROM done)"
)


# -- the foreachBatch writer's hand-overs (schema 11) -------------------------------------


# sessions that have seen sqlsink.handovers: a table of the commit log is never dropped
# (forget deletes rows), so one look per session, not two per batch
_HANDOVERS_SEEN: weakref.WeakSet[Connection] = weakref.WeakSet()


def has_handovers(conn: Connection) -> bool:
    if conn in _HANDOVERS_SEEN:
        return True
    row = conn.execute("SELECT to_regclass('sqlsink.handovers') IS NOT NULL").fetchone()
    if row and row[0]:
        _HANDOVERS_SEEN.add(conn)
        return True
    return False


def record_handover(conn: Connection, sink_id: str, run_id: str, batch_id: int) -> None:
    """One row per run, its latest hand-over (a schema not yet at 11 records nothing: the
    check then has nothing to go on, as before the table)."""
    if not has_handovers(conn):
        return
    try:
        conn.execute(
            "INSERT INTO sqlsink.handovers (sink_id, run_id, batch_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (sink_id, run_id) DO UPDATE SET batch_id = excluded.batch_id, "
            "handed_at = excluded.handed_at",
            (sink_id, run_id, batch_id),
        )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise _handovers_denied(conn, sink_id, batch_id, exc) from None


def handovers(conn: Connection, sink_id: str) -> list[Handover]:
    if not has_handovers(conn):
        return []
    try:
        rows = conn.execute(
            "SELECT run_id, batch_id, handed_at FROM sqlsink.handovers WHERE sink_id = %s",
            (sink_id,),
        ).fetchall()
    except psycopg.errors.InsufficientPrivilege as exc:
        raise _handovers_denied(conn, sink_id, None, exc) from None
    return [Handover(str(r[0]), int(r[1]), r[2]) for r in rows]


def _handovers_denied(
    conn: Connection, sink_id: str, batch_id: int | None, exc: psycopg.Error
) -> ConfigError:
    """The role lacks the table an upgrade to version 11 added (grants given before it,
    ON ALL TABLES IN SCHEMA sqlsink, do not cover it)."""
    row = conn.execute("SELECT current_user").fetchone()
    role = str(row[0]) if row else "the sink's role"
    which = "" if batch_id is None else f" batch {batch_id}:"
    return ConfigError(
        f"sink {sink_id!r}:{which} the foreachBatch writer records each stream batch's "
        f"hand-over in sqlsink.handovers (commit log version 11), and role {role} may not "
        f"({exc.diag.message_primary}). Nothing of the batch was written. Fix: GRANT SELECT, "
        f"INSERT, UPDATE ON sqlsink.handovers TO {role} (or connect as the schema's owner), "
        "then restart the query",
        sink_id=sink_id,
    )


def sink_tables(conn: Connection) -> tuple[str, ...]:
    """The commit log's tables with rows of a sink, in the order forget deletes them."""
    tables = ("markers", "decisions", "runs", "sinks")
    return ("handovers", *tables) if has_handovers(conn) else tables


def forget_one_off_load(conn: Connection, sink_id: str) -> None:
    """A one-off batch load (no sinkId) is complete: its log is of no further use."""
    with conn.transaction():
        for table in sink_tables(conn):
            conn.execute(f"DELETE FROM sqlsink.{table} WHERE sink_id = %s", (sink_id,))
