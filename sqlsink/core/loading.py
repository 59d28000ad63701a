"""What the Spark adapters load through (:meth:`sqlsink.core.database.Database.loading`):
the planning of a target on the driver, the partition writer on the executors, the
committer's and the heartbeat's backend, the checks around a batch, the run's end record.

Neutral types only: what a backend plans is an opaque :class:`TargetPlan` the adapters
carry to the executors and hand back; the PostgreSQL implementation (binary COPY, the
consistent views, the server checks) is ``sqlsink.postgres.loading``. A backend's methods
import what they need when called, so its object is cheap to get on any worker."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.checkpoint_check import CheckpointLedger

if TYPE_CHECKING:
    from sqlsink.core.backend import ViewKeeper
    from sqlsink.core.model import Decision, PartitionOutcome, TaskIdentity
    from sqlsink.errors import ConfigError

# The sink's options (sqlsink.options.SinkOptions), a table's name
# (sqlsink.tablename.TableName) and a write mode (sqlsink.options.Mode), as the adapters
# hand them over: the core imports neither module (they import the database driver).
SinkOptions = Any
TableName = Any
Mode = Any


@dataclass(frozen=True)
class ColumnKind:
    """A new column's logical type, as an adapter describes its source's type (a Spark
    type) to the database that creates the column (:meth:`Loading.column_type`).
    ``name``: boolean, int8, int16, int32, int64, float32, float64, string, binary,
    date, timestamp (without a time zone), timestamptz, decimal (``precision``,
    ``scale``), array (of ``element``), document (a struct or a map)."""

    name: str
    precision: int = 0
    scale: int = 0
    element: ColumnKind | None = None


class TargetPlan(Protocol):
    """Where each DataFrame column goes, as the backend planned it; pickled into the
    tasks. The adapters read only its key."""

    @property
    def key(self) -> tuple[str, ...]:
        """The table's key as far as the DataFrame writes it (() when none)."""
        ...


class Widened(Protocol):
    @property
    def column(self) -> str: ...

    @property
    def new_type(self) -> str: ...


class SchemaChanges(Protocol):
    """A planned schema evolution, as a caller that may refuse it sees it."""

    @property
    def additions(self) -> Sequence[tuple[str, str]]:
        """(column, type) added."""
        ...

    @property
    def widenings(self) -> Sequence[Widened]: ...


class CommitterBackend(TwoPhaseBackend, CheckpointLedger, Protocol):
    """The committer's backend: two-phase commit, and the checkpoint's ledger."""


class Loading(Protocol):
    """The Spark adapters' interface to a database (every method opens what it needs)."""

    def plan(
        self,
        options: SinkOptions,
        *,
        key: str,
        sink_id: str | None,
        field_names: Sequence[str],
        create_columns: Callable[[], Sequence[Any]] | None,
        arrow_schema: Callable[[], Any],
        column_type: Callable[[str], Any] | None,
        before_changes: Callable[[SchemaChanges], None] | None,
    ) -> TargetPlan:
        """Before any data: the server's checks (``key`` names whose warnings), the commit
        log, the view's refusals, the target matched against the DataFrame's columns.
        ``create_columns`` (createTable) and ``arrow_schema`` are called where needed;
        ``column_type`` gives a new column's type (schemaEvolution)."""
        ...

    def column_type(self, kind: ColumnKind) -> Any | None:
        """The database's type for a new column of ``kind`` (createTable, schema
        evolution); None when it has none (the adapter's refusal names its own type)."""
        ...

    def column(self, name: str, type_: Any, nullable: bool) -> Any:
        """A new column of ``type_`` (:meth:`column_type`'s), for ``create_columns``."""
        ...

    def view_sharing_rows(
        self, options: SinkOptions, table: TableName, views: Mapping[TableName, TableName]
    ) -> TableName | None:
        """The first of ``views`` (view -> its table) over a table sharing rows with
        ``table`` (a descendant or an ancestor), by a catalog read."""
        ...

    def rewrite_refusal(
        self, where: str, table: TableName, mode: Mode, view: TableName, viewed: TableName
    ) -> str:
        """The sentence refusing an upsert or replace of ``table`` that ``view`` shows."""
        ...

    def committer_backend(
        self, options: SinkOptions, sink_id: str
    ) -> AbstractContextManager[CommitterBackend]:
        """The committer's backend on a session of its own (kept for the next batch after
        a clean use, closed otherwise)."""
        ...

    def heartbeat_backend(
        self, options: SinkOptions, sink_id: str
    ) -> AbstractContextManager[TwoPhaseBackend]: ...

    def consistent_views(
        self, backend: TwoPhaseBackend, views: Sequence[tuple[TableName, TableName]]
    ) -> ViewKeeper:
        """The keeper of a batch's consistent views, (view, table), on ``backend``."""
        ...

    def check_writer_start(self, backend: TwoPhaseBackend, *, exactly_once: bool) -> None:
        """The foreachBatch writer's first checks: two-phase commit available (when
        ``exactly_once``), the commit log's schema in place."""
        ...

    def slots_refusal(self, options: SinkOptions, partitions: int) -> ConfigError | None:
        """The refusal of a batch of more partitions than the server can keep prepared at
        once (its context names the setting and its value), None when they fit; an
        error reaching the server is raised."""
        ...

    def recheck_after_commit(
        self,
        backend: TwoPhaseBackend,
        *,
        key: str,
        partitions: int,
        slowest_write_s: float | None,
        partition_cap: int | None,
        exactly_once: bool,
    ) -> None:
        """The server's settings again, with a committed batch's measures."""
        ...

    def write_partition(
        self, options: SinkOptions, plan: TargetPlan, task: TaskIdentity, batches: Iterable[Any]
    ) -> PartitionOutcome:
        """On an executor: load a partition's Arrow batches and prepare them."""
        ...

    def forget_one_off_load(self, options: SinkOptions, sink_id: str) -> None: ...

    def load_decision(self, options: SinkOptions, sink_id: str) -> Decision | None:
        """A named load's one decision (batch 0), if any."""
        ...

    def record_run_end(
        self, options: SinkOptions, sink_id: str, run_id: str, how: str, error: str | None
    ) -> bool:
        """Record that a run stopped or failed; False when the run is not known."""
        ...

    def scrub(self, text: str, options: SinkOptions) -> str:
        """``text`` without the connection's secrets."""
        ...
