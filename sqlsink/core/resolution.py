"""The recovery rule, in one place: what to do with each prepared transaction.

    decided batch, gid named by its decision      -> commit       (invariant 2, 3)
    decided batch, gid not named                  -> roll back    (a denied/failed attempt)
    undecided, inside the scope's reach           -> roll back    (nobody will decide it)
    undecided, an in-flight gid of the live run   -> leave        (its commit is coming)
    not provably this sink's (prefix, sink id,    -> leave        (invariant 6)
      current database)

A scope says which undecided gids nobody can still decide:
- ``Scope.everything()``: start-up recovery and ``sqlsink recover``: all of them.
- ``Scope.live(run, batch)``: a live run at ``batch``: gids of other runs (dead
  ones; a live zombie cannot decide them any more, because deciding requires every
  gid to be still prepared under the sink lock), and gids of this run's earlier
  batches (orphans of denied or failed attempts). This run's gids of ``batch`` and
  later are in flight.
- ``Scope.aborting(run, batch)``: like live, but this run's gids of ``batch`` too.

Besides, every gid a not-yet-complete decision names and that is no longer
prepared must show its marker row; if not, it was rolled back by someone: data
loss (invariant 5). The plan lists those gids for the caller to verify.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlsink.core.gid import Gid
from sqlsink.core.model import Decision, PreparedTransaction


class Action(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    LEAVE = "leave"


@dataclass(frozen=True)
class Scope:
    run_id: str | None = None  # None: no live run (recovery)
    batch_id: int | None = None
    include_batch: bool = False  # aborting: this run's gids of batch_id are rolled back too

    @classmethod
    def everything(cls) -> Scope:
        return cls()

    @classmethod
    def live(cls, run_id: str, batch_id: int) -> Scope:
        return cls(run_id, batch_id)

    @classmethod
    def aborting(cls, run_id: str, batch_id: int) -> Scope:
        return cls(run_id, batch_id, include_batch=True)

    def in_flight(self, gid: Gid) -> bool:
        if self.run_id is None or self.batch_id is None or gid.run_id != self.run_id:
            return False
        if gid.batch_id > self.batch_id:
            return True
        return gid.batch_id == self.batch_id and not self.include_batch


@dataclass(frozen=True)
class PlannedAction:
    prepared: PreparedTransaction
    gid: Gid | None
    action: Action
    reason: str


@dataclass
class Plan:
    actions: list[PlannedAction] = field(default_factory=list)
    # decided gids no longer prepared: committed if their marker is visible, else lost
    to_verify: list[tuple[int, str]] = field(default_factory=list)

    def gids(self, action: Action) -> list[str]:
        return [a.prepared.gid for a in self.actions if a.action is action]


def plan_resolution(
    prepared: Iterable[PreparedTransaction],
    decisions: Mapping[tuple[str, int], Decision],
    *,
    database: str,
    sink_id: str | None,
    scope: Scope,
) -> Plan:
    """Decide the fate of each prepared transaction; ``sink_id`` None means every sink.

    ``decisions`` must hold the decision of every batch that a prepared gid of the
    sink(s) names, and every decision that is not yet complete.
    """
    plan = Plan()
    still_prepared: set[str] = set()
    for txn in prepared:
        gid = Gid.parse(txn.gid)
        action, reason = _decide(txn, gid, decisions, database, sink_id, scope)
        plan.actions.append(PlannedAction(txn, gid, action, reason))
        if action is not Action.LEAVE:
            still_prepared.add(txn.gid)
    for (decision_sink, batch_id), decision in sorted(decisions.items()):
        if decision.complete or (sink_id is not None and decision_sink != sink_id):
            continue
        plan.to_verify += [(batch_id, g) for g in sorted(decision.gids - still_prepared)]
    plan.actions.sort(key=lambda a: a.prepared.gid)
    return plan


def _decide(
    txn: PreparedTransaction,
    gid: Gid | None,
    decisions: Mapping[tuple[str, int], Decision],
    database: str,
    sink_id: str | None,
    scope: Scope,
) -> tuple[Action, str]:
    if gid is None:
        return Action.LEAVE, "not a sqlsink transaction"
    if sink_id is not None and gid.sink_id != sink_id:
        return Action.LEAVE, f"belongs to sink {gid.sink_id}"
    if txn.database != database:
        return Action.LEAVE, f"in database {txn.database}"
    decision = decisions.get((gid.sink_id, gid.batch_id))
    if decision is not None:
        if txn.gid in decision.gids:
            return Action.COMMIT, f"batch {gid.batch_id} is decided"
        return Action.ROLLBACK, f"batch {gid.batch_id} is decided without this attempt"
    if scope.in_flight(gid):
        return Action.LEAVE, "in flight in the live run"
    return Action.ROLLBACK, f"batch {gid.batch_id} is undecided"
