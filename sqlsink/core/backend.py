"""What the protocol needs from a database: the seam between core and backend."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from typing import Protocol

from sqlsink.core.model import (
    BatchFigures,
    Binding,
    Decision,
    Handover,
    LockTake,
    NewDecision,
    PreparedTransaction,
)


class TwoPhaseBackend(Protocol):
    """A database session of the committer or of recovery (never a partition's)."""

    @property
    def database(self) -> str:
        """The current database (prepared gids of other databases are never touched)."""
        ...

    @property
    def commit_statement(self) -> str:
        """The database's statement that commits a prepared transaction, as the sink's
        texts name it ("COMMIT PREPARED", "XA COMMIT")."""
        ...

    @property
    def rollback_statement(self) -> str:
        """The database's statement that rolls back a prepared transaction, as the sink's
        texts name it ("ROLLBACK PREPARED", "XA ROLLBACK")."""
        ...

    @property
    def finisher_role(self) -> str | None:
        """The role we act as when it can finish only its own prepared transactions;
        None for a superuser."""
        ...

    def cut_session(self, url: str) -> None:
        """Fault injection only (``core/faults.py``, ``terminate``): end this backend's
        session from a second connection to ``url``, as an operator or a failover would."""

    def sink_lock(self, sink_id: str | None) -> AbstractContextManager[None]:
        """Hold the sink's lock: committers and recoveries of one sink take turns.
        ``acquire_sink_lock`` with the session's bound; a TransientError when not held."""
        ...

    def acquire_sink_lock(
        self,
        sink_id: str | None,
        timeout_s: float | None = None,
        waiting: Callable[[], None] | None = None,
        *,
        end_fenced: bool = True,
    ) -> LockTake:
        """The one way the sink's lock is taken (it stacks): free, at once; else
        ``waiting()`` is told and the lock waited for at most ``timeout_s`` (None: the
        session's bound); a holder that is provably a fenced run's session is ended and
        the lock waited for once more (not with ``end_fenced=False``: a dry run's take)."""
        ...

    def try_sink_lock(self, sink_id: str | None) -> bool:
        """Take the sink's lock only if it is free (a dry run's look)."""
        ...

    def unlock_sink(self, sink_id: str | None) -> None:
        """Let the sink's lock go, once."""
        ...

    def fence_runs(self, sink_id: str, run_ids: Collection[str]) -> list[str]:
        """Declare these runs of the sink dead (superseded by 'operator', durably): they
        never decide, commit or resolve again. Returns the runs this call fenced."""
        ...

    def end_fenced_holders(self, sink_id: str | None) -> list[int]:
        """End the sessions holding the sink's lock that are provably fenced runs'."""
        ...

    def prepared(self, sink_id: str | None) -> list[PreparedTransaction]:
        """Prepared transactions whose gid may be this sink's (all sinks for None)."""
        ...

    def decisions(
        self, sink_id: str | None, batch_ids: Iterable[tuple[str, int]] = ()
    ) -> dict[tuple[str, int], Decision]:
        """The decisions of these (sink, batch) pairs plus every incomplete one."""
        ...

    def binding(self, sink_id: str) -> Binding | None:
        """The writer the sink is bound to; None when the sink is not recorded yet."""
        ...

    def bind(self, sink_id: str, writer: Binding) -> None:
        """Bind the sink to this writer (creating its row, or replacing a binding)."""
        ...

    def highest_decided(self, sink_id: str) -> int | None:
        """The sink's highest decided batch; None before its first decision."""
        ...

    def register_run(
        self,
        sink_id: str,
        run_id: str,
        live_for_s: float,
        *,
        holds_lock: bool,
        admit: Callable[[Binding | None, int | None], None] | None = None,
        token: str | None = None,
    ) -> str | None:
        """Record the run (heartbeat; the first sight of a run id supersedes every other
        run of the sink). Returns the run that fenced this one, None if it is the newest.

        ``admit(binding, highest)`` is called with the sink's row locked, in the same
        transaction as the registration: when it raises, nothing is recorded (a writer
        the sink refuses must never supersede its owner's run). ``token``: the driver's
        (spark/driver_token.py), recorded with the run once."""
        ...

    def run_of_token(self, sink_id: str, token: str) -> str | None:
        """The newest run whose tasks registered with this driver token."""
        ...

    def mark_aborted(self, sink_id: str, run_id: str, batch_id: int) -> None:
        """Spark aborted the run's batch: its late tasks must not stay prepared."""
        ...

    def live_runs(self, sink_id: str | None) -> dict[tuple[str, str], float]:
        """(sink, run) of runs not fenced whose heartbeat is fresh -> its age in seconds."""
        ...

    def await_batch_tasks(
        self, sink_id: str, batch_id: int, timeout_s: float
    ) -> tuple[list[int], list[int]]:
        """Wait (at most ``timeout_s``) until no other session of the batch's partition
        tasks is connected: (the pids connected at first, the pids still connected)."""
        ...

    def insert_decision(self, decision: NewDecision) -> bool:
        """Write the decision (durably) unless one exists; True if this call wrote it."""
        ...

    def record_metrics(
        self,
        sink_id: str,
        batch_id: int,
        commit_ms: float,
        orphans: int,
        *,
        figures: BatchFigures | None = None,
    ) -> None:
        """Store how the batch's commit went (for status and dashboards), in one statement:
        ``commit_ms``, ``orphans`` and, when given, the batch's ``figures`` (kept as they
        are when None: a replay's commit does not erase the first's)."""
        ...

    def commit_prepared(self, gid: str) -> bool:
        """COMMIT PREPARED; False if no such prepared transaction exists (any more)."""
        ...

    def rollback_prepared(self, gid: str) -> bool:
        """ROLLBACK PREPARED; False if no such prepared transaction exists (any more)."""
        ...

    def visible_markers(self, gids: Collection[str]) -> set[str]:
        """Those of the gids whose partition marker row is committed."""
        ...

    def mark_complete(self, sink_id: str, batch_ids: Collection[int]) -> None: ...

    def record_handover(self, sink_id: str, run_id: str, batch_id: int) -> None:
        """Record, durably, that the run's foreachBatch function handed ``batch_id`` to the
        writer (the run's latest: one record per run, replaced)."""
        ...

    def handovers(self, sink_id: str) -> list[Handover]:
        """Every run's latest recorded hand-over of the sink (``record_handover``)."""
        ...

    def prune_decisions(self, sink_id: str, through: int) -> int:
        """Delete the sink's complete decisions of batches up to ``through`` and record
        ``pruned_through``; incomplete ones stay. Returns how many were deleted."""
        ...


class ViewKeeper(Protocol):
    """The consistent view of a sink's table (option consistentView, docs/DESIGN.md
    invariant 13): kept by the committer under the sink lock, before each decision."""

    def keep(self, sink_id: str) -> None:
        """Create the view when missing, replace it when it is the sink's own and out of
        date; refuse (ConfigError) an object of that name that is not the sink's."""
        ...
