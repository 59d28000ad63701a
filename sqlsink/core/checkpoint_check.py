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
from collections.abc import Callable, Collection, Iterable
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


@dataclass(frozen=True)
class CheckpointPolicy:
    """How a sink relates its checkpoint: where it is, how to list it, what to do."""

    location: str | None  # as shown in messages and the log (no secrets); None: none given
    read_commits: CommitsReader
    mode: CheckpointMode = CheckpointMode.WARN
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S


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

    def at_commit(self, sink_id: str, run_id: str, batch_id: int) -> Verdict | None:
        """Relate the checkpoint to the log when due; None when not due. Raises
        DataLossError for missing decisions, CheckpointError for an unreadable
        checkpoint under ``require``; either way before batch N is decided."""
        policy = self.policy
        if not is_due(policy.mode, self.ledger.run_check(sink_id, run_id), batch_id):
            return None
        verdict, tail = self._judge(sink_id, batch_id)
        self.ledger.record_check(sink_id, run_id, batch_id, policy.location, verdict)
        if verdict.kind == "loss":
            raise checkpoint_loss_error(sink_id, policy.location, verdict.lost, batch_id, tail=tail)
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
) -> DataLossError:
    """Spark committed batches whose decisions the database no longer has. ``tail``:
    no batch above the first missing one is decided, so Spark may re-run from there."""
    first = min(lost)
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
    return DataLossError(
        f"data loss: sink {sink_id!r}: Spark's checkpoint records {_batches(lost)} as "
        f"committed, but the commit log has no decision for them: the database went back "
        "in time (an asynchronous failover to a standby that had not received them, or a "
        "point-in-time restore), so their rows are missing from the target, and Spark "
        f"will never run them again. Batch {batch_id} is not decided: its transactions "
        f"are rolled back. To re-deliver the missing batches: {redeliver}. To accept the "
        f"loss instead: stop the query, run sqlsink recover --sink-id {sink_id}, then "
        f"sqlsink forget --sink-id {sink_id} (the sink starts a new commit log at its next "
        "batch); see the README's 'data loss' runbook",
        sink_id=sink_id,
        lost=sorted(lost),
        batch=batch_id,
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
