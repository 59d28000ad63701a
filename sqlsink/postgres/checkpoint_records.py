"""The checkpoint check's rows on the commit log (invariant 9; core/checkpoint_check.py).

What the check reads (whether a run was checked, which batches the log decided and
what retention pruned) and what it records on the run's row of ``sqlsink.runs``,
which ``sqlsink status`` shows.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlsink.core.admin import CheckpointCheckRow
from sqlsink.core.checkpoint_check import LogCoverage, RunCheck, Verdict
from sqlsink.postgres.connection import Connection


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
