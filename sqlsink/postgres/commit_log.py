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
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

import psycopg

from sqlsink.core.checkpoint_check import LogCoverage, RunCheck, Verdict
from sqlsink.core.faults import crash_point
from sqlsink.core.gid import Gid
from sqlsink.core.model import Binding, Decision, Fate, TaskState
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


# -- what a task reads before it writes ----------------------------------------------------


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
        _binding(writer, query_id) if exists else None,
        None if highest is None else int(highest),
        tuple(str(g) for g in prepared),
    )


def _binding(writer: object, query_id: object) -> Binding:
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


# -- runs (invariant 10) ---------------------------------------------------------------------


def register_run(
    conn: Connection,
    sink_id: str,
    run_id: str,
    live_for_s: float,
    *,
    holds_lock: bool,
    admit: Callable[[Binding | None, int | None], None] | None = None,
    token: str | None = None,
) -> str | None:
    """Record the run (fencing token, heartbeat); the run that fenced it, if it is fenced.
    ``admit(binding, highest)`` runs first with the sink's row locked, in the same
    transaction: when it raises, nothing is recorded. ``token``: the driver's, recorded
    once (schema version 7: the caller passes it only from that version on)."""
    register = "SELECT sqlsink.register_run(%s, %s, make_interval(secs => %s), %s)"
    args = (sink_id, run_id, live_for_s, holds_lock)
    if admit is None:
        row = conn.execute(register, args).fetchone()
        _record_token(conn, sink_id, run_id, token, row)
    else:
        with conn.transaction():
            conn.execute(
                "INSERT INTO sqlsink.sinks (sink_id) VALUES (%s) ON CONFLICT DO NOTHING",
                (sink_id,),
            )
            bound_row = conn.execute(
                "SELECT s.writer, s.query_id, (SELECT max(batch_id) FROM sqlsink.decisions d "
                "                              WHERE d.sink_id = s.sink_id) "
                "FROM sqlsink.sinks s WHERE s.sink_id = %s FOR NO KEY UPDATE",
                (sink_id,),
            ).fetchone()
            assert bound_row is not None
            writer, query_id, highest = bound_row
            admit(_binding(writer, query_id), None if highest is None else int(highest))
            row = conn.execute(register, args).fetchone()
            _record_token(conn, sink_id, run_id, token, row)
    return None if row is None or row[0] is None else str(row[0])


def _record_token(
    conn: Connection, sink_id: str, run_id: str, token: str | None, row: tuple[object, ...] | None
) -> None:
    if token is None or (row is not None and row[0] is not None):  # none, or fenced
        return
    conn.execute(
        "UPDATE sqlsink.runs SET writer_token = %s "
        "WHERE sink_id = %s AND run_id = %s AND writer_token IS NULL",
        (token, sink_id, run_id),
    )


def run_of_token(conn: Connection, sink_id: str, token: str) -> str | None:
    """The newest run whose tasks registered with this driver token (None before
    version 7)."""
    if not has_writer_tokens(conn):
        return None
    row = conn.execute(
        "SELECT run_id FROM sqlsink.runs WHERE sink_id = %s AND writer_token = %s "
        "ORDER BY first_seen DESC LIMIT 1",
        (sink_id, token),
    ).fetchone()
    return None if row is None else str(row[0])


def has_writer_tokens(conn: Connection) -> bool:
    """Whether the commit log records driver tokens (version 7; an upgrade to it can be
    deferred while prepared leftovers hold sqlsink.markers, postgres/schema.py)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('sqlsink.runs') "
        "AND attname = 'writer_token' AND NOT attisdropped)"
    ).fetchone()
    return bool(row and row[0])


def mark_aborted(conn: Connection, sink_id: str, run_id: str, batch_id: int) -> None:
    """Spark aborted this run's batch: a task of it that prepares later rolls itself back."""
    conn.execute(
        "UPDATE sqlsink.runs SET aborted_batch = greatest(aborted_batch, %s) "
        "WHERE sink_id = %s AND run_id = %s",
        (batch_id, sink_id, run_id),
    )


# A run is live while it is neither fenced nor over (Spark aborted one of its batches:
# it aborts only when the query or the load fails or stops) and its heartbeat is younger
# than its timeout: the runTimeout it registered with, or three times its recent batch
# interval (the longest of the last three gaps between its decisions) when that is
# longer. The data source never learns the trigger; this is what the trigger shows
# (docs/DESIGN.md invariant 10). One statement, so that recovery, forget and the CLI
# judge alike.
_RUNS = """
SELECT r.sink_id, r.run_id, r.first_seen, r.heartbeat_at,
       extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS age,
       extract(epoch FROM r.live_for)::float8 AS run_timeout,
       extract(epoch FROM g.batch_interval)::float8 AS batch_interval,
       extract(epoch FROM t.timeout)::float8 AS timeout,
       r.superseded_at, r.superseded_by, r.aborted_batch,
       (r.superseded_at IS NULL AND r.aborted_batch IS NULL
        AND r.heartbeat_at > clock_timestamp() - t.timeout) AS live
FROM sqlsink.runs r
CROSS JOIN LATERAL (
    SELECT max(gap) AS batch_interval FROM (
        SELECT decided_at - lag(decided_at) OVER (ORDER BY batch_id) AS gap
        FROM (SELECT batch_id, decided_at FROM sqlsink.decisions d
              WHERE d.sink_id = r.sink_id AND d.run_id = r.run_id
              ORDER BY batch_id DESC LIMIT 4) AS recent
    ) AS gaps
) AS g
CROSS JOIN LATERAL (SELECT greatest(r.live_for, 3 * g.batch_interval) AS timeout) AS t
WHERE (%(sink)s::text IS NULL OR r.sink_id = %(sink)s::text)
"""


@dataclass(frozen=True)
class RunInfo:
    """A run of a sink as the registry knows it (``sqlsink.runs``), judged as ``_RUNS`` does."""

    sink_id: str
    run_id: str
    first_seen: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    run_timeout_s: float  # the runTimeout it registered with
    batch_interval_s: float | None  # the longest of its last three gaps between decisions
    timeout_s: float  # live while heard from within this: max(runTimeout, 3 x interval)
    superseded_at: datetime | None
    superseded_by: str | None  # a newer run's id, or 'operator' (sqlsink recover --force)
    aborted_batch: int | None
    live: bool

    @property
    def state(self) -> str:
        """'fenced' (superseded), 'live', or 'dead' (timed out, or a batch aborted)."""
        return "fenced" if self.superseded_at is not None else "live" if self.live else "dead"


def runs(conn: Connection, sink_id: str | None) -> list[RunInfo]:
    """Every run of the sink (of every sink for None), the most recently seen first."""
    rows = conn.execute(
        f"{_RUNS} ORDER BY r.sink_id, r.first_seen DESC, r.run_id", {"sink": sink_id}
    ).fetchall()
    return [
        RunInfo(
            str(s), str(r), first, beat, float(age), float(run_timeout),
            None if interval is None else float(interval), float(timeout), sup,
            None if by is None else str(by), None if aborted is None else int(aborted), bool(live),
        )
        for s, r, first, beat, age, run_timeout, interval, timeout, sup, by, aborted, live in rows
    ]  # fmt: skip


def live_runs(conn: Connection, sink_id: str | None) -> dict[tuple[str, str], float]:
    """(sink, run) -> heartbeat age in seconds, for the live runs (``_RUNS``)."""
    rows = conn.execute(
        f"SELECT sink_id, run_id, age FROM ({_RUNS}) AS runs WHERE live", {"sink": sink_id}
    ).fetchall()
    return {(str(s), str(r)): float(age) for s, r, age in rows}


def fence_runs(conn: Connection, sink_id: str, run_ids: Collection[str]) -> list[str]:
    """Declare runs dead (``sqlsink recover --force``): superseded by 'operator', durably,
    so that they never decide, commit or resolve again (``register_run`` tells them so,
    and their late tasks roll back). Returns the runs this call fenced; one already
    superseded keeps its fencer."""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        # one at a time with register_run, which locks the same row
        conn.execute("SELECT 1 FROM sqlsink.sinks WHERE sink_id = %s FOR UPDATE", (sink_id,))
        rows = conn.execute(
            "UPDATE sqlsink.runs SET superseded_at = clock_timestamp(), "
            "superseded_by = 'operator' "
            "WHERE sink_id = %s AND run_id = ANY(%s) AND superseded_at IS NULL "
            "RETURNING run_id",
            (sink_id, list(run_ids)),
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


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
        "       d.completed_at IS NOT NULL, d.query_id, d.run_id, "
        "       extract(epoch FROM clock_timestamp() - d.decided_at)::float8 "
        "FROM sqlsink.decisions d "
        "LEFT JOIN unnest(%s::text[], %s::bigint[]) AS w(sink_id, batch_id) "
        "  ON w.sink_id = d.sink_id AND w.batch_id = d.batch_id "
        "WHERE w.sink_id IS NOT NULL "
        "   OR (d.completed_at IS NULL AND (%s::text IS NULL OR d.sink_id = %s::text))",
        ([s for s, _ in pairs], [b for _, b in pairs], sink_id, sink_id),
    ).fetchall()
    return {
        (s, b): Decision(s, b, frozenset(g), r, at, c, q, run, age)
        for s, b, g, r, at, c, q, run, age in rows
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
        crash_point("in_decision", batch_id)  # inside the transaction (tests pause here)
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
    """The batches are complete: say so, and delete their markers in the same
    transaction. Markers are read only to verify the gids of incomplete decisions, so
    once a batch is complete they go, and the commit log grows by one row per batch
    only. The consistent view shows a batch exactly when its markers are gone
    (invariant 13): one DELETE, so a reader sees all of them or none, and never the
    completion without the deletion (a crash between the two would hide the batch
    from the view for good)."""
    kept = False
    with conn.transaction():
        done = conn.execute(
            "UPDATE sqlsink.decisions SET completed_at = clock_timestamp() "
            "WHERE sink_id = %s AND batch_id = ANY(%s) AND completed_at IS NULL "
            "RETURNING batch_id",
            (sink_id, list(batch_ids)),
        ).fetchall()
        if done:
            try:
                with conn.transaction():  # a savepoint: a refusal keeps the completion
                    conn.execute(
                        "DELETE FROM sqlsink.markers WHERE sink_id = %s AND batch_id = ANY(%s)",
                        (sink_id, [row[0] for row in done]),
                    )
            except psycopg.errors.InsufficientPrivilege:
                kept = True
    if kept:
        warn_markers_kept()


def prune_decisions(conn: Connection, sink_id: str, through: int) -> int:
    """Retention (docs/DESIGN.md 4.2): complete decisions up to ``through`` go, and
    ``sinks.pruned_through`` says so; an incomplete decision is never pruned."""
    with conn.transaction():
        row = conn.execute(
            "WITH gone AS (DELETE FROM sqlsink.decisions WHERE sink_id = %(sink)s "
            "  AND batch_id <= %(through)s AND completed_at IS NOT NULL RETURNING batch_id) "
            "SELECT count(*), max(batch_id) FROM gone",
            {"sink": sink_id, "through": through},
        ).fetchone()
        deleted, highest = (0, None) if row is None else (int(row[0]), row[1])
        if highest is not None:
            conn.execute(
                "UPDATE sqlsink.sinks SET pruned_through = greatest(pruned_through, %s) "
                "WHERE sink_id = %s",
                (highest, sink_id),
            )
    return deleted


def forget_one_off_load(conn: Connection, sink_id: str) -> None:
    """A one-off batch load (no sinkId) is complete: its log is of no further use."""
    with conn.transaction():
        for table in ("markers", "decisions", "runs", "sinks"):
            conn.execute(f"DELETE FROM sqlsink.{table} WHERE sink_id = %s", (sink_id,))


# -- forgetting a retired sink (invariant 8: no advice may erase an incomplete decision) ---


@dataclass(frozen=True)
class Forgotten:
    decisions: int
    first_batch: int | None
    last_batch: int | None


def forget_sink(conn: Connection, sink_id: str) -> Forgotten:
    """Remove a finished sink's log, in one transaction; the caller holds the sink lock.

    Refused (ConfigError, nothing removed) while the sink has prepared transactions
    in this database, an incomplete decision, or a live run: those are exactly what
    the log is there to finish."""
    prefix = like_prefix(Gid.sink_prefix(sink_id))
    with conn.transaction():
        row = conn.execute(
            "SELECT ARRAY(SELECT gid FROM pg_prepared_xacts "
            "             WHERE gid LIKE %(prefix)s AND database = current_database()), "
            "       ARRAY(SELECT batch_id FROM sqlsink.decisions "
            "             WHERE sink_id = %(sink)s AND completed_at IS NULL ORDER BY 1), "
            f"       ARRAY(SELECT run_id FROM ({_RUNS}) AS runs WHERE live), "
            "       (SELECT count(*) FROM sqlsink.decisions WHERE sink_id = %(sink)s), "
            "       (SELECT min(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s), "
            "       (SELECT max(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s)",
            {"prefix": prefix, "sink": sink_id},
        ).fetchone()
        assert row is not None
        prepared = [g for g in row[0] if Gid.parse(str(g)) is not None]
        incomplete, live = list(row[1]), list(row[2])
        if prepared or incomplete or live:
            raise ConfigError(_refusal(sink_id, prepared, incomplete, live), sink_id=sink_id)
        conn.execute("SELECT set_config('sqlsink.forget', %s, true)", (sink_id,))
        for table in ("markers", "decisions", "runs", "sinks"):
            conn.execute(f"DELETE FROM sqlsink.{table} WHERE sink_id = %s", (sink_id,))
        return Forgotten(int(row[3]), row[4], row[5])


def _refusal(sink_id: str, prepared: list[str], incomplete: list[int], live: list[str]) -> str:
    parts = []
    if prepared:
        parts.append(f"{len(prepared)} prepared transaction(s) ({', '.join(prepared[:3])})")
    if incomplete:
        parts.append(f"incomplete batch(es) {', '.join(map(str, incomplete[:10]))}")
    if live:
        parts.append(
            f"a live run ({', '.join(live)}) heard from within its timeout (runTimeout, "
            "or 3 x its batch interval if longer)"
        )
    fix = (
        "stop the query first, or wait for its timeout (sqlsink status shows it)"
        if live and not (prepared or incomplete)
        else f"run sqlsink recover --sink-id {sink_id} first (and stop the query if it runs)"
    )
    return (
        f"sink {sink_id} is not finished: it has {'; '.join(parts)}. Forgetting it now would "
        f"lose what its log is there to complete. Nothing was removed. Fix: {fix}, then run "
        "sqlsink forget again"
    )


# -- the checkpoint against the log (invariant 9; core/checkpoint_check.py) ----------------


def checkpoint_run_check(conn: Connection, sink_id: str, run_id: str) -> RunCheck:
    """Whether this run has a checkpoint check recorded, and the sink's highest decision."""
    row = conn.execute(
        "SELECT coalesce((SELECT checkpoint_checked_at IS NOT NULL FROM sqlsink.runs "
        "                 WHERE sink_id = %(sink)s AND run_id = %(run)s), false), "
        "       (SELECT max(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s)",
        {"sink": sink_id, "run": run_id},
    ).fetchone()
    assert row is not None
    return RunCheck(bool(row[0]), None if row[1] is None else int(row[1]))


def checkpoint_coverage(conn: Connection, sink_id: str, batch_ids: Collection[int]) -> LogCoverage:
    """Which of these batches are decided, the lowest decision kept, ``pruned_through``:
    one snapshot, so a pruning cannot fall between them."""
    row = conn.execute(
        "SELECT (SELECT min(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s), "
        "       (SELECT pruned_through FROM sqlsink.sinks WHERE sink_id = %(sink)s), "
        "       ARRAY(SELECT batch_id FROM sqlsink.decisions "
        "             WHERE sink_id = %(sink)s AND batch_id = ANY(%(batches)s::bigint[]))",
        {"sink": sink_id, "batches": sorted(batch_ids)},
    ).fetchone()
    assert row is not None
    first, pruned, decided = row
    return LogCoverage(
        None if first is None else int(first),
        None if pruned is None else int(pruned),
        frozenset(int(b) for b in decided),
    )


def record_checkpoint_check(
    conn: Connection,
    sink_id: str,
    run_id: str,
    batch_id: int,
    location: str | None,
    verdict: Verdict,
) -> None:
    """Record the run's latest check (``sqlsink status`` shows it)."""
    conn.execute(
        "UPDATE sqlsink.runs SET checkpoint_verdict = %s, checkpoint_detail = %s, "
        "checkpoint_lost = %s, checkpoint_location = %s, checkpoint_batch = %s, "
        "checkpoint_checked_at = clock_timestamp() WHERE sink_id = %s AND run_id = %s",
        (verdict.kind, verdict.detail, list(verdict.lost), location, batch_id, sink_id, run_id),
    )


@dataclass(frozen=True)
class CheckpointCheckRow:
    """One run's checkpoint check, for ``sqlsink status``."""

    run_id: str
    newest: bool  # the sink's newest run (not superseded)
    verdict: str  # verified | loss | unverified | off
    detail: str
    lost: tuple[int, ...]  # batches Spark committed that the log lacks
    location: str | None
    batch_id: int | None  # the batch whose commit ran the check
    checked_at: datetime


def checkpoint_checks(conn: Connection, sink_id: str, limit: int = 5) -> list[CheckpointCheckRow]:
    """The sink's most recent checkpoint checks, newest first (runs never checked are
    left out: a run checks at its first commit)."""
    rows = conn.execute(
        "SELECT run_id, superseded_at IS NULL, checkpoint_verdict, checkpoint_detail, "
        "       coalesce(checkpoint_lost, '{}'), checkpoint_location, checkpoint_batch, "
        "       checkpoint_checked_at "
        "FROM sqlsink.runs WHERE sink_id = %s AND checkpoint_checked_at IS NOT NULL "
        "ORDER BY checkpoint_checked_at DESC LIMIT %s",
        (sink_id, limit),
    ).fetchall()
    return [
        CheckpointCheckRow(
            str(run),
            bool(newest),
            str(verdict),
            str(detail or ""),
            tuple(int(b) for b in lost),
            None if location is None else str(location),
            None if batch is None else int(batch),
            checked_at,
        )
        for run, newest, verdict, detail, lost, location, batch, checked_at in rows
    ]
