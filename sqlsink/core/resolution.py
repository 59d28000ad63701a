"""The recovery rule, in one place: what to do with each prepared transaction.

    decided batch, gid named by its decision      -> commit       (invariant 2, 3)
    decided batch, gid not named                  -> roll back    (a denied/failed attempt)
    undecided, its decision was lost              -> leave        (the last copy of a batch
                                                                   Spark committed: only
                                                                   the operator decides it)
    undecided, inside the scope's reach           -> roll back    (nobody will decide it)
    undecided, kept by the scope                  -> leave        (its commit may come)
    not provably this sink's (prefix, sink id,    -> leave        (invariant 6)
      current database)
    prepared by another role, when we are not     -> leave        (only that role or a
      a superuser                                                  superuser may finish it)

A scope says which undecided gids nobody can still decide:
- ``Scope.everything(live_runs)``: ``sqlsink recover``: all of them but those of
  live runs (a fresh heartbeat, not fenced: invariant 10).
- ``Scope.live(run, batch)``: the newest run of the sink at ``batch`` (the caller
  registered it and was not fenced): gids of other runs (superseded: their commits
  are refused, so nobody can decide them), and gids of this run's earlier batches
  (orphans of denied or failed attempts). This run's gids of ``batch`` and later
  are in flight.
- ``Scope.aborting(run, batch)``: an abort: this run's gids up to ``batch``, and
  nothing of any other run (an abort never acts beyond its own run).

A decision is known lost (invariant 9) when Spark went past its batch: Spark runs
batch N only after ``commits/N-1``, which follows the sink's decision of N-1. So an
undecided gid of a batch above the highest decided one and below the batch a live run
or an abort is at (``Scope.knowing``, the resolver reads the highest decided batch
under the sink lock), or of a batch the caller knows Spark committed (``lost``:
``recover`` with Spark's checkpoint, or the commit log's own record of the loss), holds
the rows of a batch whose decision a failover or a restore took away: the only copy
left. No scope rolls it back; ``sqlsink recover --commit-lost`` decides and commits it.
A recovery that could read no checkpoint of a streaming sink's query cannot tell such a
batch from a dead run's leftover: it keeps the undecided gids of batches above the
highest decided one (``unsure``) unless the operator names the batch as not committed.

Besides, every gid a not-yet-complete decision names and that is no longer
prepared must show its marker row; if not, it was rolled back by someone: data
loss (invariant 5). The plan lists those gids for the caller to verify.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from sqlsink.core.gid import Gid
from sqlsink.core.model import Decision, PreparedTransaction


class Action(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    LEAVE = "leave"


class Why(enum.Enum):
    """Why a prepared transaction gets its action: data of the plan, which callers branch
    on (never on a sentence); ``sentence`` says it in words, in this one place. The values
    are the ``why`` of ``recover --json``'s actions and ``status --json``'s others."""

    FOREIGN = "foreign"  # not a sqlsink gid
    OTHER_SINK = "other_sink"  # another sink's, when one sink is resolved
    OTHER_DATABASE = "other_database"  # prepared in another database of the server
    OTHER_ROLE = "other_role"  # prepared by a role we are not, and we are no superuser
    DECIDED = "decided"  # its batch's decision names it: commit
    NOT_DECIDED = "not_decided"  # its batch is decided without it: roll back
    LOST_DECISION = "lost_decision"  # Spark committed its batch; the decision was lost
    LIVE_RUN = "live_run"  # of a live run: in flight
    UNSURE = "unsure"  # no checkpoint read: may hold the only copy of a committed batch
    OTHER_RUN = "other_run"  # an abort acts on its own run only
    IN_FLIGHT = "in_flight"  # the live run's own batch or a later one
    UNDECIDED = "undecided"  # nobody can decide it any more: roll back
    LATE = "prepared_after_listing"  # a sink's, prepared after recover listed the sinks


@dataclass(frozen=True)
class Scope:
    run_id: str | None = None  # None: no live run of ours (recovery)
    batch_id: int | None = None
    include_batch: bool = False  # aborting: this run's gids of batch_id are rolled back too
    own_run_only: bool = False  # aborting: other runs' gids are left alone
    live_runs: frozenset[str] = frozenset()  # recovery: runs whose gids are in flight
    # the log's highest decided batch is known (``knowing``): undecided gids between it and
    # ``batch_id`` are of batches Spark went past, whose decision was lost
    knows_highest: bool = False
    highest_decided: int | None = None
    lost: frozenset[int] = frozenset()  # batches known committed by Spark, undecided here
    # recovery without any readable checkpoint of a streaming sink's query: undecided
    # batches above the highest decided one, which Spark may have committed (``unsure``)
    unsure: frozenset[int] = frozenset()

    @classmethod
    def everything(
        cls,
        live_runs: frozenset[str] = frozenset(),
        lost: frozenset[int] = frozenset(),
        unsure: frozenset[int] = frozenset(),
        highest_decided: int | None = None,
    ) -> Scope:
        return cls(live_runs=live_runs, lost=lost, unsure=unsure, highest_decided=highest_decided)

    @classmethod
    def live(cls, run_id: str, batch_id: int) -> Scope:
        return cls(run_id, batch_id)

    @classmethod
    def aborting(cls, run_id: str, batch_id: int) -> Scope:
        return cls(run_id, batch_id, include_batch=True, own_run_only=True)

    def knowing(self, highest_decided: int | None) -> Scope:
        """This scope, told the sink's highest decided batch (None: none decided)."""
        return replace(self, knows_highest=True, highest_decided=highest_decided)

    def lost_decision(self, gid: Gid) -> bool:
        """This undecided gid is of a batch whose decision was lost: Spark committed it
        (``lost``), or a live run or an abort is past it and above the highest decided
        batch (``knowing``)."""
        batch = gid.batch_id
        if batch in self.lost:
            return True
        highest = self.highest_decided
        # a sink with no decision is new to the checkpoint check too: leftovers below
        # the running batch may be another writer's (found by tests/sim), not lost ones
        return (
            self.knows_highest
            and self.batch_id is not None
            and batch < self.batch_id
            and highest is not None
            and batch > highest
        )

    def unsure_decision(self, gid: Gid) -> bool:
        """This undecided gid may hold the only copy of a batch Spark committed (no
        checkpoint read, a streaming sink, above the highest decided batch)."""
        return gid.batch_id in self.unsure

    def keeps(self, gid: Gid) -> Why | None:
        """Why an undecided gid is left alone; None when nobody can decide it any more."""
        if self.lost_decision(gid):
            return Why.LOST_DECISION
        if gid.run_id in self.live_runs:
            return Why.LIVE_RUN
        if self.unsure_decision(gid):
            return Why.UNSURE
        if self.run_id is None or self.batch_id is None:
            return None
        if gid.run_id != self.run_id:
            return Why.OTHER_RUN if self.own_run_only else None
        if gid.batch_id > self.batch_id or (
            gid.batch_id == self.batch_id and not self.include_batch
        ):
            return Why.IN_FLIGHT
        return None

    def in_flight(self, gid: Gid) -> bool:
        return self.keeps(gid) is not None


@dataclass(frozen=True)
class PlannedAction:
    prepared: PreparedTransaction
    gid: Gid | None
    action: Action
    why: Why
    reason: str  # ``sentence(why, ...)``: for people, never to branch on


@dataclass
class Plan:
    actions: list[PlannedAction] = field(default_factory=list)
    # decided gids no longer prepared: committed if their marker is visible, else lost
    to_verify: list[tuple[int, str]] = field(default_factory=list)
    # undecided gids left because their batch's decision was lost, by batch
    lost_decisions: dict[int, list[str]] = field(default_factory=dict)

    def gids(self, action: Action) -> list[str]:
        return [a.prepared.gid for a in self.actions if a.action is action]


def plan_resolution(
    prepared: Iterable[PreparedTransaction],
    decisions: Mapping[tuple[str, int], Decision],
    *,
    database: str,
    sink_id: str | None,
    scope: Scope,
    role: str | None = None,
) -> Plan:
    """Decide the fate of each prepared transaction; ``sink_id`` None means every sink.

    ``role``: the role we act as, when it is not a superuser (it can finish only the
    transactions it prepared itself); None: a superuser, who can finish any.

    ``decisions`` must hold the decision of every batch that a prepared gid of the
    sink(s) names, and every decision that is not yet complete.
    """
    plan = Plan()
    still_prepared: set[str] = set()
    for txn in prepared:
        gid = Gid.parse(txn.gid)
        action, why = _decide(txn, gid, decisions, database, sink_id, scope, role)
        plan.actions.append(PlannedAction(txn, gid, action, why, sentence(why, txn, gid, scope)))
        if action is not Action.LEAVE:
            still_prepared.add(txn.gid)
        elif gid is not None and why is Why.LOST_DECISION:
            plan.lost_decisions.setdefault(gid.batch_id, []).append(txn.gid)
    for (decision_sink, batch_id), decision in sorted(decisions.items()):
        if decision.complete or (sink_id is not None and decision_sink != sink_id):
            continue
        plan.to_verify += [(batch_id, g) for g in sorted(decision.gids - still_prepared)]
    plan.actions.sort(key=lambda a: a.prepared.gid)
    plan.lost_decisions = {b: sorted(g) for b, g in sorted(plan.lost_decisions.items())}
    return plan


def whose(
    txn: PreparedTransaction, gid: Gid | None, database: str, sink_id: str | None
) -> Why | None:
    """Why a prepared transaction (``gid``: its gid parsed) is not ours to act on here
    (foreign, another sink's when ``sink_id`` names one, another database's); None when
    it is ours. ``status`` sorts with this rule too."""
    if gid is None:
        return Why.FOREIGN
    if sink_id is not None and gid.sink_id != sink_id:
        return Why.OTHER_SINK
    if txn.database != database:
        return Why.OTHER_DATABASE
    return None


def _decide(
    txn: PreparedTransaction,
    gid: Gid | None,
    decisions: Mapping[tuple[str, int], Decision],
    database: str,
    sink_id: str | None,
    scope: Scope,
    role: str | None,
) -> tuple[Action, Why]:
    if (elsewhere := whose(txn, gid, database, sink_id)) is not None or gid is None:
        return Action.LEAVE, elsewhere or Why.FOREIGN
    if role is not None and txn.owner != role:
        return Action.LEAVE, Why.OTHER_ROLE
    decision = decisions.get((gid.sink_id, gid.batch_id))
    if decision is not None:
        if txn.gid in decision.gids:
            return Action.COMMIT, Why.DECIDED
        return Action.ROLLBACK, Why.NOT_DECIDED
    if (kept := scope.keeps(gid)) is not None:
        return Action.LEAVE, kept
    return Action.ROLLBACK, Why.UNDECIDED


def sentence(why: Why, txn: PreparedTransaction, gid: Gid | None, scope: Scope) -> str:
    """The one place a reason is put in words (``recover``'s actions, ``status``'s others)."""
    if why is Why.FOREIGN or gid is None:
        return "not a sqlsink transaction"
    batch = gid.batch_id
    command = f"sqlsink recover --sink-id {gid.sink_id} --commit-lost {batch} commits them"
    lost_rows = (
        "its decision was lost (a failover or a restore) and its transactions hold its "
        f"rows; left prepared: {command}"
    )
    if why is Why.LOST_DECISION and batch in scope.lost:
        return f"batch {batch} has no decision, but Spark committed it: {lost_rows}"
    if why is Why.LOST_DECISION:
        return (
            f"batch {batch} has no decision, but Spark runs batch {scope.batch_id} "
            f"({scope.highest_decided} is the highest decided), which it does only after "
            f"committing the batches before it: {lost_rows}"
        )
    if why is Why.UNSURE:
        highest = "none" if scope.highest_decided is None else scope.highest_decided
        return (
            f"batch {batch} has no decision and is above the highest decided batch "
            f"({highest}) of a streaming sink, and no checkpoint of its query was read: Spark "
            "may have committed it (a failover that lost its decision), so these transactions "
            "may hold its only copy"
        )
    return {
        Why.OTHER_SINK: f"belongs to sink {gid.sink_id}",
        Why.OTHER_DATABASE: f"in database {txn.database}",
        Why.OTHER_ROLE: f"prepared by role {txn.owner}: only that role or a superuser can "
        "finish it",
        Why.DECIDED: f"batch {batch} is decided",
        Why.NOT_DECIDED: f"batch {batch} is decided without this attempt",
        Why.LIVE_RUN: f"run {gid.run_id} is live",
        Why.OTHER_RUN: f"of run {gid.run_id}: an abort acts on its own run only",
        Why.IN_FLIGHT: "in flight in the live run",
        Why.UNDECIDED: f"batch {batch} is undecided",
        Why.LATE: "prepared after this run listed the sinks: run recover again",
    }[why]
