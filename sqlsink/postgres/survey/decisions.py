"""Reads of the commit log: its sinks, decided batches and their summary."""

from __future__ import annotations

from sqlsink.core.admin import BatchSummary, DecisionRow, SinkRow
from sqlsink.core.model import BatchFigures
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.schema import installed_version

# figures through the row's JSON: NULL where the column is missing (before version 9,
# or while the upgrade to it is deferred)
_DECISION_COLUMNS = (
    "sink_id, batch_id, gids, rows, decided_at, completed_at, query_id, run_id, "
    "first_write_at, commit_ms, orphans, to_jsonb(d) -> 'figures' FROM sqlsink.decisions d"
)


def _decision(row: tuple[object, ...]) -> DecisionRow:
    sink_id, batch_id, gids, rows, decided_at, completed_at, query_id, run_id = row[:8]
    first_write_at, commit_ms, orphans, figures = row[8:]
    return DecisionRow(
        str(sink_id),
        int(str(batch_id)),
        tuple(str(g) for g in gids) if isinstance(gids, list) else (),
        int(str(rows)),
        decided_at,  # type: ignore[arg-type]
        completed_at,  # type: ignore[arg-type]
        None if query_id is None else str(query_id),
        None if run_id is None else str(run_id),
        first_write_at,  # type: ignore[arg-type]
        None if commit_ms is None else float(str(commit_ms)),
        None if orphans is None else int(str(orphans)),
        BatchFigures.from_json(figures),
    )


def schema_version(conn: Connection) -> int:
    """The installed version of the ``sqlsink`` schema; 0 when it is not installed."""
    return installed_version(conn)


def sinks(conn: Connection) -> dict[str, SinkRow]:
    rows = conn.execute(
        "SELECT sink_id, query_id, created_at, bound_at FROM sqlsink.sinks ORDER BY sink_id"
    ).fetchall()
    return {str(s): SinkRow(str(s), None if q is None else str(q), c, b) for s, q, c, b in rows}


def sink_tables(conn: Connection, sink_id: str) -> list[str]:
    """The tables the sink's newest decision that names any wrote (schema 8 on)."""
    if installed_version(conn) < 8:
        return []
    row = conn.execute(
        "SELECT tables FROM sqlsink.decisions WHERE sink_id = %s AND tables IS NOT NULL "
        "ORDER BY batch_id DESC LIMIT 1",
        (sink_id,),
    ).fetchone()
    return [] if row is None else [str(t) for t in row[0]]


def batch_summary(conn: Connection, sink_id: str) -> BatchSummary:
    row = conn.execute(
        "SELECT count(*), min(batch_id), max(batch_id), "
        "max(batch_id) FILTER (WHERE completed_at IS NOT NULL), "
        "count(*) FILTER (WHERE completed_at IS NULL) "
        "FROM sqlsink.decisions WHERE sink_id = %s",
        (sink_id,),
    ).fetchone()
    assert row is not None
    count, first, last, last_complete, incomplete = row
    return BatchSummary(
        int(str(count)),
        None if first is None else int(str(first)),
        None if last is None else int(str(last)),
        None if last_complete is None else int(str(last_complete)),
        int(str(incomplete)),
    )


def recent_decisions(conn: Connection, sink_id: str, limit: int) -> list[DecisionRow]:
    rows = conn.execute(
        f"SELECT {_DECISION_COLUMNS} WHERE sink_id = %s ORDER BY batch_id DESC LIMIT %s",
        (sink_id, limit),
    ).fetchall()
    return [_decision(r) for r in rows]


def decisions_from(conn: Connection, sink_id: str, first_batch: int) -> dict[int, DecisionRow]:
    rows = conn.execute(
        f"SELECT {_DECISION_COLUMNS} WHERE sink_id = %s AND batch_id >= %s ORDER BY batch_id",
        (sink_id, first_batch),
    ).fetchall()
    return {d.batch_id: d for d in map(_decision, rows)}


def incomplete_decisions(conn: Connection, sink_id: str | None = None) -> list[DecisionRow]:
    rows = conn.execute(
        f"SELECT {_DECISION_COLUMNS} WHERE completed_at IS NULL "
        "AND (%s::text IS NULL OR sink_id = %s::text) ORDER BY sink_id, batch_id",
        (sink_id, sink_id),
    ).fetchall()
    return [_decision(r) for r in rows]
