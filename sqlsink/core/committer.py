"""The committer: decides batches and resolves prepared transactions.

Each row is a point where the driver (or a task, or PostgreSQL) can die, what
that leaves behind, and what resolves it. "Resolve" is ``plan_resolution`` run
under the sink lock, by the next ``commit_batch``, by the pre-write check of the
next run's tasks, or by ``sqlsink recover``.

| step (batch N)                   | a crash here leaves            | resolved by                  |
|----------------------------------|--------------------------------|------------------------------|
| task: BEGIN .. COPY .. marker    | nothing (server rolls back)    | -                            |
| task: PREPARE, attempt then lost | a gid no message names         | rolled back: N's commit or   |
|                                  |                                | a later one                  |
| all prepared, no decision yet    | prepared gids, no decision     | rolled back; Spark re-runs N |
| decision, COMMIT PREPARED ..     | some committed, some prepared  | the rest committed; re-run   |
|                                  |                                | of N skips (decision exists) |
| all committed, no commits/N yet  | everything committed           | re-run: tasks skip, no-op    |
| ``commit_batch`` raises          | Spark calls ``abort_batch``    | roll back only if undecided  |
| decided, then a failover that    | N's gids prepared, undecided;  | left by all; N+1's commit    |
| kept N's PREPAREs, not decision  | Spark has commits/N, runs N+1  | raises; recover --commit-lost|

Deciding requires every gid of the batch to be still prepared, checked under the
sink lock; resolution takes the same lock. So a gid that a resolution rolled back
can never be named by a decision written afterwards, and a decided gid found
neither prepared nor with a visible marker is data loss: reported, never skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from sqlsink.core.admission import check_binding, check_forward, fenced_error, refuses
from sqlsink.core.backend import TwoPhaseBackend, ViewKeeper
from sqlsink.core.checkpoint_check import CheckpointCheck, lost_decision_error
from sqlsink.core.faults import crash_point
from sqlsink.core.model import (
    BatchFigures,
    Binding,
    NewDecision,
    PartitionOutcome,
    ResolutionReport,
)
from sqlsink.core.recovery import Recovery
from sqlsink.core.resolution import Plan, Scope
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.errors import CommitError

log = logging.getLogger("sqlsink")

DEFAULT_RUN_TIMEOUT_S = 300.0  # the option runTimeout
DEFAULT_KEEP_BATCHES = 1000  # the option keepBatches: decisions kept (retention)
PRUNE_EVERY = 100  # batches between two prunings (one DELETE per hundred batches)


class Committer:
    """The protocol's driver side for one sink (or, for recovery, all sinks: ``sink_id=None``).

    This module owns the batch's own path (who may write, the decision, retention, the
    abort); the resolution of prepared transactions is ``core/recovery.py``'s, its commit
    loop ``core/resolver.py``'s."""

    def __init__(
        self,
        backend: TwoPhaseBackend,
        sink_id: str | None,
        *,
        timeouts: TimeoutPolicy | None = None,
        clock: Callable[[], float] = time.time,
        run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
        keep_batches: int = DEFAULT_KEEP_BATCHES,
        checkpoint_check: CheckpointCheck | None = None,
        view: ViewKeeper | None = None,
        tables: Sequence[str] = (),
    ) -> None:
        self.backend = backend
        self.sink_id = sink_id
        self.timeouts = timeouts or TimeoutPolicy()
        self.clock = clock  # injectable: tests move time, not sleep
        self.run_timeout_s = run_timeout_s  # a run is live while heard from this recently
        self.keep_batches = max(1, keep_batches)  # the highest decided batch always stays
        # a stream's checkpoint against the log (invariant 9), at commits only
        self.checkpoint_check = checkpoint_check
        # the consistent view (invariant 13): made right before a batch can become visible
        self.view = view
        self.tables = tuple(tables)  # what a decision records the batch wrote (status names them)
        # the resolution of prepared transactions (core/recovery.py), and its commit loop
        self.recovery = Recovery(backend, sink_id, self.timeouts, clock)
        self.resolver = self.recovery.resolver

    def register(
        self,
        run_id: str | None,
        *,
        holds_lock: bool,
        writer: Binding | None = None,
        token: str | None = None,
        load: bool = False,
        decided: bool = False,
    ) -> None:
        """Record the run (invariant 10); a FencedError when a newer run superseded it.
        ``load``: the run is a named batch load's (also known from ``writer``); ``decided``:
        its batch is decided already (an abort after a failed commit): for the error's text.

        With ``writer``: the binding check and the registration are one step (the sink's
        row locked), so a writer the sink refuses never supersedes the owner's run, even
        when the owner's first decision lands just before (found by tests/sim)."""
        if run_id is None:
            return
        sink_id = self.required_sink()

        def admit(bound: Binding | None, highest: int | None) -> None:
            if writer is not None:
                check_binding(sink_id, bound, highest, writer)

        fenced_by = self.backend.register_run(
            sink_id, run_id, self.run_timeout_s, holds_lock=holds_lock, admit=admit, token=token
        )
        if fenced_by is not None:
            is_load = load or (writer is not None and writer.kind == "load")
            raise fenced_error(sink_id, run_id, fenced_by, load=is_load, decided=decided)

    # -- who may write (invariants 8 and 9) ---------------------------------------------

    def check_writer(self, writer: Binding | None, batch_id: int) -> int | None:
        """Under the sink lock: refuse another writer, or a batch behind the decided ones.
        Returns the sink's highest decided batch."""
        sink_id = self.required_sink()
        highest = self.backend.highest_decided(sink_id)
        if writer is not None:
            bound = self.backend.binding(sink_id)
            check_binding(sink_id, bound, highest, writer)
            if bound != writer:
                self.backend.bind(sink_id, writer)
        check_forward(sink_id, batch_id, highest)
        return highest

    # -- the batch ---------------------------------------------------------------------

    def commit_batch(
        self,
        batch_id: int,
        outcomes: Sequence[PartitionOutcome | None],
        *,
        query_id: str | None,
        run_id: str | None,
        load: bool = False,
    ) -> ResolutionReport:
        """Decide batch N (once) and commit exactly its decided gids. Idempotent.

        ``load``: a named batch load (else a streaming query, known by ``query_id``
        when any task reported it)."""
        sink_id = self.required_sink()
        writer = Binding("load") if load else Binding.of(query_id) if query_id else None
        # before waiting for the lock: a refused writer fences nobody, and a newer run
        # supersedes an older one at once, so that a paused older holder of the lock is
        # provably fenced and can be ended (locks.sink_lock). A run's registration checks
        # the binding itself (``admit``, the sink's row locked) before it records anything
        if writer is not None and run_id is None:
            check_binding(
                sink_id,
                self.backend.binding(sink_id),
                self.backend.highest_decided(sink_id),
                writer,
            )
        self.register(run_id, holds_lock=False, writer=writer)
        with self.backend.sink_lock(sink_id):
            report, commit_ms, figures = self._commit_locked(
                batch_id, outcomes, writer, query_id, run_id, load
            )
        self._log_batch(batch_id, outcomes, report, commit_ms, figures)
        return report

    def _commit_locked(
        self,
        batch_id: int,
        outcomes: Sequence[PartitionOutcome | None],
        writer: Binding | None,
        query_id: str | None,
        run_id: str | None,
        load: bool,
    ) -> tuple[ResolutionReport, float, BatchFigures | None]:
        """``commit_batch`` under the sink lock: the report, the resolution's time, and the
        batch's figures when this call wrote its decision (a replay's keep the first's)."""
        sink_id = self.required_sink()
        highest = self.check_writer(writer, batch_id)
        self.register(run_id, holds_lock=True, load=load or query_id is None)
        if run_id is not None and not load:
            # before deciding: batches Spark committed that the log lacks stop here, and so
            # do undecided leftovers below N (their decision was lost: deciding N would
            # leave them below the highest decided batch, where a sweep rolls them back)
            lost = self.resolver.lost_decisions(batch_id, highest)
            if self.checkpoint_check is not None:
                self.checkpoint_check.at_commit(sink_id, run_id, batch_id, prepared=lost)
            elif lost:
                raise lost_decision_error(sink_id, lost, batch_id)
        if self.view is not None:
            # before anything of the batch is committed: a refusal rolls it back
            self.view.keep(sink_id)
        decision = self.backend.decisions(sink_id, [(sink_id, batch_id)]).get((sink_id, batch_id))
        decided_now: list[PartitionOutcome] | None = None  # when this call wrote the decision
        decided_at = decision_ms = 0.0
        if decision is None:
            crash_point("before_decision", batch_id)
            started = time.monotonic()
            present, written = self._decide(batch_id, outcomes, query_id, run_id)
            if written:  # (decided meanwhile by another hand-over: its figures stand)
                decided_now, decided_at = present, self.clock()
                decision_ms = (time.monotonic() - started) * 1000
            crash_point("after_decision", batch_id)
        decided = time.monotonic()
        # N is decided now and nothing above it (check_forward): N is the highest decided
        scope = Scope.live(run_id, batch_id).knowing(batch_id) if run_id else self.recovery_scope()
        report = self.recovery.resolve(scope)
        commit_ms = (time.monotonic() - decided) * 1000
        figures = None
        if decided_now is not None:
            figures = BatchFigures.of(
                decided_now,
                decided_at=decided_at,
                decision_ms=decision_ms,
                report=report,
                commit_ms=commit_ms,
            )
        # the figures go in the same statement as commit_ms: no round trip more per batch
        self.backend.record_metrics(
            sink_id, batch_id, commit_ms, len(report.rolled_back), figures=figures
        )
        self._prune(batch_id)
        crash_point("after_commit", batch_id)
        return report, commit_ms, figures

    def _log_batch(
        self,
        batch_id: int,
        outcomes: Sequence[PartitionOutcome | None],
        report: ResolutionReport,
        commit_ms: float,
        figures: BatchFigures | None,
    ) -> None:
        """The batch's one log line, said from its figures (so the commit log holds all
        it says), and the transaction-timeout warning."""
        written = [o for o in outcomes if o is not None and o.gid is not None]
        self.resolver.warn_old((o.gid, o.started_at) for o in written if o.gid in report.committed)
        if figures is not None:
            log.info("%s", figures.line(self.sink_id, batch_id, self.backend.commit_statement))
            return
        log.info(
            "sqlsink %s: batch %d: decided before (its figures are the first commit's), "
            "%s and completion %.1f ms, %d orphan(s) swept",
            self.sink_id,
            batch_id,
            self.backend.commit_statement,
            commit_ms,
            len(report.rolled_back),
        )

    def _prune(self, batch_id: int) -> None:
        """Retention: keep the newest ``keep_batches`` decisions (the highest one is what
        invariant 9 and a replay need), every incomplete one, and prune the rest."""
        through = batch_id - self.keep_batches
        if batch_id % PRUNE_EVERY == 0 and through >= 0:
            self.backend.prune_decisions(self.required_sink(), through)

    def _decide(
        self,
        batch_id: int,
        outcomes: Sequence[PartitionOutcome | None],
        query_id: str | None,
        run_id: str | None,
    ) -> tuple[list[PartitionOutcome], bool]:
        """Write the decision: exactly the gids the messages name, all still prepared.
        Returns the outcomes decided and whether this call wrote the decision."""
        present = self._decidable(batch_id, outcomes, run_id)
        written = [o for o in present if o.gid is not None]
        wrote = self.backend.insert_decision(
            NewDecision(
                self.required_sink(),
                batch_id,
                tuple(o.gid for o in written if o.gid is not None),
                sum(o.rows for o in present),
                query_id,
                run_id,
                partitions=len(written),
                first_write_at=min((o.started_at for o in written), default=None),
                tables=self.tables,
            )
        )
        return present, wrote

    def _decidable(
        self, batch_id: int, outcomes: Sequence[PartitionOutcome | None], run_id: str | None
    ) -> list[PartitionOutcome]:
        """The outcomes, once nothing forbids deciding them (else a CommitError)."""
        if any(o is None for o in outcomes):
            raise CommitError(
                f"batch {batch_id}: a task reported no result; the batch is not decided "
                "and Spark retries it",
                batch=batch_id,
            )
        present = [o for o in outcomes if o is not None]
        if any(o.skipped for o in present):
            raise CommitError(
                f"batch {batch_id}: tasks found the batch decided, but its decision is gone "
                "from sqlsink.decisions (deleted by hand?); restart the query so the batch is "
                "written again",
                batch=batch_id,
            )
        still_prepared = {t.gid for t in self.backend.prepared(self.required_sink())}
        for outcome in present:
            if outcome.gid is not None and outcome.gid not in still_prepared:
                raise CommitError(
                    f"batch {batch_id}, partition {outcome.partition_id}: transaction "
                    f"{outcome.gid} is no longer prepared: {self._gone_why(run_id)}. Nothing "
                    "of the batch is committed; run it again (a streaming query writes it "
                    "again when restarted)",
                    batch=batch_id,
                    partition=outcome.partition_id,
                    gid=outcome.gid,
                )
        return present

    def _gone_why(self, run_id: str | None) -> str:
        """Who can have rolled back a transaction of this batch before its decision. Not a
        newer run (this commit registered under the sink lock, so it would be fenced) nor
        this commit. The run, registered just now, is live unless an abort ended it."""
        by_hand = self.backend.rollback_statement  # the database's own: XA ROLLBACK on MariaDB
        if run_id is None:
            return f"rolled back by sqlsink recover or by hand ({by_hand})"
        if (self.required_sink(), run_id) not in self.backend.live_runs(self.sink_id):
            return (
                f"rolled back by an abort of run {run_id} (Spark aborted a batch of it, or an "
                "abort in this driver took it for its own: sqlsink status shows the run as "
                f"over), or by hand ({by_hand})"
            )
        return (
            f"rolled back by sqlsink recover while run {run_id} was not heard from within its "
            "timeout (no task of it started or prepared, no commit, no heartbeat: raise "
            "runTimeout above the longest such gap: docs/reference/options.md, "
            f"'runTimeout'), or by hand ({by_hand})"
        )

    def abort_batch(
        self,
        batch_id: int,
        outcomes: Sequence[PartitionOutcome | None],
        *,
        run_id: str | None,
        query_id: str | None = None,
        load: bool = False,
        writer_token: str | None = None,
    ) -> ResolutionReport:
        """Roll back this run's batch N unless it is decided; a decided batch is rolled
        forward. Never acts beyond its own run, nor for a writer the sink refused.

        An undecided batch's late tasks are told so (``mark_aborted``) and roll themselves
        back after PREPARE. An abort acts only for a run it can prove is its own: one a
        task of the batch reported, or the caller's (a load's, the foreachBatch writer's);
        when no task reported, the run its tasks registered with the writer's token, and
        only with the query known and the sink bound to it (or to nobody yet). Otherwise
        it touches nothing and says what stays prepared and who resolves it. Once the
        batch's task sessions still connected have ended (Spark kills them), it sweeps the
        batch again.

        ``writer_token``: the driver's (spark/driver_token.py). When no task reported
        (the failed ones report nothing, the running ones not yet), the run is the
        newest one whose tasks registered with it: this driver's. It must name the
        writer's driver and query together (spark/driver_token.run_token), and is used only
        when no run id is known and the query id is."""
        sink_id = self.required_sink()
        backend = self.backend
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
            self.register(run_id, holds_lock=True, load=load or query_id is None, decided=mine)
            if not decided:  # its late tasks roll themselves back (Participant.after_prepare)
                backend.mark_aborted(sink_id, run_id, batch_id)
            report = self.recovery.resolve(Scope.aborting(run_id, batch_id))
        report = self._after_late_tasks(run_id, batch_id, report)
        log.warning(
            "sqlsink %s: batch %d aborted (%s): %d rolled back, %d committed",
            sink_id,
            batch_id,
            "decided, rolled forward" if decided else "undecided",
            len(report.rolled_back),
            len(report.committed),
        )
        return report

    def _after_late_tasks(
        self, run_id: str, batch_id: int, report: ResolutionReport
    ) -> ResolutionReport:
        """Sweep the aborted batch again once its tasks still connected have ended.

        A task still loading when the sweep read the prepared transactions rolls itself
        back after its PREPARE (``Participant.after_prepare``), unless its process is
        ended in between: Spark kills the other tasks of a failed job, and ends a killed
        task's Python worker ``spark.python.task.killTimeout`` (2 s) later. Its
        transaction would stay prepared, holding its locks and a slot, until the next
        run or a recover. So wait (bounded) for the batch's task sessions to end, and
        sweep again (found by tests/spark/test_secrets.py under load)."""
        sink_id = self.required_sink()
        seen, left = self.backend.await_batch_tasks(sink_id, batch_id, ABORT_GRACE_S)
        if seen:
            with self.backend.sink_lock(sink_id):
                again = self.recovery.resolve(Scope.aborting(run_id, batch_id))
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

    # -- recovery ----------------------------------------------------------------------

    def recover(self, *, dry_run: bool = False) -> tuple[Plan, ResolutionReport]:
        """Resolve every prepared gid of the sink (of every sink when ``sink_id`` is None)."""
        return self.recovery.run(self.recovery_scope, dry_run=dry_run)

    def recovery_scope(self) -> Scope:
        """Everything but the gids of live runs (a fresh heartbeat, not fenced)."""
        live = self.backend.live_runs(self.sink_id)
        return Scope.everything(frozenset(run for _, run in live))

    def resolve_leftovers(self, run_id: str, batch_id: int) -> ResolutionReport:
        """Before a task of a live run writes: resolve what dead runs left (their locks)."""
        with self.backend.sink_lock(self.required_sink()):
            # fenced while it waited for the lock? then "live" would mean the old run, and
            # the newest run's in-flight gids would be swept (found by tests/sim)
            self.register(run_id, holds_lock=True)
            return self.recovery.resolve(Scope.live(run_id, batch_id))

    def plan(self, scope: Scope) -> Plan:
        """The plan for the current state, without acting (races unless the lock is held)."""
        return self.recovery.plan(scope)

    def required_sink(self) -> str:
        """The sink id, for the operations that act on one sink (a ValueError without)."""
        if self.sink_id is None:
            raise ValueError("this operation needs a sink id")
        return self.sink_id


# how long an abort waits for its batch's tasks still connected (Spark kills them)
ABORT_GRACE_S = 10.0


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
