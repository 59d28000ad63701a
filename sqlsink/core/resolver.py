"""The commit loop: carrying out ``plan_resolution``'s plan against the backend.

``plan_resolution`` (``core/resolution.py``) decides, purely, the fate of each
prepared gid; this module acts on it, with the sink lock held by its caller: it
reads the prepared gids and their decisions, runs ``COMMIT PREPARED`` and
``ROLLBACK PREPARED`` in gid order, verifies by marker a decided gid that is gone
(committed, or lost), marks complete the decisions whose gids are all committed,
and raises ``DataLossError`` for what is lost. It also owns Flink's
transaction-timeout options (``TimeoutPolicy``): the warning when a transaction
was open long, and the opt-in forgiveness of a loss after the timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.faults import crash_point
from sqlsink.core.gid import Gid
from sqlsink.core.model import Decision, ResolutionReport
from sqlsink.core.resolution import Action, Plan, Scope, plan_resolution
from sqlsink.errors import DataLossError

log = logging.getLogger("sqlsink")

Decisions = dict[tuple[str, int], Decision]


@dataclass(frozen=True)
class TimeoutPolicy:
    """Flink's transaction-timeout options (transactionTimeout, ...WarningRatio, ignore...)."""

    timeout_s: float | None = None
    warning_ratio: float = 0.8
    ignore_commit_failures_after_timeout: bool = False

    def warning_after_s(self) -> float | None:
        return None if self.timeout_s is None else self.timeout_s * self.warning_ratio


class Resolver:
    """Resolves the prepared gids of one sink (of every sink: ``sink_id=None``)."""

    def __init__(
        self,
        backend: TwoPhaseBackend,
        sink_id: str | None,
        timeouts: TimeoutPolicy,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.sink_id = sink_id
        self.timeouts = timeouts
        self.clock = clock

    def plan(self, scope: Scope) -> tuple[Plan, Decisions]:
        """The plan for the current state and the decisions it read (races unless the
        sink lock is held). A scope at a batch (a live run's, an abort's) is told the
        sink's highest decided batch: undecided gids between the two are of batches
        whose decision was lost, and are left (``Scope.lost_decision``)."""
        scope = self._knowing(scope)
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

    def _knowing(self, scope: Scope) -> Scope:
        if scope.batch_id is None or self.sink_id is None or scope.knows_highest:
            return scope
        return scope.knowing(self.backend.highest_decided(self.sink_id))

    def lost_decisions(self, batch_id: int, highest: int | None) -> dict[int, list[str]]:
        """The sink's undecided prepared gids (this database, any role) of batches above
        ``highest`` (the highest decided) and below ``batch_id``, by batch: Spark went past
        those batches, so their decisions were lost. Nothing to read when no batch lies
        between the two (a run's every commit but the first after a gap)."""
        sink_id = self.sink_id
        if sink_id is None or highest is None or highest >= batch_id - 1:
            return {}
        scope = Scope(batch_id=batch_id).knowing(highest)
        gids = [
            (t.gid, g.batch_id)
            for t in self.backend.prepared(sink_id)
            if (g := Gid.parse(t.gid)) is not None
            and g.sink_id == sink_id
            and t.database == self.backend.database
            and scope.lost_decision(g)
        ]
        decided = self.backend.decisions(sink_id, {(sink_id, b) for _, b in gids})
        found: dict[int, list[str]] = {}
        for gid, batch in gids:
            if (sink_id, batch) not in decided:
                found.setdefault(batch, []).append(gid)
        return {b: sorted(g) for b, g in sorted(found.items())}

    def resolve(self, scope: Scope, *, dry_run: bool) -> tuple[Plan, ResolutionReport]:
        """Act on the plan (``dry_run``: only say what it would do); the caller holds
        the sink lock. A DataLossError when a decided gid is lost (and not forgiven)."""
        plan, decisions = self.plan(scope)
        report = ResolutionReport(left=plan.gids(Action.LEAVE))
        if dry_run:
            report.committed, report.rolled_back = (
                plan.gids(Action.COMMIT),
                plan.gids(Action.ROLLBACK),
            )
            return plan, report
        self.carry_out(plan, decisions, report)
        return plan, report

    def carry_out(
        self,
        plan: Plan,
        decisions: Decisions,
        report: ResolutionReport,
        finished: Callable[[], None] | None = None,
    ) -> None:
        """Act on ``plan`` (read with ``decisions``), filling ``report`` as it goes: what
        was done stays recorded there when a DataLossError (or any error) ends it.
        ``finished()`` after each COMMIT or ROLLBACK PREPARED (a progress count)."""
        report.left = plan.gids(Action.LEAVE)
        to_verify = self._act(plan, report, finished)
        self._verify(to_verify, report)
        self.warn_old(
            (a.prepared.gid, a.prepared.prepared_at.timestamp())
            for a in plan.actions
            if a.prepared.gid in report.committed
        )
        forgiven = self._forgive_after_timeout(report.lost, decisions)
        self._complete(decisions, report, forgiven)
        if set(report.lost) - forgiven:
            raise data_loss_error(report.lost)

    def _act(
        self, plan: Plan, report: ResolutionReport, finished: Callable[[], None] | None
    ) -> list[tuple[int, str]]:
        """COMMIT PREPARED and ROLLBACK PREPARED, in the plan's order; the decided gids
        to verify by marker (the plan's, and those finished meanwhile by someone else)."""
        to_verify = list(plan.to_verify)
        for action in plan.actions:
            gid = action.prepared.gid
            if action.action is Action.COMMIT:
                started = time.monotonic()
                committed = self.backend.commit_prepared(gid)
                report.commit_prepared_ms += (time.monotonic() - started) * 1000
                if committed:
                    report.committed.append(gid)
                    if action.gid is not None:
                        crash_point(
                            "mid_commit",
                            action.gid.batch_id,
                            cut=self.backend.cut_session,
                        )
                else:  # finished meanwhile, by someone else
                    report.gone.append(gid)
                    if action.gid is not None:
                        to_verify.append((action.gid.batch_id, gid))
            elif action.action is Action.ROLLBACK:
                if self.backend.rollback_prepared(gid):
                    report.rolled_back.append(gid)
                else:
                    report.gone.append(gid)
            else:
                continue
            if finished is not None:
                finished()
        return to_verify

    def warn_old(self, opened: Iterable[tuple[str | None, float]]) -> None:
        """Flink's "transaction timeout almost reached" warning, from first write to commit."""
        limit = self.timeouts.warning_after_s()
        if limit is None:
            return
        now = self.clock()
        for gid, since in opened:
            if gid is not None and now - since > limit:
                log.warning(
                    "sqlsink %s: transaction %s was open %.1f s before %s, over "
                    "%.0f%% of transactionTimeout (%.1f s): a longer delay may let the server "
                    "end it (idle/statement/transaction timeouts) and lose the batch",
                    self.sink_id,
                    gid,
                    now - since,
                    self.backend.commit_statement,
                    self.timeouts.warning_ratio * 100,
                    self.timeouts.timeout_s,
                )

    def _forgive_after_timeout(
        self, lost: list[tuple[int, str]], decisions: Decisions
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
        decisions: Decisions,
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
        "target. Restore them from the source for these batches; see the runbook's "
        "'Data loss' (docs/operations/runbook.md)",
        lost=lost,
    )
