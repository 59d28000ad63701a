"""Every statement on the commit log (schema ``sqlsink``), in one place.

The tables (``sql/*.sql``): ``sinks`` (one row per sink: the writer it is bound to),
``decisions`` (one row per decided batch: exactly the gids to commit) and
``markers`` (one row per partition transaction, written inside it). What each row
proves is in docs/DESIGN.md ("The commit log"). Functions take an open autocommit
connection; those that must be atomic open their own transaction.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Iterable

import psycopg

from sqlsink.core.model import Binding, Decision, TaskState
from sqlsink.postgres.connection import Connection

log = logging.getLogger("sqlsink")


@functools.cache
def warn_markers_kept() -> None:
    """Once per process: every later batch would say the same."""
    log.warning(
        "sqlsink: this role may not DELETE FROM sqlsink.markers, so the markers "
        "of complete batches are kept (harmless, but the table grows): "
        "GRANT DELETE ON sqlsink.markers TO the sink's role"
    )


# -- what a task reads before it writes ----------------------------------------------------


_TASK_STATE = """
SELECT EXISTS (SELECT 1 FROM sqlsink.decisions WHERE sink_id = %(sink)s AND batch_id = %(batch)s),
       s.writer, s.query_id, s.sink_id IS NOT NULL,
       (SELECT max(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s),
       ARRAY(SELECT gid FROM pg_prepared_xacts
             WHERE gid LIKE %(prefix)s AND database = current_database())
FROM (SELECT) AS one LEFT JOIN sqlsink.sinks s ON s.sink_id = %(sink)s
"""


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching strings that start with ``prefix`` ('_' taken literally)."""
    return prefix.replace("_", r"\_") + "%"


def task_state(conn: Connection, sink_id: str, batch_id: int, gid_prefix: str) -> TaskState:
    row = conn.execute(
        _TASK_STATE, {"sink": sink_id, "batch": batch_id, "prefix": like_prefix(gid_prefix)}
    ).fetchone()
    assert row is not None
    decided, writer, query_id, exists, highest, prepared = row
    return TaskState(
        bool(decided),
        _binding(writer, query_id) if exists else None,
        None if highest is None else int(highest),
        tuple(str(g) for g in prepared),
    )


def _binding(writer: object, query_id: object) -> Binding:
    if writer in ("stream", "load"):
        return Binding(str(writer), None if query_id is None else str(query_id))
    return Binding("unknown", None if query_id is None else str(query_id))


def decided_with(conn: Connection, sink_id: str, batch_id: int, gid: str) -> bool | None:
    """None: the batch is undecided; else whether its decision names ``gid``."""
    row = conn.execute(
        "SELECT %s = ANY(gids) FROM sqlsink.decisions WHERE sink_id = %s AND batch_id = %s",
        (gid, sink_id, batch_id),
    ).fetchone()
    return None if row is None else bool(row[0])


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
    return None if row is None else _binding(row[0], row[1])


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
    """The decisions of these (sink, batch) pairs plus every incomplete one."""
    pairs = sorted(set(batch_ids))
    rows = conn.execute(
        "SELECT d.sink_id, d.batch_id, d.gids, d.rows, d.decided_at, "
        "       d.completed_at IS NOT NULL, d.query_id, d.run_id "
        "FROM sqlsink.decisions d "
        "LEFT JOIN unnest(%s::text[], %s::bigint[]) AS w(sink_id, batch_id) "
        "  ON w.sink_id = d.sink_id AND w.batch_id = d.batch_id "
        "WHERE w.sink_id IS NOT NULL "
        "   OR (d.completed_at IS NULL AND (%s::text IS NULL OR d.sink_id = %s::text))",
        ([s for s, _ in pairs], [b for _, b in pairs], sink_id, sink_id),
    ).fetchall()
    return {
        (s, b): Decision(s, b, frozenset(g), r, at, c, q, run) for s, b, g, r, at, c, q, run in rows
    }


def insert_decision(
    conn: Connection,
    sink_id: str,
    batch_id: int,
    gids: Collection[str],
    rows: int,
    query_id: str | None,
    run_id: str | None,
    *,
    partitions: int | None = None,
    first_write_at: float | None = None,
) -> bool:
    """Write the decision durably unless one exists; True if this call wrote it."""
    with conn.transaction():
        # the decision must be durable before anything is committed
        conn.execute("SET LOCAL synchronous_commit = on")
        writer = Binding.of(query_id)
        conn.execute(
            "INSERT INTO sqlsink.sinks (sink_id, writer, query_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (sink_id) DO NOTHING",
            (sink_id, writer.kind, writer.query_id),
        )
        cur = conn.execute(
            "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, query_id, run_id, "
            "partitions, first_write_at, completed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, "
            "to_timestamp(%s), "
            "CASE WHEN cardinality(%s::text[]) = 0 THEN clock_timestamp() END) "
            "ON CONFLICT (sink_id, batch_id) DO NOTHING",
            (
                sink_id,
                batch_id,
                list(gids),
                rows,
                query_id,
                run_id,
                partitions,
                first_write_at,
                list(gids),
            ),
        )
        return cur.rowcount == 1


def record_metrics(
    conn: Connection, sink_id: str, batch_id: int, commit_ms: float, orphans: int
) -> None:
    conn.execute(
        "UPDATE sqlsink.decisions SET commit_ms = %s, orphans = %s "
        "WHERE sink_id = %s AND batch_id = %s",
        (commit_ms, orphans, sink_id, batch_id),
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
    done = conn.execute(
        "UPDATE sqlsink.decisions SET completed_at = clock_timestamp() "
        "WHERE sink_id = %s AND batch_id = ANY(%s) AND completed_at IS NULL "
        "RETURNING batch_id",
        (sink_id, list(batch_ids)),
    ).fetchall()
    if not done:
        return
    # markers are read only to verify the gids of incomplete decisions: once a batch
    # is complete its markers go, so the commit log grows by one row per batch only
    try:
        conn.execute(
            "DELETE FROM sqlsink.markers WHERE sink_id = %s AND batch_id = ANY(%s)",
            (sink_id, [row[0] for row in done]),
        )
    except psycopg.errors.InsufficientPrivilege:
        warn_markers_kept()


def forget_one_off_load(conn: Connection, sink_id: str) -> None:
    """A one-off batch load (no sinkId) is complete: its log is of no further use."""
    with conn.transaction():
        for table in ("markers", "decisions", "runs", "sinks"):
            conn.execute(f"DELETE FROM sqlsink.{table} WHERE sink_id = %s", (sink_id,))
