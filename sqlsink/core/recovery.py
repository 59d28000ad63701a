"""Recovery: the resolution of one sink's (or every sink's) prepared transactions, as one
procedure over the backend interface, returning records of what it found, did and left.

The committer's own paths (a batch's commit, an abort, a task's resolution of what dead
runs left before it writes) hold the sink lock for more than the resolution, and call
``Recovery.resolve`` under it; ``Committer.recover`` is ``Recovery.run``. ``sqlsink
recover`` goes through the steps one by one, so that it can look at every sink before it
acts on any:

    fence(runs)     --force: the named runs declared dead, their lock holders ended
    lock(timeout)   the sink lock (``TwoPhaseBackend.acquire_sink_lock``, the one way it
                    is taken: at once, or a bounded wait, ending provably fenced holders)
    plan(scope)     what would be done (under the lock; refused, for the report)
    finish(scope)   under the lock: the plan made again and carried out; the lock let go
    lock_free()     a dry run: whether the lock is free now

The scope (which undecided transactions nobody can decide any more) is the caller's: it
reads it under the lock (``recover`` reads Spark's checkpoint and the runs registry for
it). Nothing here prints; the records say it all.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.model import LockTake, ResolutionReport
from sqlsink.core.resolution import Plan, Scope
from sqlsink.core.resolver import Resolver, TimeoutPolicy
from sqlsink.errors import ConfigError, DataLossError


class Done(enum.Enum):
    """What a COMMIT or ROLLBACK PREPARED of the plan did (the values are ``recover
    --json``'s ``result``)."""

    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    GONE = "already finished"  # no such prepared transaction any more: someone else's


@dataclass(frozen=True)
class Fenced:
    """``recover --force``: the runs declared dead now, and the lock holders of fenced
    runs ended."""

    runs: tuple[str, ...] = ()
    ended: tuple[int, ...] = ()


@dataclass(frozen=True)
class Recovered:
    """What a recovery did, under its lock: the plan it carried out, each COMMIT or
    ROLLBACK PREPARED it ran, and how it ended. ``report`` is None when it did not end
    (``loss`` or ``failure``); ``finished`` holds what was done all the same."""

    sink_id: str | None
    scope: Scope
    plan: Plan
    finished: Mapping[str, Done] = field(default_factory=dict)
    report: ResolutionReport | None = None
    loss: DataLossError | None = None  # decided transactions lost (data loss)
    failure: ConfigError | None = None  # e.g. a transaction this role may not finish

    @property
    def did(self) -> bool:
        """Anything committed, rolled back, found committed or completed."""
        r = self.report
        return r is not None and bool(
            r.committed or r.rolled_back or r.completed_batches or r.already_committed
        )


class Recovery:
    """The recovery of one sink (every sink: ``sink_id=None``) on one backend session."""

    def __init__(
        self,
        backend: TwoPhaseBackend,
        sink_id: str | None,
        timeouts: TimeoutPolicy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.sink_id = sink_id
        self.resolver = Resolver(backend, sink_id, timeouts or TimeoutPolicy(), clock)

    # -- under a lock the caller holds (the committer's paths) ------------------------------

    def resolve(self, scope: Scope) -> ResolutionReport:
        """Plan and carry out, the sink lock held by the caller; a DataLossError when a
        decided transaction is lost (and not forgiven)."""
        return self.resolver.resolve(scope, dry_run=False)[1]

    def run(
        self, scope_of: Callable[[], Scope], *, dry_run: bool = False
    ) -> tuple[Plan, ResolutionReport]:
        """Take the lock (a TransientError when a holder is not provably fenced), plan
        with ``scope_of()`` under it, carry out (``dry_run``: only say what it would do)."""
        with self.backend.sink_lock(self.sink_id):
            return self.resolver.resolve(scope_of(), dry_run=dry_run)

    # -- sqlsink recover, step by step --------------------------------------------------------

    def fence(self, run_ids: Collection[str]) -> Fenced:
        """Declare these runs of the sink dead, then end the sessions provably theirs that
        hold the sink's lock (before anyone waits for it)."""
        if self.sink_id is None or not run_ids:
            return Fenced()
        runs = self.backend.fence_runs(self.sink_id, run_ids)
        return Fenced(tuple(runs), tuple(self.backend.end_fenced_holders(self.sink_id)))

    def lock(self, timeout_s: float, waiting: Callable[[], None] | None = None) -> LockTake:
        """Take the sink's lock (``TwoPhaseBackend.acquire_sink_lock``; ``waiting()`` is
        told when it must be waited for). Held: ``finish`` acts and lets it go, or
        ``release`` lets it go without acting."""
        return self.backend.acquire_sink_lock(self.sink_id, timeout_s, waiting)

    def plan(self, scope: Scope) -> Plan:
        """The plan for the current state, without acting (races unless the lock is held)."""
        return self.resolver.plan(scope)[0]

    def finish(self, scope: Scope, finished: Callable[[], None] | None = None) -> Recovered:
        """Under the lock ``lock`` took: plan with ``scope`` (read under it) and carry the
        plan out, then let the lock go. A loss or a refusal of the server is recorded, not
        raised; ``finished()`` after each COMMIT or ROLLBACK PREPARED (a progress count)."""
        try:
            plan, decisions = self.resolver.plan(scope)
            report = ResolutionReport()
            done = Recovered(self.sink_id, scope, plan)
            try:
                self.resolver.carry_out(plan, decisions, report, finished)
            except DataLossError as exc:
                return _ended(done, report, loss=exc)
            except ConfigError as exc:  # e.g. COMMIT PREPARED by a role that did not prepare
                return _ended(done, report, failure=exc)
            return _ended(done, report, complete=True)
        finally:
            self.backend.unlock_sink(self.sink_id)

    def release(self) -> None:
        """Let the lock ``lock`` took go without acting."""
        self.backend.unlock_sink(self.sink_id)

    def lock_free(self) -> bool:
        """A dry run's look: whether the sink's lock is free now (taken and let go at once,
        never waited for)."""
        free = self.backend.try_sink_lock(self.sink_id)
        if free:
            self.backend.unlock_sink(self.sink_id)
        return free


def _ended(
    done: Recovered,
    report: ResolutionReport,
    *,
    complete: bool = False,
    loss: DataLossError | None = None,
    failure: ConfigError | None = None,
) -> Recovered:
    finished = {g: Done.COMMITTED for g in report.committed}
    finished |= {g: Done.ROLLED_BACK for g in report.rolled_back}
    finished |= {g: Done.GONE for g in report.gone}
    return Recovered(
        done.sink_id,
        done.scope,
        done.plan,
        finished,
        report if complete else None,
        loss,
        failure,
    )
