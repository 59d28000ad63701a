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

Deciding requires every gid of the batch to be still prepared, checked under the
sink lock; resolution takes the same lock. So a gid that a resolution rolled back
can never be named by a decision written afterwards, and a decided gid found
neither prepared nor with a visible marker is data loss: reported, never skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sqlsink.core.backend import TwoPhaseBackend, ViewKeeper
from sqlsink.core.checkpoint_check import CheckpointCheck
from sqlsink.core.faults import crash_point
from sqlsink.core.gid import Gid
from sqlsink.core.model import Binding, Decision, PartitionOutcome, ResolutionReport
from sqlsink.core.resolution import Action, Plan, Scope, plan_resolution
from sqlsink.errors import (
    CheckpointError,
    CommitError,
    DataLossError,
    FencedError,
    SinkBindingError,
)

log = logging.getLogger("sqlsink")

DEFAULT_RUN_TIMEOUT_S = 300.0  # the option runTimeout
DEFAULT_KEEP_BATCHES = 1000  # the option keepBatches: decisions kept (retention)
PRUNE_EVERY = 100  # batches between two prunings (one DELETE per hundred batches)
# how long an abort waits for its batch's tasks still connected (Spark kills them)
ABORT_GRACE_S = 10.0


@dataclass(frozen=True)
class TimeoutPolicy:
    """Flink's transaction-timeout options (transactionTimeout, ...WarningRatio, ignore...)."""

    timeout_s: float | None = None
    warning_ratio: float = 0.8
    ignore_commit_failures_after_timeout: bool = False

    def warning_after_s(self) -> float | None:
        return None if self.timeout_s is None else self.timeout_s * self.warning_ratio


class Committer:
    """The protocol's driver side for one sink (or, for recovery, all sinks: ``sink_id=None``)."""

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

    def register(
        self,
        run_id: str | None,
        *,
        holds_lock: bool,
        writer: Binding | None = None,
        token: str | None = None,
    ) -> None:
        """Record the run (invariant 10); a FencedError when a newer run superseded it.

        With ``writer``: the binding check and the registration are one step (the sink's
        row locked), so a writer the sink refuses never supersedes the owner's run, even
        when the owner's first decision lands just before (found by tests/sim)."""
        if run_id is None:
            return
        sink_id = self._sink()

        def admit(bound: Binding | None, highest: int | None) -> None:
            if writer is not None:
                check_binding(sink_id, bound, highest, writer)

        fenced_by = self.backend.register_run(
            sink_id, run_id, self.run_timeout_s, holds_lock=holds_lock, admit=admit, token=token
        )
        if fenced_by is not None:
            raise fenced_error(sink_id, run_id, fenced_by)

    # -- who may write (invariants 8 and 9) ---------------------------------------------

    def check_writer(self, writer: Binding | None, batch_id: int) -> None:
        """Under the sink lock: refuse another writer, or a batch behind the decided ones."""
        sink_id = self._sink()
        highest = self.backend.highest_decided(sink_id)
        if writer is not None:
            bound = self.backend.binding(sink_id)
            check_binding(sink_id, bound, highest, writer)
            if bound != writer:
                self.backend.bind(sink_id, writer)
        check_forward(sink_id, batch_id, highest)

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
        sink_id = self._sink()
        writer = Binding("load") if load else Binding.of(query_id) if query_id else None
        # before waiting for the lock: a refused writer fences nobody, and a newer run
        # supersedes an older one at once, so that a paused older holder of the lock is
        # provably fenced and can be ended (locks.sink_lock)
        if writer is not None:
            check_binding(
                sink_id,
                self.backend.binding(sink_id),
                self.backend.highest_decided(sink_id),
                writer,
            )
        self.register(run_id, holds_lock=False, writer=writer)
        with self.backend.sink_lock(sink_id):
            self.check_writer(writer, batch_id)
            self.register(run_id, holds_lock=True)
            if self.checkpoint_check is not None and run_id is not None and not load:
                # before deciding: batches Spark committed that the log lacks stop here
                self.checkpoint_check.at_commit(sink_id, run_id, batch_id)
            if self.view is not None:
                # before anything of the batch is committed: a refusal rolls it back
                self.view.keep(sink_id)
            decision = self.backend.decisions(sink_id, [(sink_id, batch_id)]).get(
                (sink_id, batch_id)
            )
            if decision is None:
                crash_point("before_decision", batch_id)
                self._decide(batch_id, outcomes, query_id, run_id)
                crash_point("after_decision", batch_id)
            decided = time.monotonic()
            scope = Scope.live(run_id, batch_id) if run_id else self.recovery_scope()
            report = self._resolve(scope, dry_run=False)[1]
            commit_ms = (time.monotonic() - decided) * 1000
            self.backend.record_metrics(sink_id, batch_id, commit_ms, len(report.rolled_back))
            self._prune(batch_id)
            crash_point("after_commit", batch_id)
        written = [o for o in outcomes if o is not None and o.gid is not None]
        self._warn_old((o.gid, o.started_at) for o in written if o.gid in report.committed)
        first_write = min((o.started_at for o in written), default=None)
        log.info(
            "sqlsink %s: batch %d: %d partitions, %d rows, first write to decision %s, "
            "COMMIT PREPARED %.1f ms, %d orphan(s) swept",
            sink_id,
            batch_id,
            len(written),
            sum(o.rows for o in written),
            "-"
            if first_write is None
            else f"{(self.clock() - first_write) * 1000 - commit_ms:.0f} ms",
            commit_ms,
            len(report.rolled_back),
        )
        return report

    def _prune(self, batch_id: int) -> None:
        """Retention: keep the newest ``keep_batches`` decisions (the highest one is what
        invariant 9 and a replay need), every incomplete one, and prune the rest."""
        through = batch_id - self.keep_batches
        if batch_id % PRUNE_EVERY == 0 and through >= 0:
            self.backend.prune_decisions(self._sink(), through)

    def _decide(
        self,
        batch_id: int,
        outcomes: Sequence[PartitionOutcome | None],
        query_id: str | None,
        run_id: str | None,
    ) -> None:
        sink_id = self._sink()
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
        still_prepared = {t.gid for t in self.backend.prepared(sink_id)}
        for outcome in present:
            if outcome.gid is not None and outcome.gid not in still_prepared:
                raise CommitError(
                    f"batch {batch_id}, partition {outcome.partition_id}: transaction "
                    f"{outcome.gid} is no longer prepared (rolled back by a recovery of "
                    "another run of this sink, or by hand); the batch is rolled back and "
                    "Spark retries it",
                    batch=batch_id,
                    partition=outcome.partition_id,
                    gid=outcome.gid,
                )
        gids = [o.gid for o in present if o.gid is not None]
        rows = sum(o.rows for o in present)
        written = [o for o in present if o.gid is not None]
        self.backend.insert_decision(
            sink_id,
            batch_id,
            gids,
            rows,
            query_id,
            run_id,
            partitions=len(written),
            first_write_at=min((o.started_at for o in written), default=None),
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

        ``writer_token``: the driver's (spark/driver_token.py). When no task reported
        (the failed ones report nothing, the running ones not yet), the run is the
        newest one whose tasks registered with it: this driver's."""
        sink_id = self._sink()
        run_id = run_id or next((o.run_id for o in outcomes if o and o.run_id), None)
        if run_id is None and writer_token is not None:
            run_id = self.backend.run_of_token(sink_id, writer_token)
        query_id = query_id or next((o.query_id for o in outcomes if o and o.query_id), None)
        writer = Binding("load") if load else Binding.of(query_id) if query_id else None
        if run_id is None:
            log.warning(
                "sqlsink %s: batch %d aborted before any task reported; its run is unknown, "
                "so nothing is rolled back now: a transaction a task of it prepared stays "
                "prepared until the query starts again (its first task resolves it), or "
                "until sqlsink recover --sink-id %s once the run's heartbeat is older than "
                "runTimeout (sqlsink status names the run; recover --force --run-id RUN "
                "at once)",
                sink_id,
                batch_id,
                sink_id,
            )
            return ResolutionReport()
        with self.backend.sink_lock(sink_id):
            bound = self.backend.binding(sink_id)
            highest = self.backend.highest_decided(sink_id)
            if writer is not None and refuses(bound, highest, writer):
                log.warning(
                    "sqlsink %s: batch %d of %s aborted; the sink belongs to %s, so this "
                    "abort touches nothing",
                    sink_id,
                    batch_id,
                    writer.describe(),
                    bound.describe() if bound else "nobody",
                )
                return ResolutionReport()
            self.register(run_id, holds_lock=True)
            decided = (sink_id, batch_id) in self.backend.decisions(sink_id, [(sink_id, batch_id)])
            if not decided:  # its late tasks roll themselves back (Participant.after_prepare)
                self.backend.mark_aborted(sink_id, run_id, batch_id)
            report = self._resolve(Scope.aborting(run_id, batch_id), dry_run=False)[1]
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

    # -- recovery ----------------------------------------------------------------------

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
        sink_id = self._sink()
        seen, left = self.backend.await_batch_tasks(sink_id, batch_id, ABORT_GRACE_S)
        if seen:
            with self.backend.sink_lock(sink_id):
                again = self._resolve(Scope.aborting(run_id, batch_id), dry_run=False)[1]
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

    def recover(self, *, dry_run: bool = False) -> tuple[Plan, ResolutionReport]:
        """Resolve every prepared gid of the sink (of every sink when ``sink_id`` is None)."""
        with self.backend.sink_lock(self.sink_id):
            return self._resolve(self.recovery_scope(), dry_run=dry_run)

    def recovery_scope(self) -> Scope:
        """Everything but the gids of live runs (a fresh heartbeat, not fenced)."""
        live = self.backend.live_runs(self.sink_id)
        return Scope.everything(frozenset(run for _, run in live))

    def resolve_leftovers(self, run_id: str, batch_id: int) -> ResolutionReport:
        """Before a task of a live run writes: resolve what dead runs left (their locks)."""
        with self.backend.sink_lock(self._sink()):
            # fenced while it waited for the lock? then "live" would mean the old run, and
            # the newest run's in-flight gids would be swept (found by tests/sim)
            self.register(run_id, holds_lock=True)
            return self._resolve(Scope.live(run_id, batch_id), dry_run=False)[1]

    def plan(self, scope: Scope) -> Plan:
        """The plan for the current state, without acting (races unless the lock is held)."""
        return self._plan(scope)[0]

    def _plan(self, scope: Scope) -> tuple[Plan, dict[tuple[str, int], Decision]]:
        prepared = self.backend.prepared(self.sink_id)
        batches = {(g.sink_id, g.batch_id) for t in prepared if (g := Gid.parse(t.gid)) is not None}
        decisions = self.backend.decisions(self.sink_id, batches)
        plan = plan_resolution(
            prepared,
            decisions,
            database=self.backend.database,
            sink_id=self.sink_id,
            scope=scope,
            role=self.backend.finisher_role,
        )
        return plan, decisions

    def _resolve(self, scope: Scope, *, dry_run: bool) -> tuple[Plan, ResolutionReport]:
        plan, decisions = self._plan(scope)
        report = ResolutionReport(left=plan.gids(Action.LEAVE))
        if dry_run:
            report.committed, report.rolled_back = (
                plan.gids(Action.COMMIT),
                plan.gids(Action.ROLLBACK),
            )
            return plan, report
        to_verify = list(plan.to_verify)
        for action in plan.actions:
            gid = action.prepared.gid
            if action.action is Action.COMMIT:
                if self.backend.commit_prepared(gid):
                    report.committed.append(gid)
                    if action.gid is not None:
                        crash_point(
                            "mid_commit",
                            action.gid.batch_id,
                            session_pid=self.backend.session_pid,
                        )
                elif action.gid is not None:  # finished meanwhile, by someone else
                    to_verify.append((action.gid.batch_id, gid))
            elif action.action is Action.ROLLBACK and self.backend.rollback_prepared(gid):
                report.rolled_back.append(gid)
        self._verify(to_verify, report)
        self._warn_old(
            (a.prepared.gid, a.prepared.prepared_at.timestamp())
            for a in plan.actions
            if a.prepared.gid in report.committed
        )
        forgiven = self._forgive_after_timeout(report.lost, decisions)
        self._complete(decisions, report, forgiven)
        if set(report.lost) - forgiven:
            raise data_loss_error(report.lost)
        return plan, report

    def _warn_old(self, opened: Iterable[tuple[str | None, float]]) -> None:
        """Flink's "transaction timeout almost reached" warning, from first write to commit."""
        limit = self.timeouts.warning_after_s()
        if limit is None:
            return
        now = self.clock()
        for gid, since in opened:
            if gid is not None and now - since > limit:
                log.warning(
                    "sqlsink %s: transaction %s was open %.1f s before COMMIT PREPARED, over "
                    "%.0f%% of transactionTimeout (%.1f s): a longer delay may let the server "
                    "end it (idle/statement/transaction timeouts) and lose the batch",
                    self.sink_id,
                    gid,
                    now - since,
                    self.timeouts.warning_ratio * 100,
                    self.timeouts.timeout_s,
                )

    def _forgive_after_timeout(
        self, lost: list[tuple[int, str]], decisions: dict[tuple[str, int], Decision]
    ) -> set[tuple[int, str]]:
        """ignoreCommitFailuresAfterTransactionTimeout: skip (loudly) what is lost for good.

        The decision's age is the server's (it stamped ``decided_at``): a driver whose
        clock runs ahead must not forgive a fresh loss (issue 12 item 19)."""
        timeout = self.timeouts.timeout_s
        if not (self.timeouts.ignore_commit_failures_after_timeout and timeout and lost):
            return set()
        forgiven = set()
        for batch_id, gid in lost:
            parsed = Gid.parse(gid)
            decision = decisions.get((parsed.sink_id, batch_id)) if parsed else None
            age = None if decision is None else decision.age_s
            if age is not None and age > timeout:
                forgiven.add((batch_id, gid))
                log.error(
                    "sqlsink %s: probable data loss: batch %d transaction %s was decided %.0f s "
                    "ago (over transactionTimeout %.0f s) and is gone without its marker; "
                    "skipped because ignoreCommitFailuresAfterTransactionTimeout is on",
                    self.sink_id,
                    batch_id,
                    gid,
                    age,
                    timeout,
                )
        return forgiven

    def _verify(self, to_verify: list[tuple[int, str]], report: ResolutionReport) -> None:
        if not to_verify:
            return
        visible = self.backend.visible_markers([gid for _, gid in to_verify])
        for batch_id, gid in to_verify:
            if gid in visible:
                report.already_committed.append(gid)
            else:
                report.lost.append((batch_id, gid))

    def _complete(
        self,
        decisions: dict[tuple[str, int], Decision],
        report: ResolutionReport,
        forgiven: set[tuple[int, str]],
    ) -> None:
        done = set(report.committed) | set(report.already_committed) | {g for _, g in forgiven}
        lost = {gid for _, gid in report.lost} - done
        by_sink: dict[str, list[int]] = {}
        for (sink_id, batch_id), decision in decisions.items():
            if decision.complete or decision.gids & lost or not decision.gids <= done:
                continue
            by_sink.setdefault(sink_id, []).append(batch_id)
        for sink_id, batch_ids in by_sink.items():
            self.backend.mark_complete(sink_id, batch_ids)
            report.completed_batches += batch_ids

    def _sink(self) -> str:
        if self.sink_id is None:
            raise ValueError("this operation needs a sink id")
        return self.sink_id


def fenced_error(sink_id: str, run_id: str, fenced_by: str) -> FencedError:
    by = "an operator (sqlsink recover --force)" if fenced_by == "operator" else f"run {fenced_by}"
    return FencedError(
        f"sink {sink_id!r}: run {run_id} was superseded by {by}: a newer run of this sink "
        "started (its checkpoint restarted while this driver was paused or cut off), so "
        "this run is a zombie. It writes, decides and resolves nothing; stop this query, "
        "the newer run goes on",
        sink_id=sink_id,
        run=run_id,
        fenced_by=fenced_by,
    )


def check_binding(
    sink_id: str, bound: Binding | None, highest: int | None, writer: Binding
) -> None:
    """Invariant 8: a sink with decided batches belongs to the writer that decided them."""
    if refuses(bound, highest, writer):
        assert bound is not None
        raise binding_error(sink_id, bound, writer)


def refuses(bound: Binding | None, highest: int | None, writer: Binding) -> bool:
    """Whether a sink bound so, with batches up to ``highest``, refuses this writer."""
    return bound is not None and bound != writer and highest is not None


def check_forward(sink_id: str, batch_id: int, highest: int | None) -> None:
    """Invariant 9: Spark replays only its last batch; anything below it is not a replay."""
    if highest is not None and batch_id < highest:
        raise checkpoint_error(sink_id, batch_id, highest)


def binding_error(sink_id: str, bound: Binding, writer: Binding) -> SinkBindingError:
    return SinkBindingError(
        f"sink {sink_id!r} is bound to {bound.describe()}, whose batches are in its "
        f"commit log; this is {writer.describe()}. Sharing the sink id would make this "
        "writer skip batches as already committed. Nothing was written. Restart the "
        "original writer (a query from its checkpoint), or give this one its own sinkId "
        f"option; to reuse the sink id, finish and remove the old log first: sqlsink "
        f"recover --sink-id {sink_id}, then sqlsink forget --sink-id {sink_id}",
        sink_id=sink_id,
        bound=bound.describe(),
        writer=writer.describe(),
    )


def checkpoint_error(sink_id: str, batch_id: int, highest: int) -> CheckpointError:
    return CheckpointError(
        f"sink {sink_id!r}: this run writes batch {batch_id}, but batch {highest} is already "
        "decided in the commit log: the checkpoint went back in time (restored from an "
        "older copy, or its offsets/ or commits/ folder was cleared). Spark replays only "
        f"its last batch, so batch {batch_id} is not a replay: its rows would be skipped or "
        "written twice. Nothing was written. Restore the checkpoint that wrote batch "
        f"{highest}; or start over with a new checkpoint and a new sinkId (or, once the "
        f"old log is finished: sqlsink recover --sink-id {sink_id}, then sqlsink forget "
        f"--sink-id {sink_id})",
        sink_id=sink_id,
        batch=batch_id,
        highest=highest,
    )


def data_loss_error(lost: list[tuple[int, str]]) -> DataLossError:
    details = []
    for batch_id, gid in lost[:20]:
        parsed = Gid.parse(gid)
        where = f"partition {parsed.partition_id}" if parsed else "partition ?"
        details.append(f"batch {batch_id} {where} ({gid})")
    more = f" and {len(lost) - 20} more" if len(lost) > 20 else ""
    return DataLossError(
        "data loss: decided transaction(s) are neither prepared nor committed (someone "
        f"rolled them back): {'; '.join(details)}{more}. Those rows are missing from the "
        "target. Restore them from the source for these batches; see the README's "
        "'data loss' runbook",
        lost=lost,
    )
