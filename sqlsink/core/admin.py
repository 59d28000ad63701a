"""The commands' session with a database (``sqlsink status``, ``recover``, ``forget``,
``check``, ``metrics``) and the records it reads, as the CLI sees them: neutral types a
backend builds (:mod:`sqlsink.postgres.admin` for PostgreSQL) and the CLI renders.

A database's admin session is opened by ``Database.open_admin`` of
:func:`sqlsink.backends.open_database`; the driver's errors reach the CLI as a
:class:`DriverError` (``Database.driver_error``), so the CLI imports no driver."""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Protocol

from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.model import COMMIT_PREPARED, BatchFigures, Binding, PreparedTransaction

# -- the records ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RoleInfo:
    role: str
    superuser: bool
    database: str
    server_version: str
    server_version_num: int


@dataclass(frozen=True)
class SinkRow:
    sink_id: str
    query_id: str | None
    created_at: datetime
    bound_at: datetime


@dataclass(frozen=True)
class DecisionRow:
    sink_id: str
    batch_id: int
    gids: tuple[str, ...]
    rows: int
    decided_at: datetime
    completed_at: datetime | None
    query_id: str | None
    run_id: str | None
    first_write_at: datetime | None = None
    commit_ms: float | None = None
    orphans: int | None = None
    figures: BatchFigures | None = None  # schema version 9 on; None before, or not recorded

    def rows_per_second(self) -> float | None:
        """Throughput: rows over the time from the first write to the decision."""
        if self.first_write_at is None:
            return None
        seconds = (self.decided_at - self.first_write_at).total_seconds()
        return self.rows / seconds if seconds > 0 else None

    def lag_seconds(self) -> float | None:
        """From the batch's first write until all of it was visible (complete)."""
        if self.first_write_at is None or self.completed_at is None:
            return None
        return (self.completed_at - self.first_write_at).total_seconds()


@dataclass(frozen=True)
class BatchSummary:
    decisions: int
    first_decided: int | None
    last_decided: int | None
    last_complete: int | None
    incomplete: int


@dataclass(frozen=True)
class Session:
    pid: int
    application_name: str
    user: str | None
    client: str | None
    state: str | None
    backend_start: datetime | None
    xact_start: datetime | None

    def describe(self) -> str:
        where = f" from {self.client}" if self.client else ""
        since = (
            f", connected {self.backend_start:%Y-%m-%d %H:%M:%S%z}" if self.backend_start else ""
        )
        return (
            f"pid {self.pid} {self.application_name!r} (role {self.user}{where}, "
            f"{self.state or 'unknown state'}{since})"
        )


@dataclass(frozen=True)
class RunInfo:
    """A run of a sink as the registry knows it (``sqlsink.runs``), judged as ``RUNS_SQL`` does."""

    sink_id: str
    run_id: str
    first_seen: datetime
    heartbeat_at: datetime  # last heard from: registered, or prepared within its runTimeout
    heartbeat_age_s: float
    run_timeout_s: float  # the runTimeout it registered with
    batch_interval_s: float | None  # the longest of its last three gaps between decisions
    timeout_s: float  # live while heard from within this: max(runTimeout, 3 x interval)
    superseded_at: datetime | None
    superseded_by: str | None  # a newer run's id, or 'operator' (sqlsink recover --force)
    aborted_batch: int | None
    live: bool

    @property
    def state(self) -> str:
        """'fenced' (superseded), 'live', or 'dead' (timed out, or a batch aborted)."""
        return "fenced" if self.superseded_at is not None else "live" if self.live else "dead"


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, as its driver's listener recorded it (spark/listener.py)."""

    run_id: str
    ended_at: datetime
    how: str  # 'stopped' or 'failed'
    error: str | None  # the error's first line (failed), bounded and scrubbed


@dataclass(frozen=True)
class CheckpointCheckRow:
    """One run's checkpoint check, for ``sqlsink status``."""

    run_id: str
    newest: bool  # the sink's newest run (not superseded)
    verdict: str  # verified | loss | unverified | off
    detail: str
    lost: tuple[int, ...]  # batches Spark committed that the log lacks
    location: str | None
    batch_id: int | None  # the batch whose commit ran the check
    checked_at: datetime


@dataclass(frozen=True)
class HiddenBatch:
    """A batch with committed partitions that the sink's consistent views hide now."""

    batch_id: int
    partitions: int  # committed partitions hidden (their markers are visible)
    rows: int
    of_partitions: int | None  # the partitions its decision names (None: no decision)
    complete: bool  # decided complete (or its decision is gone), its markers kept


@dataclass(frozen=True)
class Finding:
    """One verdict on one setting; the same fields as a finding of ``sqlsink check``."""

    level: str  # "error" | "warning" | "ok"
    setting: str  # e.g. "idle_in_transaction_session_timeout"
    value: str  # as PostgreSQL shows it (SHOW), e.g. "5s", "0"
    source: str  # "server (postgresql.conf)", "default", "database shop", "role app", ...
    message: str  # why it matters to the sink, naming the quantity it was compared with
    fix: str | None = None  # the exact statement, at the level the value comes from


@dataclass(frozen=True)
class CheckContext:
    trigger_interval_s: float | None = None  # the query's trigger interval, when given
    partitions: int | None = None  # the partitions of a batch, when given


@dataclass(frozen=True)
class Forgotten:
    decisions: int
    first_batch: int | None
    last_batch: int | None
    writer: str | None = None  # what the sink was bound to: 'stream', 'load' (or None)
    known: bool = True  # the log had anything of the sink (a sinks or runs row, a decision)
    others: tuple[str, ...] = ()  # when not known: the sinks the log knows (the first 20)


@dataclass(frozen=True)
class ConsistentView:
    """A consistent view of some sink in this database, as status shows it."""

    view: str  # its name, quoted
    sink_id: str
    table: str  # quoted
    owner: str
    format: int


@dataclass(frozen=True)
class ServerTerms:
    """How the commands' texts name a database's own things, so that none says
    PostgreSQL's words on another database (``AdminSession.terms``)."""

    prepared_cost: str  # what a prepared transaction costs until it is finished
    end_session: str  # how to end a session (a stuck lock holder)
    rollback_example: str  # how to roll one back by hand (a gid or xid as "<gid>")
    finisher: str  # who may finish a prepared transaction
    commit_statement: str = COMMIT_PREPARED  # what commits one (the batches' figures)


POSTGRES_TERMS = ServerTerms(
    "holds its locks and blocks VACUUM",
    "SELECT pg_terminate_backend(pid)",
    "ROLLBACK PREPARED '<gid>'",
    "its owner or a superuser",
)


# -- the driver's errors, as the CLI tells them apart -----------------------------------------


class DriverFault(enum.Enum):
    """What kind of failure a driver's error is, as the commands explain it."""

    PRIVILEGE = "insufficient privilege"
    UNDEFINED_TABLE = "an undefined table"
    QUERY_CANCELED = "a query canceled (statement timeout)"
    CONNECTION = "a lost or refused connection"
    OTHER = "another database error"


@dataclass(frozen=True)
class DriverError:
    """A driver's error translated by the backend (``Database.driver_error``)."""

    fault: DriverFault
    diag: str  # the server's primary message, else the error's text


# -- the session -----------------------------------------------------------------------------


class AdminSession(Protocol):
    """One command's session with the sink's database: who it is, what the commit log,
    the runs registry and the server hold, and the two-phase backend recovery runs on."""

    def role_info(self) -> RoleInfo: ...

    def database(self) -> str:
        """The name of the session's database (no round trip)."""
        ...

    def terms(self) -> ServerTerms:
        """The database's words for the commands' texts (no round trip)."""
        ...

    def schema_version(self) -> int:
        """The commit log's schema version; 0 when not installed."""
        ...

    def checkpoint_checks_recorded(self) -> bool:
        """Whether the commit log keeps the checkpoint check's verdicts (its version is
        the database's own numbering: PostgreSQL's from schema 4, MariaDB's from its
        first)."""
        ...

    def schema_fix(self) -> str:
        """How to install the commit log's schema, for the error that says it is missing."""
        ...

    def set_statement_timeout(self, seconds: float) -> None:
        """Bound each query of the session (``sqlsink metrics --query-timeout``)."""
        ...

    def server_now(self) -> datetime: ...

    def sinks(self) -> dict[str, SinkRow]: ...

    def sink_tables(self, sink_id: str) -> list[str]: ...

    def batch_summary(self, sink_id: str) -> BatchSummary: ...

    def recent_decisions(self, sink_id: str, limit: int) -> list[DecisionRow]: ...

    def decisions_from(self, sink_id: str, first_batch: int) -> dict[int, DecisionRow]: ...

    def incomplete_decisions(self, sink_id: str | None = None) -> list[DecisionRow]: ...

    def binding(self, sink_id: str) -> Binding | None: ...

    def all_prepared(self) -> list[PreparedTransaction]: ...

    def visible_markers(self, gids: Collection[str]) -> set[str]: ...

    def confirm_lost(self, candidates: Collection[str]) -> set[str]:
        """Of the gids gone without their marker, those a second read confirms lost."""
        ...

    def sqlsink_sessions(self) -> list[Session]:
        """The other sessions of this database that are sqlsink's."""
        ...

    def sink_sessions(self, sessions: Collection[Session], sink_id: str) -> list[Session]:
        """Of ``sessions``, the sink's (evidence that it runs, never proof that it does not)."""
        ...

    def lock_holders(self, sink_id: str) -> list[Session]: ...

    def runs(self, sink_id: str | None) -> list[RunInfo]: ...

    def run_ends(self, sink_id: str) -> dict[str, RunEnd]: ...

    def checkpoint_checks(self, sink_id: str, limit: int = 5) -> list[CheckpointCheckRow]: ...

    def consistent_views(self) -> list[ConsistentView]: ...

    def hidden_batches(self, sink_id: str) -> list[HiddenBatch]: ...

    def forget_sink(self, sink_id: str, lock_timeout_s: float) -> Forgotten:
        """Remove a finished sink's log under its lock (ConfigError when refused)."""
        ...

    def run_checks(self, ctx: CheckContext) -> list[Finding]:
        """``sqlsink check``: the server's settings, the schema, privileges, views."""
        ...

    def two_phase(self) -> TwoPhaseBackend:
        """The sink's own two-phase backend on this session, for recovery."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> AdminSession: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
