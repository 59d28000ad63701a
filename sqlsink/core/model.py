"""The records the protocol works with, free of Spark and of any database driver."""

from __future__ import annotations

import time
from collections.abc import Sequence
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
    bytes_sent: int | None = None  # what its COPY sent, when the writer counted it
    dead_letters: int = 0  # rows kept in the dead-letter table instead (deadLetterTable)

    @classmethod
    def of_task(
        cls,
        task: TaskIdentity,
        gid: str | None,
        rows: int,
        *,
        skipped: bool,
        started: float,
        key_range: KeyRange | None = None,
        bytes_sent: int | None = None,
        dead_letters: int = 0,
    ) -> PartitionOutcome:
        """The task's report, prepared (or skipped) now: every backend's participant."""
        return cls(
            sink_id=task.sink_id,
            batch_id=task.batch_id,
            partition_id=task.partition_id,
            gid=gid,
            rows=rows,
            skipped=skipped,
            query_id=task.query_id,
            run_id=task.run_id,
            started_at=started,
            prepared_at=time.time(),
            key_range=key_range,
            bytes_sent=bytes_sent,
            dead_letters=dead_letters,
        )

    @property
    def write_ms(self) -> float:
        """From its first write to its PREPARE (its commit at at-least-once), on the
        partition's own clock."""
        return (self.prepared_at - self.started_at) * 1000


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


@dataclass(frozen=True)
class Handover:
    """The latest batch a run of a sink handed to the foreachBatch writer, as the commit
    log recorded it before anything of the batch was written (``record_handover``)."""

    run_id: str
    batch_id: int
    handed_at: datetime


@dataclass(frozen=True)
class LockTake:
    """How a take of the sink lock went (``TwoPhaseBackend.acquire_sink_lock``)."""

    held: bool  # this session holds the lock now
    waited: bool = False  # it was held by another session when first tried
    ended: tuple[int, ...] = ()  # sessions of fenced runs that held it, ended (pids)


@dataclass(frozen=True)
class NewDecision:
    """A decision to write (``TwoPhaseBackend.insert_decision``): exactly these gids are
    committed, and what the batch was. ``gids`` and ``tables`` are kept as tuples."""

    sink_id: str
    batch_id: int
    gids: tuple[str, ...]
    rows: int
    query_id: str | None
    run_id: str | None
    partitions: int | None = None  # the partitions that wrote (None: not recorded)
    first_write_at: float | None = None  # seconds since the epoch: the batch's first write
    tables: tuple[str, ...] = ()  # the tables the batch wrote (schema.name)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gids", tuple(self.gids))
        object.__setattr__(self, "tables", tuple(self.tables))


@dataclass(frozen=True)
class PartitionFigures:
    """One partition's share of a batch: its rows and its write time (first write to
    PREPARE, from the partition's own timestamps)."""

    partition_id: int
    rows: int
    write_ms: float


# PostgreSQL's statements that commit and roll back a prepared transaction: the texts'
# default words (each backend says its own: TwoPhaseBackend.commit_statement and
# rollback_statement; MariaDB's are XA COMMIT and XA ROLLBACK)
COMMIT_PREPARED = "COMMIT PREPARED"
ROLLBACK_PREPARED = "ROLLBACK PREPARED"


@dataclass(frozen=True)
class BatchFigures:
    """A batch's figures, recorded with its decision (``sqlsink.decisions.figures``, from
    schema version 9) and said by the driver's per-batch log line, which says nothing
    that is not here. Times in milliseconds; the driver's split, in order: the last
    partition's PREPARE to the decision written (Spark's hand-over, the commit's checks
    and the decision's write), the decision's write alone, the COMMIT PREPAREDs, and the
    rest of the resolution (reading the prepared transactions and decisions, the orphans'
    rollbacks, the completion). ``commit_ms`` is the resolution as a whole (the last two),
    as the ``commit_ms`` column."""

    partitions: int  # partitions that wrote: prepared, or (at-least-once) committed
    rows: int
    bytes_sent: int | None  # None unless every such partition counted its bytes
    writes: tuple[PartitionFigures, ...]  # by partition id
    prepare_to_decision_ms: float | None  # None: no partition prepared
    decision_ms: float
    commit_prepared_ms: float
    completion_ms: float
    commit_ms: float
    orphans: int
    dead_letters: int = 0  # rows written to the dead-letter table instead of the target

    @classmethod
    def of(
        cls,
        outcomes: Sequence[PartitionOutcome],
        *,
        decided_at: float,
        decision_ms: float,
        report: ResolutionReport,
        commit_ms: float,
    ) -> BatchFigures:
        """From the partitions' outcomes, the decision written at ``decided_at`` (epoch
        seconds, the driver's clock) and the resolution's report."""
        # prepared a transaction, or (at-least-once) committed its rows directly
        written = sorted(
            (o for o in outcomes if not o.skipped and (o.gid is not None or o.rows > 0)),
            key=lambda o: o.partition_id,
        )
        sent = [o.bytes_sent for o in written]
        last_prepare = max((o.prepared_at for o in written), default=None)
        # microseconds, as stored: the line said from these is the line the log keeps
        return cls(
            partitions=len(written),
            rows=sum(o.rows for o in outcomes),
            bytes_sent=sum(b for b in sent if b is not None) if sent and None not in sent else None,
            writes=tuple(
                PartitionFigures(o.partition_id, o.rows, round(o.write_ms, 3)) for o in written
            ),
            prepare_to_decision_ms=_ms(
                None if last_prepare is None else (decided_at - last_prepare) * 1000
            ),
            decision_ms=round(decision_ms, 3),
            commit_prepared_ms=round(report.commit_prepared_ms, 3),
            completion_ms=round(max(0.0, commit_ms - report.commit_prepared_ms), 3),
            commit_ms=round(commit_ms, 3),
            orphans=len(report.rolled_back),
            dead_letters=sum(o.dead_letters for o in outcomes),
        )

    def slowest(self) -> PartitionFigures | None:
        """The partition whose write took longest."""
        return max(self.writes, key=lambda w: w.write_ms, default=None)

    def line(
        self, sink_id: str | None, batch_id: int, commit_statement: str = COMMIT_PREPARED
    ) -> str:
        """The driver's per-batch log line (``commit_statement``: the database's name
        for the commits, ``TwoPhaseBackend.commit_statement``)."""
        return f"sqlsink {sink_id}: batch {batch_id}: {self.summary(commit_statement)}"

    def summary(self, commit_statement: str = COMMIT_PREPARED) -> str:
        """The line without its sink and batch."""
        slowest = self.slowest()
        parts = [
            f"{self.partitions} partitions, {self.rows} rows",
            *([f"{self.dead_letters} dead letters"] if self.dead_letters else []),
            *([] if self.bytes_sent is None else [f"{self.bytes_sent} bytes"]),
            *(
                []
                if slowest is None
                else [f"slowest write {slowest.write_ms:.0f} ms (partition {slowest.partition_id})"]
            ),
            *(
                []
                if self.prepare_to_decision_ms is None
                else [f"last PREPARE to decision {self.prepare_to_decision_ms:.0f} ms"]
            ),
            f"decision {self.decision_ms:.1f} ms",
            f"{commit_statement} {self.commit_prepared_ms:.1f} ms",
            f"completion {self.completion_ms:.1f} ms",
            f"{self.orphans} orphan(s) swept",
        ]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The column's JSON (``from_json`` reads it back)."""
        slowest = self.slowest()
        return {
            "partitions": self.partitions,
            "rows": self.rows,
            "bytes_sent": self.bytes_sent,
            "writes": [
                {"partition": w.partition_id, "rows": w.rows, "write_ms": round(w.write_ms, 3)}
                for w in self.writes
            ],
            "slowest_partition": None if slowest is None else slowest.partition_id,
            "slowest_write_ms": None if slowest is None else round(slowest.write_ms, 3),
            "prepare_to_decision_ms": _ms(self.prepare_to_decision_ms),
            "decision_ms": _ms(self.decision_ms),
            "commit_prepared_ms": _ms(self.commit_prepared_ms),
            "completion_ms": _ms(self.completion_ms),
            "commit_ms": _ms(self.commit_ms),
            "orphans": self.orphans,
            "dead_letters": self.dead_letters,
        }

    @classmethod
    def from_json(cls, value: object) -> BatchFigures | None:
        """The figures a ``to_json`` wrote; None (never an error) for anything else."""
        if not isinstance(value, dict):
            return None
        try:
            return cls(
                partitions=int(value["partitions"]),
                rows=int(value["rows"]),
                bytes_sent=_int_or_none(value.get("bytes_sent")),
                writes=tuple(
                    PartitionFigures(int(w["partition"]), int(w["rows"]), float(w["write_ms"]))
                    for w in value["writes"]
                ),
                prepare_to_decision_ms=_float_or_none(value.get("prepare_to_decision_ms")),
                decision_ms=float(value["decision_ms"]),
                commit_prepared_ms=float(value["commit_prepared_ms"]),
                completion_ms=float(value["completion_ms"]),
                commit_ms=float(value["commit_ms"]),
                orphans=int(value["orphans"]),
                dead_letters=int(value.get("dead_letters") or 0),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(str(value))


def _float_or_none(value: object) -> float | None:
    return None if value is None else float(str(value))


@dataclass
class ResolutionReport:
    """What a resolution did (or, in a dry run, would do)."""

    committed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    already_committed: list[str] = field(default_factory=list)
    lost: list[tuple[int, str]] = field(default_factory=list)  # (batch, gid)
    completed_batches: list[int] = field(default_factory=list)
    commit_prepared_ms: float = 0.0  # spent in COMMIT PREPARED statements
    # COMMIT or ROLLBACK PREPARED found no such transaction: finished meanwhile by another
    gone: list[str] = field(default_factory=list)
