"""A checkpoint against the sink's commit log, batch by batch.

``relate`` says, for each batch the checkpoint or the log knows, how Spark's logs
(offsets, commits) relate to the sink's decision, and what Spark and the sink will
do on restart (DESIGN.md section 3). ``sqlsink recover --checkpoint`` reports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlsink.checkpoint.parse import Checkpoint


@dataclass(frozen=True)
class DecisionState:
    """What the commit log says of one batch (the CLI fills it from sqlsink.decisions)."""

    complete: bool
    rows: int
    gids: int  # how many gids the decision names
    prepared: int  # how many of them are still prepared


@dataclass(frozen=True)
class BatchRelation:
    batch_id: int
    offsets: bool
    spark_committed: bool
    decision: str  # "complete" | "incomplete" | "none"
    rows: int | None
    state: str  # see STATES
    level: str  # "ok" | "info" | "warning"
    message: str


STATES = {
    "consistent": "committed in Spark's commit log and in PostgreSQL",
    "finishing": "committed in Spark; decided in PostgreSQL, some transactions still prepared",
    "replay_skip": "decided in PostgreSQL, not in Spark's commit log: replayed and skipped",
    "rerun": "offsets but no decision: Spark re-runs it",
    "no_decision": "committed in Spark but no decision in PostgreSQL",
    "ahead": "decided in PostgreSQL beyond the checkpoint's last offsets",
    "commit_without_offsets": "a commit entry without offsets (partly purged checkpoint)",
    "undecided": "prepared transactions, neither offsets nor a decision: rolled back",
    "purged": "decided in PostgreSQL, no longer in the checkpoint",
}


def relate(
    checkpoint: Checkpoint,
    decisions: Mapping[int, DecisionState],
    *,
    undecided_prepared: Mapping[int, int] | None = None,
    first_decided: int | None = None,
    sink_id: str | None = None,
) -> list[BatchRelation]:
    """Per batch, how Spark's logs relate to the sink's decisions, and what happens next.

    ``decisions``: the sink's decisions from the checkpoint's oldest batch on.
    ``undecided_prepared``: per batch, prepared gids of the sink without a decision.
    ``first_decided``: the sink's first decided batch (default: the first in ``decisions``).
    ``sink_id``: named in the commands the messages give.
    """
    undecided_prepared = undecided_prepared or {}
    known = set(checkpoint.offsets) | checkpoint.commits
    oldest = min(known) if known else 0
    last_offsets = checkpoint.last_offsets if checkpoint.last_offsets is not None else -1
    if first_decided is None and decisions:
        first_decided = min(decisions)
    batches = sorted(known | {b for b in decisions if b >= oldest} | set(undecided_prepared))
    out: list[BatchRelation] = []
    for batch in batches:
        has_offsets = batch in checkpoint.offsets
        committed = batch in checkpoint.commits
        decision = decisions.get(batch)
        kind = "none" if decision is None else "complete" if decision.complete else "incomplete"
        rows = decision.rows if decision else None
        seen = _Seen(
            batch, decision, last_offsets, first_decided, undecided_prepared.get(batch, 0), sink_id
        )
        state, level, message = _relation(seen, has_offsets, committed)
        out.append(BatchRelation(batch, has_offsets, committed, kind, rows, state, level, message))
    return out


Relation = tuple[str, str, str]  # state (a key of STATES), level, message


@dataclass(frozen=True)
class _Seen:
    """One batch as the checkpoint and the log see it, for the rules below."""

    batch: int
    decision: DecisionState | None
    last_offsets: int  # the checkpoint's last batch with offsets (-1: none)
    first_decided: int | None
    undecided_prepared: int  # prepared gids of the batch without a decision
    sink_id: str | None = None

    @property
    def rest(self) -> str:
        """What a message adds when some gids of the decision are still prepared."""
        decision = self.decision
        if decision is None or not decision.prepared:
            return ""
        return (
            f"; {decision.prepared} of its {decision.gids} transaction(s) are still prepared: "
            "recovery commits them"
        )


def _relation(seen: _Seen, has_offsets: bool, committed: bool) -> Relation:
    if committed:
        return _in_commits(seen)
    if has_offsets:
        return _in_offsets(seen)
    return _in_neither(seen)


def _in_commits(seen: _Seen) -> Relation:
    """A batch in Spark's commit log."""
    batch, decision, first_decided, rest = seen.batch, seen.decision, seen.first_decided, seen.rest
    if decision is not None:
        if decision.complete:
            return "consistent", "ok", f"batch {batch} is committed in Spark and in PostgreSQL"
        return (
            "finishing",
            "warning",
            f"batch {batch} is committed in Spark's commit log and decided in PostgreSQL, "
            f"but not every transaction of it is committed yet{rest}",
        )
    if seen.undecided_prepared:  # Spark went past it: its decision was lost, not its rows
        return (
            "no_decision",
            "warning",
            f"batch {batch} is in Spark's commit log but has no decision in PostgreSQL, and "
            f"{seen.undecided_prepared} prepared transaction(s) of it hold its rows: its "
            "decision was lost (a failover or a restore); they are left prepared for "
            f"sqlsink recover{'' if seen.sink_id is None else ' --sink-id ' + seen.sink_id} "
            f"--commit-lost {batch}",
        )
    if first_decided is None or batch < first_decided:
        return (
            "no_decision",
            "info",
            f"batch {batch} is in Spark's commit log but has no decision in PostgreSQL: "
            "older than the sink's first decision (the sink wrote nothing then, or the "
            "log was reset)",
        )
    return (
        "no_decision",
        "warning",
        f"batch {batch} is in Spark's commit log but has no decision in PostgreSQL: an "
        "empty batch committed without a sink id, a batch a foreachBatch function did not "
        "hand to the writer (--mark-skipped records it), or its decision was lost (a "
        "failover or a restore) or deleted; if it wrote rows, they are not in PostgreSQL",
    )


def _in_offsets(seen: _Seen) -> Relation:
    """A batch with offsets that Spark has not committed."""
    batch, last_offsets, undecided_prepared = seen.batch, seen.last_offsets, seen.undecided_prepared
    if seen.decision is not None:
        where = (
            "is committed in PostgreSQL but"
            if seen.decision.complete
            else "is decided in PostgreSQL, its commit not finished, and"
        )
        return (
            "replay_skip",
            "info",
            f"batch {batch} {where} not in Spark's commit log; Spark will replay it and the "
            f"sink will skip it{seen.rest}",
        )
    extra = (
        f"; its {undecided_prepared} prepared transaction(s) are rolled back by recovery"
        if undecided_prepared
        else ""
    )
    level = "info" if batch == last_offsets else "warning"
    note = "" if batch == last_offsets else " (not the last batch: unusual)"
    return (
        "rerun",
        level,
        f"batch {batch} has offsets but no decision: Spark will re-run it{note}{extra}",
    )


def _in_neither(seen: _Seen) -> Relation:
    """A batch the checkpoint holds neither offsets nor a commit for."""
    batch, decision, last_offsets, rest = seen.batch, seen.decision, seen.last_offsets, seen.rest
    if decision is not None and batch > last_offsets:
        return (
            "ahead",
            "warning",
            f"batch {batch} is decided in PostgreSQL but the checkpoint has no offsets for "
            f"it (its last offsets are for batch {last_offsets}): the checkpoint is behind the "
            "commit log (restored from an older copy?). When Spark reaches this batch id the "
            "sink skips it as already written, whatever rows it holds then",
        )
    if decision is not None:
        return (
            "purged",
            "info",
            f"batch {batch} is decided in PostgreSQL; Spark's checkpoint no longer holds it{rest}",
        )
    if seen.undecided_prepared:
        return (
            "undecided",
            "info",
            f"batch {batch} has prepared transactions but neither offsets nor a decision: "
            f"recovery rolls back its {seen.undecided_prepared} prepared transaction(s)",
        )
    return (
        "commit_without_offsets",
        "info",
        f"batch {batch}: a commit entry without offsets (Spark purged part of the checkpoint)",
    )
