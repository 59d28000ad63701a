"""The scope of ``sqlsink recover`` from what shows that Spark went past a batch whose
decision the commit log lacks (docs/DESIGN.md invariant 9): the evidence (Spark's
checkpoint when read, else the commit log's own record), the batches whose decision was
lost (their prepared transactions hold the only copy of their rows: left, never rolled
back), and, when no checkpoint was read for a streaming sink, the undecided batches that
Spark may have committed. ``recover_scope`` makes the ``Scope`` that
:mod:`sqlsink.core.recovery` resolves with; the CLI prints what it returns.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sqlsink.core.admin import AdminSession
from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.gid import Gid
from sqlsink.core.model import PreparedTransaction
from sqlsink.core.resolution import Scope


class CommittedBatches(Protocol):
    """Spark's checkpoint as the evidence reads it (``sqlsink.checkpoint.parse.Checkpoint``)."""

    @property
    def path(self) -> str:
        """The directory, or the URI as shown (no secrets)."""
        ...

    @property
    def commits(self) -> Collection[int]:
        """The batches its ``commits/`` records as committed."""
        ...


@dataclass(frozen=True)
class Evidence:
    """What shows that Spark committed a batch (went past it) although it has no decision."""

    checkpoint: CommittedBatches | None  # Spark's checkpoint, when read
    recorded: frozenset[int]  # batches a commit of a later batch reported lost
    aborted_up_to: int | None  # the highest batch Spark aborted (it ran that far)
    # the checkpoint was not given but read where the query's runs recorded it
    from_record: bool = False
    # when each run registered (seconds since the epoch), and the runs whose commit or
    # abort is the evidence, by batch: a run registered after them re-ran the batch
    seen: Mapping[str, float] = field(default_factory=dict)
    checkers: Mapping[int, frozenset[str]] = field(default_factory=dict)  # recorded K lost
    aborts: Mapping[str, int] = field(default_factory=dict)  # run -> the batch it aborted

    def stranger(self, batch: int, run_id: str) -> bool:
        """Whether ``run_id``'s gids of ``batch`` cannot be the lost copy the evidence is
        about: without a checkpoint, a run registered after every run whose commit or abort
        showed that Spark committed the batch (the original run registered before them: it
        prepared the batch before Spark committed it) re-ran it after a rewind; a run the
        registry does not know is not shown to be the original either."""
        if self.checkpoint is not None or not self.seen:
            return False
        runs = {*self.checkers.get(batch, ()), *(r for r, a in self.aborts.items() if a > batch)}
        witnesses = [self.seen[r] for r in runs if r in self.seen]
        mine = self.seen.get(run_id)
        return mine is None or not witnesses or mine > max(witnesses)

    def why(self, batch: int) -> str | None:
        """Why batch ``batch`` was committed by Spark; None when nothing shows it."""
        if self.checkpoint is not None:  # the checkpoint, when read, is the authority
            if batch in self.checkpoint.commits:
                where = (
                    f" (the checkpoint this sink's query recorded ({self.checkpoint.path}), "
                    "read by this command)"
                    if self.from_record
                    else ""
                )
                return f"Spark's checkpoint records it as committed (commits/{batch}){where}"
            return None
        if batch in self.recorded:
            return "a commit of a later batch found its decision missing"
        if self.aborted_up_to is not None and batch < self.aborted_up_to:
            return (
                f"Spark ran batch {self.aborted_up_to} (and aborted it), which it does only "
                f"after committing batch {batch}"
            )
        return None


def evidence(
    conn: AdminSession, sink_id: str, checkpoint: CommittedBatches | None, from_record: bool = False
) -> Evidence:
    checks = [row for row in conn.checkpoint_checks(sink_id, limit=50) if row.verdict == "loss"]
    recorded = {b for row in checks for b in row.lost}
    runs = conn.runs(sink_id)
    aborted = [r.aborted_batch for r in runs if r.aborted_batch is not None]
    checkers: dict[int, set[str]] = defaultdict(set)
    for row in checks:
        for b in row.lost:
            checkers[b].add(row.run_id)
    return Evidence(
        checkpoint,
        frozenset(recorded),
        max(aborted, default=None),
        from_record,
        {r.run_id: r.first_seen.timestamp() for r in runs},
        {b: frozenset(w) for b, w in checkers.items()},
        {r.run_id: r.aborted_batch for r in runs if r.aborted_batch is not None},
    )


@dataclass(frozen=True)
class LostBatch:
    """An undecided batch above the highest decided one that Spark went past."""

    batch_id: int
    gids: tuple[str, ...]  # its prepared transactions in this database
    why: str


def undecided_prepared(
    backend: TwoPhaseBackend, sink_id: str, highest: int | None
) -> dict[int, list[PreparedTransaction]]:
    """The sink's prepared transactions in this database of batches above ``highest``."""
    found: dict[int, list[PreparedTransaction]] = defaultdict(list)
    for txn in backend.prepared(sink_id):
        gid = Gid.parse(txn.gid)
        if gid is None or gid.sink_id != sink_id or txn.database != backend.database:
            continue
        if highest is None or gid.batch_id > highest:
            found[gid.batch_id].append(txn)
    return dict(sorted(found.items()))


def unsure_batches(
    undecided: Mapping[int, list[PreparedTransaction]],
    settled: frozenset[int],
    live: frozenset[str],
    aborted: Mapping[str, int | None],
    forced: frozenset[str],
) -> frozenset[int]:
    """The undecided batches (above the highest decided one) of a streaming sink that Spark
    may have committed, when no checkpoint was read: all but those ``settled`` (lost, or
    named by --rollback-undecided), a batch a live run has prepared and any later one
    (Spark is running it), and a batch whose every gid is of a run that recorded its
    abort of that batch or of a run --force --run-id declared dead."""
    running = min(
        (
            b
            for b, txns in undecided.items()
            for t in txns
            if (g := Gid.parse(t.gid)) is not None and g.run_id in live
        ),
        default=None,
    )

    def maybe_committed(batch: int) -> bool:
        return any(
            (g := Gid.parse(t.gid)) is not None
            and aborted.get(g.run_id) != batch
            and g.run_id not in forced
            for t in undecided[batch]
        )

    return frozenset(
        b
        for b in undecided
        if b not in settled and (running is None or b < running) and maybe_committed(b)
    )


def lost_batches(backend: TwoPhaseBackend, sink_id: str, proof: Evidence) -> list[LostBatch]:
    """The batches whose prepared transactions ``recover`` must leave (read under the lock)."""
    highest = backend.highest_decided(sink_id)
    lost = []
    for batch, txns in undecided_prepared(backend, sink_id, highest).items():
        why = proof.why(batch)
        if why is not None and not stranger_gids(proof, batch, txns):
            lost.append(LostBatch(batch, tuple(sorted(t.gid for t in txns)), why))
    return lost


def stranger_gids(proof: Evidence, batch: int, txns: list[PreparedTransaction]) -> dict[str, str]:
    """The gids of ``batch`` (gid -> run) that cannot be its lost copy (``Evidence.stranger``):
    a batch with any is not taken for a lost one (a re-run's leftovers after a rewind)."""
    return {
        t.gid: g.run_id
        for t in txns
        if (g := Gid.parse(t.gid)) is not None and proof.stranger(batch, g.run_id)
    }


@dataclass(frozen=True)
class RecoverScope:
    """What ``recover`` may resolve of a sink, and the lost batches it leaves."""

    scope: Scope
    lost: list[LostBatch]  # batches whose decision was lost (their gids are left prepared)
    unsure_kept: bool  # no checkpoint was read for a streaming sink: undecided batches kept


def recover_scope(
    backend: TwoPhaseBackend,
    sink_id: str,
    proof: Evidence,
    *,
    streaming: bool,
    live: frozenset[str] | None,
    aborted: Mapping[str, int | None],
    rollback_undecided: frozenset[int],
    forced: frozenset[str],
) -> RecoverScope:
    """Everything but the live runs' transactions (None: the registry's now), those of
    batches whose decision was lost (read again under the lock before acting), and, when
    no checkpoint of a streaming sink's query was read, those of undecided batches above
    the highest decided one (Spark may have committed them), but the batches named by
    ``rollback_undecided``; ``forced``: the runs --force --run-id declared dead."""
    lost_found = lost_batches(backend, sink_id, proof)
    lost = frozenset(b.batch_id for b in lost_found)
    if live is None:
        live = frozenset(run for _, run in backend.live_runs(sink_id))
    highest = backend.highest_decided(sink_id)
    unsure: frozenset[int] = frozenset()
    kept = proof.checkpoint is None and streaming
    if kept:
        unsure = unsure_batches(
            undecided_prepared(backend, sink_id, highest),
            lost | rollback_undecided,
            live,
            aborted,
            forced,
        )
    return RecoverScope(Scope.everything(live, lost, unsure, highest), lost_found, kept)
