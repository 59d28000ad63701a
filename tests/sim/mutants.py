"""Fixes, each reverted: what ``test_finds_reverted_fixes`` runs the simulation on, and
``test_writer_api`` runs the writer's state machine on (issue 26's F1, C2).

Each mutant is a context manager that patches the fix out of the core (item 1: out
of the in-memory commit log's schema, where that fix lives) and restores it on exit.
Issue 12's: the reverted code is the project's own before the fix (b5cc5c7), adapted
to today's signatures where they changed. Issue 26's (C1, R1, R2): the code as it is on
main at cf9f957, before those fixes; where a fix lives outside the core (R1 in
``spark/datasource.py``, which ``world.DataSource`` models; R2 in ``postgres/locks.py``,
which ``memory.py`` mirrors), the mutant puts back the model or the mirror of that
code as it was then.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from sqlsink.core import admission as admission_module
from sqlsink.core import committer as committer_module
from sqlsink.core import participant as participant_module
from sqlsink.core import writer_batch as writer_batch_module
from sqlsink.core.admission import check_binding, check_forward, refuses
from sqlsink.core.committer import Committer
from sqlsink.core.gid import Gid
from sqlsink.core.model import (
    Binding,
    Decision,
    Fate,
    PartitionOutcome,
    ResolutionReport,
    TaskState,
)
from sqlsink.core.participant import Participant, Start
from sqlsink.core.resolution import Scope, Why
from sqlsink.core.writer_batch import PartStart
from tests.sim import world as world_module
from tests.sim.memory import MemoryBackend, Txn, lock_key


@contextmanager
def item_2_null_binding_passes() -> Iterator[None]:
    """Item 2 reverted: a binding without a query id (a batch load) passes every check,
    as ``query_id`` NULL did before schema 3."""

    def refuses(bound: Binding | None, highest: int | None, writer: Binding) -> bool:
        return (
            bound is not None
            and highest is not None
            and bound.query_id is not None
            and writer.query_id is not None
            and bound.query_id != writer.query_id
        )

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(admission_module, "refuses", refuses)  # check_binding's
        mp.setattr(committer_module, "refuses", refuses)  # abort_batch's
        yield


@contextmanager
def item_3_no_forward_check() -> Iterator[None]:
    """Item 3 reverted: a batch below the highest decided one passes as a replay."""

    def check_forward(sink_id: str, batch_id: int, highest: int | None) -> None:
        return None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(committer_module, "check_forward", check_forward)
        mp.setattr(participant_module, "check_forward", check_forward)
        yield


def _old_abort_batch(
    self: Committer,
    batch_id: int,
    outcomes: Sequence[PartitionOutcome | None],
    *,
    run_id: str | None,
    query_id: str | None = None,
    load: bool = False,
    writer_token: str | None = None,
) -> ResolutionReport:
    """``Committer.abort_batch`` of b5cc5c7: no binding check, no run of its own checked,
    and a run it does not know makes it resolve everything (no driver token then)."""
    sink_id = self.required_sink()
    with self.backend.sink_lock(sink_id):
        decided = (sink_id, batch_id) in self.backend.decisions(sink_id, [(sink_id, batch_id)])
        if run_id is None:
            run_id = next((o.run_id for o in outcomes if o and o.run_id), None)
        if decided:
            scope = Scope.live(run_id, batch_id) if run_id else Scope.everything()
        else:
            scope = Scope.aborting(run_id, batch_id) if run_id else Scope.everything()
        return self.resolver.resolve(scope, dry_run=False)[1]


@contextmanager
def item_8_abort_beyond_its_run() -> Iterator[None]:
    """Item 8 reverted: abort acts for a refused writer, and on other runs' gids."""

    def aborting(cls: type[Scope], run_id: str, batch_id: int) -> Scope:
        return cls(run_id, batch_id, include_batch=True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Committer, "abort_batch", _old_abort_batch)
        mp.setattr(Scope, "aborting", classmethod(aborting))
        yield


@contextmanager
def item_9_fencing_ignored() -> Iterator[None]:
    """Item 9 reverted: runs are still recorded, but nothing acts on being superseded
    (commits, aborts, tasks before writing, tasks after PREPARE)."""

    def register(
        self: Committer,
        run_id: str | None,
        *,
        holds_lock: bool,
        writer: Binding | None = None,
        token: str | None = None,
        load: bool = False,
        decided: bool = False,
    ) -> None:
        if run_id is not None:
            self.backend.register_run(
                self.required_sink(), run_id, self.run_timeout_s, holds_lock=holds_lock, token=token
            )

    def state(self: Participant) -> TaskState:
        task = self.task
        found = self.backend.task_state(task.sink_id, task.run_id, task.batch_id)
        return replace(found, fenced_by=None)

    after_prepare = Participant.after_prepare

    def after_prepare_unfenced(self: Participant, gid: Gid) -> None:
        real = self.backend
        self.backend = _Unfenced(real)
        try:
            after_prepare(self, gid)
        finally:
            self.backend = real

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Committer, "register", register)
        mp.setattr(Participant, "_state", state)
        mp.setattr(Participant, "after_prepare", after_prepare_unfenced)
        yield


class _Unfenced:
    """A participant's backend whose attempt fates never say "fenced"."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def attempt_fate(self, sink_id: str, run_id: str, batch_id: int, gid: str) -> Fate:
        fate: Fate = self._backend.attempt_fate(sink_id, run_id, batch_id, gid)
        return replace(fate, fenced=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


@contextmanager
def item_10_no_adoption() -> Iterator[None]:
    """Item 10 reverted: a retry writes again behind its earlier attempt's prepared rows."""

    def earlier_attempt(self: Participant, gids: list[Gid]) -> str | None:
        return None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Participant, "_earlier_attempt", earlier_attempt)
        yield


# -- issue 26 -----------------------------------------------------------------------------


def _main_before_write(self: Participant) -> Start:
    """``Participant.before_write`` on main: a leftover of another run, or of this run's
    earlier batches, undecided, is resolved (rolled back) before the task writes,
    whatever batch it is of."""
    task = self.task
    state = self._state()
    check_binding(task.sink_id, state.bound, state.highest, Binding.of(task.query_id))
    check_forward(task.sink_id, task.batch_id, state.highest)
    committer = Committer(
        self.backend, task.sink_id, timeouts=self.timeouts, run_timeout_s=self.run_timeout_s
    )
    committer.register(
        task.run_id,
        holds_lock=False,
        writer=Binding.of(task.query_id),
        token=task.writer_token,
    )
    if state.decided:
        return Start(skip=True)
    scope = Scope.live(task.run_id, task.batch_id)
    gids = [g for g in map(Gid.parse, state.prepared) if g is not None]
    if any(not scope.in_flight(g) for g in gids):
        committer.resolve_leftovers(task.run_id, task.batch_id)
        if self._state().decided:
            return Start(skip=True)
    return Start(adopt=self._earlier_attempt(gids))


def _main_keeps(self: Scope, gid: Gid) -> Why | None:
    """``Scope.keeps`` on main: live runs' gids, and a live run's own in flight; nothing
    about a batch whose decision was lost."""
    if gid.run_id in self.live_runs:
        return Why.LIVE_RUN
    if self.run_id is None or self.batch_id is None:
        return None
    if gid.run_id != self.run_id:
        return Why.OTHER_RUN if self.own_run_only else None
    if gid.batch_id > self.batch_id or (gid.batch_id == self.batch_id and not self.include_batch):
        return Why.IN_FLIGHT
    return None


@contextmanager
def c1_lost_decision_resolved() -> Iterator[None]:
    """C1 reverted: the next run's first task (and a sweep, an abort) rolls back the
    undecided leftovers of a batch whose decision a failover took, as any leftover."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Participant, "before_write", _main_before_write)
        mp.setattr(Scope, "keeps", _main_keeps)
        yield


@contextmanager
def c1_blind_recover() -> Iterator[None]:
    """C1's blind window reopened: a recover that read no checkpoint rolls back a streaming
    sink's undecided leftovers above the highest decided batch (``unsure_batches`` empty,
    as before fix/recover); the profile makes the recorded checkpoint unreadable."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(world_module, "unsure_batches", lambda *_: frozenset())
        yield


def _main_abort_batch(
    committer: Committer,
    batch_id: int,
    outcomes: Sequence[PartitionOutcome | None],
    *,
    run_id: str | None,
    query_id: str | None = None,
    load: bool = False,
    writer_token: str | None = None,
) -> ResolutionReport:
    """``Committer.abort_batch`` on main: with no run from the messages, the newest run
    registered with the driver's token is the abort's, its query unknown (no binding
    check then)."""
    sink_id = committer.required_sink()
    backend = committer.backend
    run_id = run_id or next((o.run_id for o in outcomes if o and o.run_id), None)
    if run_id is None and writer_token is not None:
        run_id = backend.run_of_token(sink_id, writer_token)
    query_id = query_id or next((o.query_id for o in outcomes if o and o.query_id), None)
    writer = Binding("load") if load else Binding.of(query_id) if query_id else None
    if run_id is None:
        return ResolutionReport()
    with backend.sink_lock(sink_id):
        bound = backend.binding(sink_id)
        highest = backend.highest_decided(sink_id)
        if writer is not None and refuses(bound, highest, writer):
            return ResolutionReport()
        committer.register(run_id, holds_lock=True)
        decided = (sink_id, batch_id) in backend.decisions(sink_id, [(sink_id, batch_id)])
        if not decided:
            backend.mark_aborted(sink_id, run_id, batch_id)
        report = committer.resolver.resolve(Scope.aborting(run_id, batch_id), dry_run=False)[1]
    return committer._after_late_tasks(run_id, batch_id, report)


class MainDataSource:
    """``spark/datasource.py`` on main, as ``world.DataSource`` models it: the tasks
    register their run with the driver's token; a stream's abort passes the messages,
    no run id, no query id, and the driver's token."""

    @staticmethod
    def task_token(run: world_module.Run) -> str | None:
        return run.driver_token

    @staticmethod
    def abort_args(
        run: world_module.Run, messages: Sequence[PartitionOutcome | None]
    ) -> dict[str, Any]:
        return {
            "run_id": run.run_id if run.is_load else None,
            "load": run.is_load,
            "writer_token": run.driver_token,
        }


@contextmanager
def r1_abort_by_driver_token() -> Iterator[None]:
    """R1 reverted: an abort no task reported to takes the newest run of the driver's
    token, whichever query's, and acts for it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Committer, "abort_batch", _main_abort_batch)
        mp.setattr(world_module.World, "datasource", MainDataSource)
        yield


def _main_end_fenced_holders(self: MemoryBackend, sink_id: str | None) -> list[int]:
    """The mirror of ``locks.end_fenced_holders`` on main: the holder of the sink lock is
    ended when any superseded run recorded its (pid, backend start), whatever run it
    holds the lock for now."""
    if sink_id is None:
        return []
    self._call(f"end fenced holders {sink_id}")
    holder = self.server.advisory.get((self.database, lock_key(sink_id)))
    if holder is None or holder is self.session:
        return []
    for (sink, _), run in self._log.runs.items():
        if (
            sink == sink_id
            and run.superseded_at is not None
            and run.lock_pid == holder.pid
            and run.lock_backend_start == holder.backend_start
        ):
            self.server.hooks.on_terminate(self.session, holder, sink_id)
            self.server.end_session(holder, terminated=True)
            return [holder.pid]
    return []


def _main_unlock_sink(self: MemoryBackend, sink_id: str | None) -> None:
    """The mirror of ``locks.unlock_sink`` on main: the lock goes, the runs' records of
    the session as its holder stay."""
    if self.session.noticed:
        return
    self._call(f"unlock {sink_id}")
    key = lock_key(sink_id)
    count = self.session.advisory.get(key, 0)
    if count <= 1:
        self.session.advisory.pop(key, None)
        self.session.locked_at.pop(key, None)
        if self.server.advisory.get((self.database, key)) is self.session:
            del self.server.advisory[(self.database, key)]
    else:
        self.session.advisory[key] = count - 1


def _main_take(self: MemoryBackend, key: str, sink_id: str | None) -> bool:
    """The mirror of the sink lock's take on main: a fresh take leaves the runs' records
    of the session as its holder alone."""
    place = (self.database, key)
    holder = self.server.advisory.get(place)
    if holder is not None and holder is not self.session:
        return False
    self.server.advisory[place] = self.session
    if key not in self.session.advisory:
        self.session.locked_at[key] = self._now()
        self.server.hooks.on_lock(self.session, key)
    self.session.advisory[key] = self.session.advisory.get(key, 0) + 1
    return True


@contextmanager
def r2_holder_by_stale_record() -> Iterator[None]:
    """R2 reverted: a session a fenced run recorded as its lock holder is ended as that
    run's, even while a kept session serves the new run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MemoryBackend, "_end_fenced_holders", _main_end_fenced_holders)
        mp.setattr(MemoryBackend, "unlock_sink", _main_unlock_sink)
        mp.setattr(MemoryBackend, "_take", _main_take)
        yield


@contextmanager
def f1_replay_whenever_decided() -> Iterator[None]:
    """Issue 26 F1 reverted: a part of a decided batch is a replay, whichever run decided
    it and with whichever tables. 89cb7f8's writer ran the part's job anyway; its tasks
    found the batch decided and skipped, and the commit found the decision and returned."""

    def judge_part(
        sink_id: str,
        batch_id: int,
        run_id: str,
        table: str | None,
        decision: Decision | None,
        *,
        handed_before: bool = False,  # today's signature; 89cb7f8 had no such rule
    ) -> PartStart:
        return PartStart.WRITE if decision is None else PartStart.REPLAY

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_batch_module, "judge_part", judge_part)
        yield


@contextmanager
def c2_unhanded_batches_undecided() -> Iterator[None]:
    """Issue 26 C2 reverted: batches a run never handed to the writer stay undecided (no
    gap filled), and a block given nothing decides nothing (89cb7f8's ``Batch.__exit__``
    returned; ``skip`` is such a block)."""

    def fill_gap(committer: Committer, gap: range, *, query_id: str | None, run_id: str) -> range:
        return range(0)

    def decide_empty(
        committer: Committer,
        batch_id: int,
        *,
        query_id: str | None,
        run_id: str,
        passing: Sequence[int] = (),  # today's signature
    ) -> ResolutionReport | None:
        return None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_batch_module, "fill_gap", fill_gap)
        mp.setattr(writer_batch_module, "decide_empty", decide_empty)
        yield


@contextmanager
def none() -> Iterator[None]:
    yield


def _after_prepare_on_its_session(
    self: world_module.World,
    actor: Any,
    backend: MemoryBackend,
    participant: Participant,
    gid: Gid,
) -> MemoryBackend:
    """The check after PREPARE on the session that prepared, as on PostgreSQL."""
    participant.after_prepare(gid)
    return backend


@contextmanager
def mariadb_no_disconnect_after_prepare() -> Iterator[None]:
    """MariaDB: the partition written as PostgreSQL's (``postgres/partition.py`` with
    ``postgres/sessions.py``): after XA PREPARE it goes on on its session, and gives the
    session back to be kept for the next use, instead of disconnecting. Its branch stays
    attached to that session, so no other session can finish it (XAER_NOTA), and the
    session cannot start another branch (XAER_RMFAIL)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(world_module.World, "after_prepare", _after_prepare_on_its_session)
        mp.setattr(world_module.World, "keeps_sessions_on_mariadb", True)
        yield


def _nota_read_as_gone(self: MemoryBackend, gid: str) -> Txn | None:
    """XA COMMIT/ROLLBACK of a branch still attached to its session gets XAER_NOTA: read
    as "not prepared" (False) instead of waited for."""
    txn = self.server.prepared.get(gid)
    if txn is not None and self.server.attached(txn) and txn.attached is not self.session:
        return None
    return _FINISHABLE_BRANCH(self, gid)


_FINISHABLE_BRANCH = MemoryBackend._finishable_branch


@contextmanager
def mariadb_nota_read_as_gone() -> Iterator[None]:
    """MariaDB: ``MariaDBBackend._finish`` without its wait for a branch still attached to
    the session that prepared it: XAER_NOTA on a listed branch taken for "not prepared",
    as for a branch that is gone (its marker then decides: not visible, data loss)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MemoryBackend, "_finishable_branch", _nota_read_as_gone)
        yield
