"""The records the protocol works with, free of Spark and of any database driver."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class KeyRange:
    """The range of the table key's first column that one partition wrote (the
    key-order trap, core/key_ranges.py)."""

    column: str
    low: Any
    high: Any
    rows: int  # rows with a key
    descents: int  # how many times the key went down from one row to the next


@dataclass(frozen=True)
class PartitionOutcome:
    """What one partition task reports to the committer (inside Spark's commit message)."""

    sink_id: str
    batch_id: int
    partition_id: int
    gid: str | None  # None: nothing prepared (skipped replay, or committed directly)
    rows: int
    skipped: bool  # the batch was already decided: the task wrote nothing
    query_id: str | None
    run_id: str | None
    started_at: float  # epoch seconds: the task's first write
    prepared_at: float  # epoch seconds: PREPARE done (or commit for at-least-once)
    # the range of the table's key this partition wrote (core/key_ranges.py), when the
    # table has one and the partition wrote rows
    key_range: KeyRange | None = None


@dataclass(frozen=True)
class TaskIdentity:
    """Who is writing one partition: taken from Spark's TaskContext by the adapter."""

    sink_id: str
    batch_id: int
    partition_id: int
    run_id: str
    attempt_id: int  # Spark's taskAttemptId: unique within a run
    attempt_number: int  # Spark's attemptNumber: 0 for a task's first attempt
    query_id: str | None
    part: int = 0  # which DataFrame of the batch (the foreachBatch writer's batch())
    # the driver that planned the task (spark/driver_token.py): lets an abort that no
    # task reported to find its run
    writer_token: str | None = None

    def where(self) -> str:
        part = f", part {self.part}" if self.part else ""
        return f"sink {self.sink_id}, batch {self.batch_id}{part}, partition {self.partition_id}"


@dataclass(frozen=True)
class Binding:
    """The one writer a sink belongs to (docs/DESIGN.md invariant 8): a streaming query,
    or a named batch load (``query_id`` None). ``unknown``: a row that says neither."""

    kind: str  # "stream" | "load" | "unknown"
    query_id: str | None = None

    @classmethod
    def of(cls, query_id: str | None) -> Binding:
        return cls("stream", query_id) if query_id else cls("load")

    def describe(self) -> str:
        if self.kind == "stream":
            return f"streaming query {self.query_id}"
        return "a named batch load" if self.kind == "load" else "an unknown writer"


@dataclass(frozen=True)
class TaskState:
    """The commit log as a partition task sees it before writing (one read)."""

    fenced_by: str | None  # the run that superseded this task's run (None: it is the newest)
    decided: bool  # this batch has a decision
    bound: Binding | None  # the writer the sink is bound to (None: not bound)
    highest: int | None  # the sink's highest decided batch (None: no batch yet)
    prepared: tuple[str, ...]  # prepared gids with this sink's prefix, this database


@dataclass(frozen=True)
class Fate:
    """What a task attempt learns right after its PREPARE."""

    named: bool | None  # None: the batch is undecided; else whether the decision names it
    fenced: bool  # its run was superseded
    aborted: bool  # Spark aborted its batch


@dataclass(frozen=True)
class PreparedTransaction:
    """One row of the server's list of prepared transactions."""

    gid: str
    database: str
    owner: str
    prepared_at: datetime


@dataclass(frozen=True)
class Decision:
    """The commit decision of one batch: exactly these gids are committed, nothing else."""

    sink_id: str
    batch_id: int
    gids: frozenset[str]
    rows: int
    decided_at: datetime
    complete: bool  # every gid is known committed (verified by its marker)
    query_id: str | None = None
    run_id: str | None = None
    # seconds since decided_at on the server's clock, which stamped it (read with the
    # decision); None when the backend cannot say: then no timeout forgives its loss
    age_s: float | None = None
    # the tables the batch wrote (schema.name); None when unknown: a decision written
    # before the log recorded them (schema version 8), or an empty batch
    tables: tuple[str, ...] | None = None


@dataclass
class ResolutionReport:
    """What a resolution did (or, in a dry run, would do)."""

    committed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    already_committed: list[str] = field(default_factory=list)
    lost: list[tuple[int, str]] = field(default_factory=list)  # (batch, gid)
    completed_batches: list[int] = field(default_factory=list)
