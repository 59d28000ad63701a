"""Abort: what ``Committer.abort_batch`` does when Spark gives up on a batch.

An undecided batch of this run is rolled back (its late tasks are told so, and roll
themselves back after PREPARE); a decided one is rolled forward. An abort acts only
for a run it can prove is its own: one a task of the batch reported, or the caller's
(a load's, the foreachBatch writer's); when no task reported, the run its tasks
registered with the writer's token, which names the driver and the query
(spark/driver_token.py), and only with the query known and the sink bound to it (or
to nobody yet). Otherwise, and for a writer the sink refuses, it touches nothing and
says what stays prepared and who resolves it. Once the batch's task sessions still
connected have ended (Spark kills them), it sweeps the batch again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlsink.core.admission import refuses
from sqlsink.core.model import Binding, PartitionOutcome, ResolutionReport
from sqlsink.core.resolution import Scope

if TYPE_CHECKING:
    from sqlsink.core.committer import Committer

log = logging.getLogger("sqlsink")

# how long an abort waits for its batch's tasks still connected (Spark kills them)
ABORT_GRACE_S = 10.0


def abort_batch(
    committer: Committer,
    batch_id: int,
    outcomes: Sequence[PartitionOutcome | None],
    *,
    run_id: str | None,
    query_id: str | None,
    load: bool,
    writer_token: str | None,
) -> ResolutionReport:
    """``Committer.abort_batch``: roll back this run's batch N unless it is decided.

    ``writer_token``: the token the batch's tasks registered their run with; it must
    name the writer's driver and query together (spark/driver_token.run_token), and
    is used only when no run id is known and the query id is."""
    sink_id = committer.required_sink()
    backend = committer.backend
    run_id = run_id or next((o.run_id for o in outcomes if o and o.run_id), None)
    query_id = query_id or next((o.query_id for o in outcomes if o and o.query_id), None)
    writer = Binding("load") if load else Binding.of(query_id) if query_id else None
    if run_id is None:
        if writer is None:
            why = "its streaming query is unknown (no run can be proved its own)"
        elif writer_token is None:
            why = "its run is unknown (no task reported it, and this driver has no token)"
        else:  # the token names the driver and the query: a run found is this query's
            run_id = backend.run_of_token(sink_id, writer_token)
            why = (
                f"no run of {writer.describe()} registered from this driver (its tasks were "
                "refused before writing, or none had started)"
            )
        if run_id is None:
            _warn_run_unknown(sink_id, batch_id, why)
            return ResolutionReport()
    with backend.sink_lock(sink_id):
        bound = backend.binding(sink_id)
        highest = backend.highest_decided(sink_id)
        if writer is not None and refuses(bound, highest, writer):
            log.warning(
                "sqlsink %s: batch %d of %s aborted; the sink belongs to %s, so this "
                "abort touches nothing: this writer's tasks are refused before they "
                "write, and what other runs left prepared is resolved by the owner's "
                "next batch, or by sqlsink recover --sink-id %s",
                sink_id,
                batch_id,
                writer.describe(),
                bound.describe() if bound else "nobody",
                sink_id,
            )
            return ResolutionReport()
        decision = backend.decisions(sink_id, [(sink_id, batch_id)]).get((sink_id, batch_id))
        decided = decision is not None
        mine = decision is not None and decision.run_id == run_id  # a fenced load: rows in
        committer.register(run_id, holds_lock=True, load=load or query_id is None, decided=mine)
        if not decided:  # its late tasks roll themselves back (Participant.after_prepare)
            backend.mark_aborted(sink_id, run_id, batch_id)
        report = committer.resolver.resolve(Scope.aborting(run_id, batch_id), dry_run=False)[1]
    report = after_late_tasks(committer, run_id, batch_id, report)
    log.warning(
        "sqlsink %s: batch %d aborted (%s): %d rolled back, %d committed",
        sink_id,
        batch_id,
        "decided, rolled forward" if decided else "undecided",
        len(report.rolled_back),
        len(report.committed),
    )
    return report


def _warn_run_unknown(sink_id: str, batch_id: int, why: str) -> None:
    log.warning(
        "sqlsink %s: batch %d aborted before any task reported; %s, so this abort "
        "touches nothing: a transaction a task of it prepared stays prepared until the "
        "query starts again (its first task resolves it), or until sqlsink recover "
        "--sink-id %s once the run's heartbeat is older than runTimeout (sqlsink status "
        "names the run; recover --force --run-id RUN at once)",
        sink_id,
        batch_id,
        why,
        sink_id,
    )


def after_late_tasks(
    committer: Committer, run_id: str, batch_id: int, report: ResolutionReport
) -> ResolutionReport:
    """Sweep the aborted batch again once its tasks still connected have ended.

    A task still loading when the sweep read the prepared transactions rolls itself
    back after its PREPARE (``Participant.after_prepare``), unless its process is
    ended in between: Spark kills the other tasks of a failed job, and ends a killed
    task's Python worker ``spark.python.task.killTimeout`` (2 s) later. Its
    transaction would stay prepared, holding its locks and a slot, until the next
    run or a recover. So wait (bounded) for the batch's task sessions to end, and
    sweep again (found by tests/spark/test_secrets.py under load)."""
    sink_id = committer.required_sink()
    seen, left = committer.backend.await_batch_tasks(sink_id, batch_id, ABORT_GRACE_S)
    if seen:
        with committer.backend.sink_lock(sink_id):
            scope = Scope.aborting(run_id, batch_id)
            again = committer.resolver.resolve(scope, dry_run=False)[1]
        report = ResolutionReport(
            committed=[*report.committed, *again.committed],
            rolled_back=[*report.rolled_back, *again.rolled_back],
            left=again.left,  # what is left is what the second sweep left
            already_committed=[*report.already_committed, *again.already_committed],
            lost=[*report.lost, *again.lost],
            completed_batches=sorted({*report.completed_batches, *again.completed_batches}),
        )
    if left:
        log.warning(
            "sqlsink %s: batch %d aborted while %d of its task session(s) (pid %s) were "
            "still connected after %.0f s; a task that prepares later rolls itself "
            "back, and if its process is killed first, the next run of the query or "
            "sqlsink recover --sink-id %s rolls its transaction back",
            sink_id,
            batch_id,
            len(left),
            ", ".join(map(str, left)),
            ABORT_GRACE_S,
            sink_id,
        )
    return report
