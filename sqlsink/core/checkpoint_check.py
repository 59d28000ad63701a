"""The database behind the checkpoint (docs/DESIGN.md invariant 9, issue 12 item 4).

Spark writes ``commits/N`` only after the sink's ``commit(N)`` returned, so every
batch in the checkpoint's ``commits/`` was decided in the commit log. After an
asynchronous failover or a point-in-time restore the database can lack the newest
of those decisions; Spark never runs those batches again, so their rows are gone.
This module relates the two logs and says so, loudly.

The rule (where it runs, when, and what counts as missing):

- On the driver, in ``Committer.commit_batch`` under the sink lock, before batch N
  is decided: at the first commit of each run (the run's row in ``sqlsink.runs``
  has no check recorded yet), and again whenever the log's highest decided batch
  is below N-1. A failover or a restore loses a *tail* of decisions (WAL is
  replayed in order), so a log that holds N-1 holds every earlier decision; the
  second trigger catches a failover in the middle of a run, at the next commit.
- Tasks never read the checkpoint (an executor may not see the driver's local
  directory); a batch whose commit is refused is aborted by Spark, which rolls
  its prepared transactions back: nothing is written.
- Missing: a batch in ``commits/`` at or above the sink's first batch (the lowest
  decision, or ``pruned_through + 1`` once retention pruned the log) that has no
  decision. A sink without any decision is new (a new sink id on an existing
  checkpoint, or after ``sqlsink forget``): Spark's earlier batches are not its.
- A checkpoint that cannot be read is *unverified*: a warning, recorded for
  ``sqlsink status``; with ``checkpointCheck=require`` the commit stops instead.

The reading itself (local, ``file:``, or ``pyarrow.fs``) is ``sqlsink.checkpoint``'s;
the core only sees a callable, run with a bounded wait.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlsink.errors import CheckpointError, DataLossError

log = logging.getLogger("sqlsink")

DEFAULT_READ_TIMEOUT_S = 30.0  # reading the checkpoint (a remote listing) at most this long


class CheckpointMode(enum.Enum):
    """The option checkpointCheck."""

    WARN = "warn"  # an unreadable checkpoint is a warning (and shown by status)
    REQUIRE = "require"  # an unreadable checkpoint stops the commit
    OFF = "off"  # never read (recorded as such)


@dataclass(frozen=True)
class Unreadable:
    """Why the checkpoint's ``commits/`` could not be listed."""

    reason: str


CommitsReader = Callable[[], "frozenset[int] | Unreadable"]


class EntryPoint(enum.Enum):
    """Which of the sink's entry points commits: it says why a batch may lack a decision."""

    DATA_SOURCE = "format('sqlsink')"  # Spark calls commit() for every batch
    FOREACH_BATCH = "foreachBatch"  # a user's function may not hand a batch to the writer
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CheckpointPolicy:
    """How a sink relates its checkpoint: where it is, how to list it, what to do."""

    location: str | None  # as shown in messages and the log (no secrets); None: none given
    read_commits: CommitsReader
    mode: CheckpointMode = CheckpointMode.WARN
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    entry: EntryPoint = EntryPoint.UNKNOWN  # set by spark/plan.py's CommitterSession


VERDICTS = ("verified", "loss", "unverified", "off")


@dataclass(frozen=True)
class Verdict:
    """One check's result, recorded on the run (``sqlsink.runs.checkpoint_*``)."""

    kind: str  # one of VERDICTS
    detail: str
    lost: tuple[int, ...] = ()  # batches in commits/ without a decision (kind "loss")


@dataclass(frozen=True)
class RunCheck:
    """Before the check: whether this run already has one recorded, and the log's top."""

    checked: bool
    highest: int | None


@dataclass(frozen=True)
class LogCoverage:
    """What the commit log holds of the batches asked about, and where the sink starts."""

    first_decided: int | None  # the lowest decision kept
    pruned_through: int | None  # retention removed complete decisions up to here
    decided: frozenset[int]  # those of the asked batches that have a decision


class CheckpointLedger(Protocol):
    """The commit log's side of the check (``PostgresBackend`` implements it)."""

    def run_check(self, sink_id: str, run_id: str) -> RunCheck: ...

    def coverage(self, sink_id: str, batch_ids: Collection[int]) -> LogCoverage: ...

    def record_check(
        self, sink_id: str, run_id: str, batch_id: int, location: str | None, verdict: Verdict
    ) -> None: ...


def first_batch(coverage: LogCoverage) -> int | None:
    """The sink's first batch in the log's eyes; None for a sink without any decision."""
    if coverage.pruned_through is not None:
        return coverage.pruned_through + 1
    return coverage.first_decided


def missing_decisions(commits: Iterable[int], coverage: LogCoverage) -> list[int]:
    """Batches Spark recorded as committed that the log lacks (see the module's rule)."""
    first = first_batch(coverage)
    if first is None:
        return []
    return sorted(b for b in set(commits) if b >= first and b not in coverage.decided)


def is_due(mode: CheckpointMode, state: RunCheck, batch_id: int) -> bool:
    """Whether the commit of ``batch_id`` must relate the checkpoint (the module's rule)."""
    if not state.checked:
        return True
    if mode is CheckpointMode.OFF:
        return False
    return state.highest is not None and state.highest < batch_id - 1


class CheckpointCheck:
    """The check one commit runs, under the sink lock (``Committer.commit_batch``)."""

    def __init__(self, ledger: CheckpointLedger, policy: CheckpointPolicy) -> None:
        self.ledger = ledger
        self.policy = policy

    def at_commit(
        self,
        sink_id: str,
        run_id: str,
        batch_id: int,
        *,
        prepared: Mapping[int, Sequence[str]] | None = None,
    ) -> Verdict | None:
        """Relate the checkpoint to the log when due; None when not due. Raises
        DataLossError for missing decisions, CheckpointError for an unreadable
        checkpoint under ``require``; either way before batch N is decided.

        ``prepared``: undecided prepared gids of batches between the log's highest
        decision and N (``Resolver.lost_decisions``): Spark went past those batches, so
        their decisions were lost whatever the checkpoint says (or whether it can be
        read at all). They make the check due, and a loss."""
        policy = self.policy
        held = {b: list(g) for b, g in (prepared or {}).items() if g}
        if not held and not is_due(policy.mode, self.ledger.run_check(sink_id, run_id), batch_id):
            return None
        verdict, tail = self._judge(sink_id, batch_id)
        if held:
            lost = tuple(sorted(set(verdict.lost) | set(held)))
            detail = f"{_batches(held)} undecided with prepared transactions below batch {batch_id}"
            if verdict.kind == "loss":
                detail = f"{verdict.detail}; {detail}"
            verdict = Verdict("loss", detail, lost)
        self.ledger.record_check(sink_id, run_id, batch_id, policy.location, verdict)
        if verdict.kind == "loss":
            raise checkpoint_loss_error(
                sink_id,
                policy.location,
                verdict.lost,
                batch_id,
                tail=tail,
                prepared=held,
                entry=policy.entry,
            )
        if verdict.kind == "unverified":
            if policy.mode is CheckpointMode.REQUIRE:
                raise unverified_error(sink_id, policy.location, verdict.detail, batch_id)
            log.warning(
                "sqlsink %s: the checkpoint was not compared with the commit log (%s): a "
                "failover or restore that lost batches Spark committed would go unnoticed. "
                "Option checkpointCheck=require stops the query instead; =off silences this",
                sink_id,
                verdict.detail,
            )
        return verdict

    def _judge(self, sink_id: str, batch_id: int) -> tuple[Verdict, bool]:
        """The verdict, and whether the missing batches are the log's tail (no decision
        above the first of them: what a failover or a restore leaves)."""
        policy = self.policy
        if policy.mode is CheckpointMode.OFF:
            return Verdict("off", "not compared: option checkpointCheck=off"), True
        if policy.location is None:
            return Verdict("unverified", "the sink got no checkpointLocation option"), True
        commits = self._read()
        if isinstance(commits, Unreadable):
            reason = f"cannot read {policy.location}: {commits.reason}"
            return Verdict("unverified", reason), True
        coverage = self.ledger.coverage(sink_id, commits)
        lost = missing_decisions(commits, coverage)
        if lost:
            detail = f"{_batches(lost)} in commits/ of {policy.location} but not decided"
            tail = not any(b > lost[0] for b in coverage.decided)
            return Verdict("loss", detail, tuple(lost)), tail
        first = first_batch(coverage)
        compared = sorted(b for b in commits if first is not None and b >= first)
        if first is None:
            detail = (
                f"the sink has no decision before batch {batch_id} (a new sink): the "
                f"{len(commits)} batch(es) in commits/ of {policy.location} are not its"
            )
        elif compared:
            detail = (
                f"{len(compared)} batch(es) in commits/ of {policy.location} "
                f"({compared[0]}..{compared[-1]}), each decided"
            )
        else:
            detail = f"no batch in commits/ of {policy.location} from the sink's first ({first})"
        return Verdict("verified", detail), True

    def _read(self) -> frozenset[int] | Unreadable:
        """The reader, with a bounded wait (invariant 11): this runs under the sink lock."""
        found: list[frozenset[int] | Unreadable] = []

        def read() -> None:
            try:
                found.append(self.policy.read_commits())
            except Exception as exc:  # the reader's contract is Unreadable; be safe anyway
                found.append(Unreadable(f"{type(exc).__name__}: {exc}"))

        timeout = self.policy.read_timeout_s
        reader = threading.Thread(target=read, name="sqlsink-checkpoint-read", daemon=True)
        reader.start()
        reader.join(timeout)
        if not found:
            return Unreadable(f"listing commits/ took over {timeout:g} s")
        return found[0]


def _batches(batches: Collection[int]) -> str:
    ordered = sorted(batches)
    shown = ", ".join(map(str, ordered[:20]))
    more = f" and {len(ordered) - 20} more" if len(ordered) > 20 else ""
    return f"batch{'es' if len(ordered) > 1 else ''} {shown}{more}"


def checkpoint_loss_error(
    sink_id: str,
    location: str | None,
    lost: Collection[int],
    batch_id: int,
    *,
    tail: bool = True,
    prepared: Mapping[int, Sequence[str]] | None = None,
    entry: EntryPoint = EntryPoint.UNKNOWN,
) -> DataLossError:
    """Batches Spark went past that the commit log has no decision for.

    ``prepared``: those of them whose transactions are still prepared: their decision
    was certainly lost, and the transactions hold their rows (commit them with
    ``sqlsink recover --commit-lost``). The others have nothing prepared: for
    format('sqlsink') the decision was lost; for the foreachBatch writer the function may
    also have returned without handing the batch to the writer (``entry`` says which).
    ``tail``: no batch above the first missing one is decided, so Spark may re-run
    from there."""
    held = {b: sorted(g) for b, g in sorted((prepared or {}).items()) if g}
    bare = sorted(set(lost) - set(held))
    parts = [f"data loss: sink {sink_id!r}:"]
    if held:
        parts.append(_held_text(sink_id, held, bare, batch_id))
    if bare:
        parts.append(_bare_text(sink_id, location, bare, tail, entry, after=bool(held)))
    parts.append(
        f"Batch {batch_id} is not decided: its transactions are rolled back; see the runbook's "
        "'Data loss' (docs/operations/runbook.md)"
    )
    return DataLossError(
        " ".join(parts),
        sink_id=sink_id,
        lost=sorted(set(lost) | set(held)),
        prepared=held,
        batch=batch_id,
    )


def lost_decision_error(
    sink_id: str, prepared: Mapping[int, Sequence[str]], batch_id: int
) -> DataLossError:
    """Undecided prepared transactions below the running batch, no checkpoint check."""
    return checkpoint_loss_error(sink_id, None, list(prepared), batch_id, prepared=prepared)


def _held_text(sink_id: str, held: dict[int, list[str]], bare: list[int], batch_id: int) -> str:
    """Batches whose transactions are still prepared: the decision was certainly lost."""
    one = len(held) == 1
    if one:
        [(only, gids)] = held.items()
        listed = ", ".join(gids)
        what = f"batch {only} has no decision in the commit log, but its {len(gids)} transactions"
        decision = f"the decision of batch {only} was"
    else:
        listed = "; ".join(f"batch {b}: {', '.join(g)}" for b, g in held.items())
        what = f"{_batches(held)} have no decision in the commit log, but their transactions"
        decision = f"the decisions of {_batches(held)} were"
    flags = " ".join(f"--commit-lost {b}" for b in held)
    below = [b for b in bare if b < max(held)]
    settle = (
        f" ({_batches(below)} below must be settled in the same command: add --mark-skipped "
        "for each of them, which records it as a batch without rows)"
        if below
        else ""
    )
    return (
        f"{what} are still prepared ({listed}) while Spark runs batch {batch_id}: Spark runs "
        "a batch only after committing the one before it, and the sink commits a batch only "
        f"after deciding it, so {decision} certainly lost (an asynchronous failover to a "
        "standby that had not received it, or a point-in-time restore). Those prepared "
        "transactions hold the rows, the only copy left, and are left prepared (the rows of "
        "each partition whose PREPARE the standby received: if some did not, theirs are "
        "missing, and nothing here can tell; re-running the batch from Spark's checkpoint, "
        "when the source still holds it, is exact either way). Commit them: "
        f"stop the query, run sqlsink recover --sink-id {sink_id} {flags}{settle} (add "
        "--checkpoint with the query's checkpoint to have it checked against Spark's commit "
        "log first), then restart the query."
    )


def _bare_text(
    sink_id: str,
    location: str | None,
    bare: list[int],
    tail: bool,
    entry: EntryPoint,
    *,
    after: bool,
) -> str:
    """Batches in commits/ without a decision and with nothing prepared."""
    them = "it" if len(bare) == 1 else "them"
    first = bare[0]
    head = (
        f"{'Besides, ' if after else ''}Spark's checkpoint records {_batches(bare)} as "
        f"committed, but the commit log has no decision for {them}"
    )
    if tail:
        redeliver = (
            "stop the query and restart it from a copy of its checkpoint taken before batch "
            f"{first} was committed, or delete commits/{first} onward and offsets/"
            f"{first + 1} onward (with their .N.crc files) from {location}: Spark then "
            f"re-runs batch {first} from its recorded offsets and reads what follows again"
        )
    else:  # decisions above the gap: re-running from it would skip their new contents
        redeliver = (
            "load those batches' source records into the target yourself (later batches "
            "are decided, so the checkpoint must not be rewound)"
        )
    went_back = (
        "the database went back in time (an asynchronous failover to a standby that had not "
        "received them, or a point-in-time restore), so their rows are missing from the "
        "target, and Spark will never run them again"
    )
    accept = (
        f"To accept the loss instead: stop the query, run sqlsink recover --sink-id {sink_id}, "
        f"then sqlsink forget --sink-id {sink_id} (the sink starts a new commit log at its "
        "next batch)."
    )
    if entry is EntryPoint.DATA_SOURCE:
        return (
            f"{head}: {went_back} (format('sqlsink') has Spark call the sink's commit for "
            "every batch, which decides the batch before Spark records it as committed). To "
            f"re-deliver the missing batches: {redeliver}. {accept}"
        )
    who = (
        "the foreachBatch function"
        if entry is EntryPoint.FOREACH_BATCH
        else "a foreachBatch function that writes this sink"
    )
    also = (
        ""
        if entry is EntryPoint.FOREACH_BATCH
        else " (format('sqlsink') hands every batch to the sink: for it only the second holds)"
    )
    skipped = " ".join(f"--mark-skipped {b}" for b in bare)
    return (
        f"{head}, and nothing of {them} is prepared. Either {who} returned without handing "
        f"{_batches(bare)} to the writer: then nothing is lost. Hand every batch to the "
        "writer (`with writer.batch(batch_id)` decides an empty batch, "
        "`writer.skip(batch_id)` marks a batch that has nothing for this sink; "
        "`foreachBatch(writer.wrap(function))` decides empty every batch the function "
        "returns from without handing it over, also a run's last one), and accept "
        f"{them} now: stop the query, run sqlsink recover --sink-id {sink_id} {skipped} "
        f"(add --checkpoint with the query's checkpoint to have it checked), then restart "
        f"the query.{also} Or {went_back}: re-deliver {them}: {redeliver}. {accept}"
    )


def unverified_error(
    sink_id: str, location: str | None, detail: str, batch_id: int
) -> CheckpointError:
    """checkpointCheck=require, and the checkpoint cannot be read."""
    return CheckpointError(
        f"sink {sink_id!r}: checkpointCheck=require, but the checkpoint could not be "
        f"compared with the commit log ({detail}). Batch {batch_id} is not decided: its "
        "transactions are rolled back. Make the checkpoint readable from the driver's "
        "Python (a local or file: path; other schemes through pyarrow.fs, e.g. s3 "
        "credentials in the environment, libhdfs for hdfs), or set checkpointCheck=warn",
        sink_id=sink_id,
        location=location,
        batch=batch_id,
    )
