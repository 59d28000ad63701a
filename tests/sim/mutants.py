"""Fixes, each reverted: what ``test_finds_reverted_fixes`` runs the simulation on (issue
12's items) and ``test_writer_api`` runs the writer's state machine on (issue 26's F1, C2).

Each mutant is a context manager that patches the fix out of the core (item 1: out
of the in-memory commit log's schema, where that fix lives) and restores it on exit.
The reverted code is the project's own before the fix (issue 12: b5cc5c7; issue 26:
89cb7f8), adapted to today's signatures where they changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from sqlsink.core import abort as abort_module
from sqlsink.core import admission as admission_module
from sqlsink.core import committer as committer_module
from sqlsink.core import participant as participant_module
from sqlsink.core import writer_batch as writer_batch_module
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
from sqlsink.core.participant import Participant
from sqlsink.core.resolution import Scope
from sqlsink.core.writer_batch import PartStart


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
        mp.setattr(abort_module, "refuses", refuses)  # abort_batch's
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


@contextmanager
def f1_replay_whenever_decided() -> Iterator[None]:
    """Issue 26 F1 reverted: a part of a decided batch is a replay, whichever run decided
    it and with whichever tables. 89cb7f8's writer ran the part's job anyway; its tasks
    found the batch decided and skipped, and the commit found the decision and returned."""

    def judge_part(
        sink_id: str, batch_id: int, run_id: str, table: str | None, decision: Decision | None
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
        committer: Committer, batch_id: int, *, query_id: str | None, run_id: str
    ) -> ResolutionReport | None:
        return None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_batch_module, "fill_gap", fill_gap)
        mp.setattr(writer_batch_module, "decide_empty", decide_empty)
        yield


@contextmanager
def none() -> Iterator[None]:
    yield
