"""The decisions, the markers and the binding on MariaDB (postgres/commit_log.py's
meaning; the tables: sqlsink/mariadb/sql/). Functions take an autocommit session and
the commit log's database name; those that must be atomic open their own transaction
(a plain one: the commit log is never written inside an XA branch, except the marker)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from datetime import datetime, timezone
from typing import Any

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
from sqlsink.mariadb.connection import Connection, execute, rows


def utc(value: Any) -> datetime | None:
    """A DATETIME column read back (naive, UTC by the session's time_zone)."""
    if value is None:
        return None
    assert isinstance(value, datetime)
    return value.replace(tzinfo=timezone.utc)


def binding_of(writer: object, query_id: object) -> Binding:
    if writer in ("stream", "load"):
        return Binding(str(writer), None if query_id is None else str(query_id))
    return Binding("unknown", None if query_id is None else str(query_id))


def task_state(
    conn: Connection, db: str, sink_id: str, run_id: str, batch_id: int, prepared: list[str]
) -> TaskState:
    """What the task must know before writing (``prepared``: the sink's branches, from
    XA RECOVER, which no SELECT can join)."""
    found = rows(
        conn,
        f"SELECT (SELECT coalesce(superseded_by, 'operator') FROM `{db}`.runs "
        "         WHERE sink_id = %(sink)s AND run_id = %(run)s AND superseded_at IS NOT NULL), "
        f"       EXISTS (SELECT 1 FROM `{db}`.decisions "
        "               WHERE sink_id = %(sink)s AND batch_id = %(batch)s), "
        f"       (SELECT max(batch_id) FROM `{db}`.decisions WHERE sink_id = %(sink)s), "
        "       s.sink_id IS NOT NULL, s.writer, s.query_id "
        f"FROM (SELECT 1) AS one LEFT JOIN `{db}`.sinks s ON s.sink_id = %(sink)s",
        {"sink": sink_id, "run": run_id, "batch": batch_id},
    )
    fenced_by, decided, highest, exists, writer, query_id = found[0]
    return TaskState(
        None if fenced_by is None else str(fenced_by),
        bool(decided),
        binding_of(writer, query_id) if exists else None,
        None if highest is None else int(highest),
        tuple(prepared),
    )


def attempt_fate(
    conn: Connection, db: str, sink_id: str, run_id: str, batch_id: int, gid: str
) -> Fate:
    found = rows(
        conn,
        f"SELECT (SELECT json_contains(gids, json_quote(%(gid)s)) FROM `{db}`.decisions "
        "         WHERE sink_id = %(sink)s AND batch_id = %(batch)s), "
        "       coalesce(r.superseded_at IS NOT NULL, false), "
        "       coalesce(r.aborted_batch >= %(batch)s, false) "
        f"FROM (SELECT 1) AS one LEFT JOIN `{db}`.runs r "
        "  ON r.sink_id = %(sink)s AND r.run_id = %(run)s",
        {"gid": gid, "sink": sink_id, "batch": batch_id, "run": run_id},
    )
    named, fenced, aborted = found[0]
    return Fate(None if named is None else bool(named), bool(fenced), bool(aborted))


def insert_marker(
    conn: Connection, db: str, gid: str, sink_id: str, batch_id: int, partition_id: int, count: int
) -> None:
    """Inside the partition's branch: its marker commits exactly when its rows do."""
    execute(
        conn,
        f"INSERT INTO `{db}`.markers (gid, sink_id, batch_id, partition_id, row_count) "
        "VALUES (%s, %s, %s, %s, %s)",
        (gid, sink_id, batch_id, partition_id, count),
    )


def binding(conn: Connection, db: str, sink_id: str) -> Binding | None:
    found = rows(conn, f"SELECT writer, query_id FROM `{db}`.sinks WHERE sink_id = %s", (sink_id,))
    return None if not found else binding_of(found[0][0], found[0][1])


def bind(conn: Connection, db: str, sink_id: str, writer: Binding) -> None:
    execute(
        conn,
        f"INSERT INTO `{db}`.sinks (sink_id, writer, query_id) VALUES (%s, %s, %s) "
        "ON DUPLICATE KEY UPDATE writer = VALUES(writer), query_id = VALUES(query_id), "
        "bound_at = current_timestamp(6)",
        (sink_id, writer.kind, writer.query_id),
    )


def highest_decided(conn: Connection, db: str, sink_id: str) -> int | None:
    found = rows(conn, f"SELECT max(batch_id) FROM `{db}`.decisions WHERE sink_id = %s", (sink_id,))
    return None if not found or found[0][0] is None else int(found[0][0])


def record_handover(conn: Connection, db: str, sink_id: str, run_id: str, batch_id: int) -> None:
    execute(
        conn,
        f"INSERT INTO `{db}`.handovers (sink_id, run_id, batch_id) VALUES (%s, %s, %s) "
        "ON DUPLICATE KEY UPDATE batch_id = VALUES(batch_id), handed_at = current_timestamp(6)",
        (sink_id, run_id, batch_id),
    )


def handovers(conn: Connection, db: str, sink_id: str) -> list[Handover]:
    found = rows(
        conn,
        f"SELECT run_id, batch_id, handed_at FROM `{db}`.handovers WHERE sink_id = %s",
        (sink_id,),
    )
    return [
        Handover(str(r[0]), int(r[1]), r[2].replace(tzinfo=timezone.utc)) for r in found
    ]  # the sessions run in UTC


_DECISION_COLUMNS = (
    "sink_id, batch_id, gids, row_count, decided_at, completed_at IS NOT NULL, query_id, "
    "run_id, timestampdiff(microsecond, decided_at, current_timestamp(6)) / 1e6, tables"
)


def _decision(row: tuple[Any, ...]) -> Decision:
    s, b, gids, count, at, complete, query, run, age, tables = row
    listed = json.loads(tables) if tables else None
    decided_at = utc(at)
    assert decided_at is not None  # NOT NULL
    return Decision(
        str(s), int(b), frozenset(json.loads(gids)), int(count), decided_at, bool(complete),
        None if query is None else str(query), None if run is None else str(run),
        float(age), tuple(listed) if listed else None,
    )  # fmt: skip


def decisions(
    conn: Connection, db: str, sink_id: str | None, batch_ids: Iterable[tuple[str, int]] = ()
) -> dict[tuple[str, int], Decision]:
    """The decisions of these (sink, batch) pairs plus every incomplete one."""
    found = rows(
        conn,
        f"SELECT {_DECISION_COLUMNS} FROM `{db}`.decisions "
        "WHERE completed_at IS NULL AND (%s IS NULL OR sink_id = %s)",
        (sink_id, sink_id),
    )
    pairs = sorted(set(batch_ids))
    if pairs:
        where = " OR ".join(["(sink_id = %s AND batch_id = %s)"] * len(pairs))
        args = [v for pair in pairs for v in pair]
        found += rows(conn, f"SELECT {_DECISION_COLUMNS} FROM `{db}`.decisions WHERE {where}", args)
    out = {}
    for row in found:
        d = _decision(row)
        out[(d.sink_id, d.batch_id)] = d
    return out


def insert_decision(
    conn: Connection, db: str, decision: NewDecision, cut: Callable[[str], None] | None = None
) -> bool:
    """Write the decision durably unless one exists; True if this call wrote it (``cut``:
    the backend's way of ending this session, for the in_decision terminate fault)."""
    sink_id, batch_id, gids = decision.sink_id, decision.batch_id, list(decision.gids)
    writer = Binding.of(decision.query_id)
    first = decision.first_write_at
    execute(conn, "BEGIN")
    try:
        # a row made by a run's registration says no writer yet: the first decision's.
        # The sink's row is locked only when it is bound here (as on PostgreSQL): InnoDB
        # locks it for INSERT IGNORE of a duplicate and for an UPDATE whose WHERE fails,
        # and a driver paused inside this transaction would keep every next run from
        # registering (1205), unfenced (tests/chaos/test_mariadb_paused_decision.py)
        bound = rows(conn, f"SELECT writer FROM `{db}`.sinks WHERE sink_id = %s", (sink_id,))
        if not bound or bound[0][0] is None:
            execute(
                conn,
                f"INSERT IGNORE INTO `{db}`.sinks (sink_id, writer, query_id) VALUES (%s, %s, %s)",
                (sink_id, writer.kind, writer.query_id),
            )
            execute(
                conn,
                f"UPDATE `{db}`.sinks SET writer = %s, query_id = %s "
                "WHERE sink_id = %s AND writer IS NULL",
                (writer.kind, writer.query_id, sink_id),
            )
        written = execute(
            conn,
            f"INSERT IGNORE INTO `{db}`.decisions (sink_id, batch_id, gids, row_count, query_id, "
            "run_id, partitions, first_write_at, tables, completed_at) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, "
            "CASE WHEN %s IS NULL THEN NULL ELSE from_unixtime(%s) END, %s, "
            "CASE WHEN %s = 0 THEN current_timestamp(6) END)",
            (
                sink_id, batch_id, json.dumps(gids), decision.rows, decision.query_id,
                decision.run_id, decision.partitions, first, first,
                json.dumps(list(decision.tables)) if decision.tables else None, len(gids),
            ),
        )  # fmt: skip
        # inside the transaction (tests pause here, or cut the session)
        crash_point("in_decision", batch_id, cut=cut)
        execute(conn, "COMMIT")
    except BaseException:
        if conn.open:
            execute(conn, "ROLLBACK")
        raise
    return written == 1


def record_metrics(
    conn: Connection,
    db: str,
    sink_id: str,
    batch_id: int,
    commit_ms: float,
    orphans: int,
    *,
    figures: BatchFigures | None = None,
) -> None:
    """As postgres/commit_log.py's: None keeps the figures recorded, and then commit_ms
    and orphans too unless none were."""
    if figures is None:
        execute(
            conn,
            f"UPDATE `{db}`.decisions SET commit_ms = coalesce(commit_ms, %s), "
            "orphans = coalesce(orphans, %s) WHERE sink_id = %s AND batch_id = %s",
            (commit_ms, orphans, sink_id, batch_id),
        )
        return
    execute(
        conn,
        f"UPDATE `{db}`.decisions SET commit_ms = %s, orphans = %s, figures = %s "
        "WHERE sink_id = %s AND batch_id = %s",
        (commit_ms, orphans, json.dumps(figures.to_json()), sink_id, batch_id),
    )


def metrics(
    conn: Connection, db: str, sink_id: str, batch_id: int
) -> tuple[float | None, int | None, BatchFigures | None]:
    found = rows(
        conn,
        f"SELECT commit_ms, orphans, figures FROM `{db}`.decisions "
        "WHERE sink_id = %s AND batch_id = %s",
        (sink_id, batch_id),
    )
    ms, orphans, figures = found[0]
    return (
        None if ms is None else float(ms),
        None if orphans is None else int(orphans),
        BatchFigures.from_json(json.loads(figures)) if figures else None,
    )


def visible_markers(conn: Connection, db: str, gids: Collection[str]) -> set[str]:
    if not gids:
        return set()
    listed = list(gids)
    marks = ", ".join(["%s"] * len(listed))
    found = rows(conn, f"SELECT gid FROM `{db}`.markers WHERE gid IN ({marks})", listed)
    return {str(r[0]) for r in found}


def mark_complete(conn: Connection, db: str, sink_id: str, batch_ids: Collection[int]) -> None:
    """The batches are complete, and their markers go, in one transaction (and the rows
    of their task sessions, which ``await_batch_tasks`` read before the decision)."""
    batches = sorted(set(batch_ids))
    if not batches:
        return
    marks = ", ".join(["%s"] * len(batches))
    execute(conn, "BEGIN")
    try:
        execute(
            conn,
            f"UPDATE `{db}`.decisions SET completed_at = current_timestamp(6) "
            f"WHERE sink_id = %s AND batch_id IN ({marks}) AND completed_at IS NULL",
            (sink_id, *batches),
        )
        for table in ("markers", "task_sessions"):  # task sessions: read until now only
            execute(
                conn,
                f"DELETE FROM `{db}`.{table} WHERE sink_id = %s AND batch_id IN ({marks})",
                (sink_id, *batches),
            )
        execute(conn, "COMMIT")
    except BaseException:
        if conn.open:
            execute(conn, "ROLLBACK")
        raise
