"""The protocol's executor side: what one partition task checks before and after it writes.

    before the write   the run was superseded       -> refuse (invariant 10)
                       the sink is bound elsewhere  -> refuse (invariant 8)
                       a batch below the decided    -> refuse (invariant 9)
                       the batch is decided         -> skip (a replay writes nothing)
                       leftovers of dead runs       -> resolve them first (their locks),
                                                       but never an undecided batch between
                                                       the highest decided and this one
                                                       (its decision was lost: invariant 9)
                       an earlier attempt of this   -> adopt its transaction (invariant 12)
                       task is prepared
    after PREPARE      decided without us, aborted, -> roll back our own gid
                       or our run fenced

The load itself (BEGIN, COPY, marker, PREPARE) is the backend's; these rules are
the core's, beside the committer whose side of the same races they answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlsink.core.admission import check_binding, check_forward, fenced_error
from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.committer import DEFAULT_RUN_TIMEOUT_S, Committer
from sqlsink.core.gid import Gid
from sqlsink.core.model import Binding, Fate, TaskIdentity, TaskState
from sqlsink.core.resolution import Scope
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.errors import TransientError


class ParticipantBackend(TwoPhaseBackend, Protocol):
    """A partition task's session: the committer's operations plus two reads of its own."""

    def task_state(self, sink_id: str, run_id: str, batch_id: int) -> TaskState:
        """What the task must know before writing, in one read."""
        ...

    def attempt_fate(self, sink_id: str, run_id: str, batch_id: int, gid: str) -> Fate:
        """After PREPARE: the batch's decision, its abort, the run's fencing."""
        ...


@dataclass(frozen=True)
class Start:
    """What a task attempt does: write, skip (the batch is decided), or adopt the
    transaction an earlier attempt of the same task prepared."""

    skip: bool = False
    adopt: str | None = None


def task_gid(task: TaskIdentity) -> Gid:
    """The gid of this task attempt's transaction."""
    return Gid(
        task.sink_id, task.batch_id, task.partition_id, task.run_id, task.attempt_id, task.part
    )


class Participant:
    """One partition task attempt's side of the protocol."""

    def __init__(
        self,
        backend: ParticipantBackend,
        task: TaskIdentity,
        timeouts: TimeoutPolicy,
        run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
    ) -> None:
        self.backend = backend
        self.task = task
        self.timeouts = timeouts
        self.run_timeout_s = run_timeout_s

    def before_write(self) -> Start:
        """Fencing, binding, forward-only and replay checks; dead runs' leftovers."""
        task = self.task
        state = self._state()
        check_binding(task.sink_id, state.bound, state.highest, Binding.of(task.query_id))
        check_forward(task.sink_id, task.batch_id, state.highest)
        # only a writer the sink accepts registers its run: a refused one fences nobody
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
        # an undecided leftover of a batch between the highest decided one and ours is
        # the last copy of a batch whose decision was lost: the commit reports it
        scope = Scope.live(task.run_id, task.batch_id).knowing(state.highest)
        gids = [g for g in map(Gid.parse, state.prepared) if g is not None]
        if any(not scope.in_flight(g) for g in gids):
            committer.resolve_leftovers(task.run_id, task.batch_id)
            if self._state().decided:  # the resolution may have completed this very batch
                return Start(skip=True)
        return Start(adopt=self._earlier_attempt(gids))

    def _state(self) -> TaskState:
        task = self.task
        state = self.backend.task_state(task.sink_id, task.run_id, task.batch_id)
        if state.fenced_by is not None:
            load = task.query_id is None  # a named batch load's task (no streaming query)
            raise fenced_error(task.sink_id, task.run_id, state.fenced_by, load=load)
        return state

    def _earlier_attempt(self, gids: list[Gid]) -> str | None:
        """Invariant 12: an attempt of this very task (run, batch, part, partition) that reached
        PREPARE holds a complete output of the partition, and Spark takes any one
        attempt's output. Adopting it, instead of writing again behind its row locks,
        is what lets a retry after a failure past PREPARE make progress, and a
        speculative pair agree on one transaction whichever message Spark keeps."""
        task = self.task
        mine = [
            g
            for g in gids
            if (g.run_id, g.batch_id, g.part, g.partition_id)
            == (task.run_id, task.batch_id, task.part, task.partition_id)
            and g.attempt_id != task.attempt_id
        ]
        return str(min(mine, key=lambda g: g.attempt_id)) if mine else None

    def after_prepare(self, gid: Gid) -> None:
        """Roll back our own prepared transaction if nobody may commit it any more.

        A late attempt (the loser of a speculative pair, killed late; a task still
        running when its batch was aborted; a task of a fenced run) can prepare after
        its batch's decision, abort or fencing. Each of those is written before its
        writer reads the prepared transactions (the commit's and the abort's sweeps,
        the newer run's resolution): so either that read saw our gid, or our read here
        sees what was written. Nothing can name us yet (our commit message has not
        left this task), so roll back now rather than hold locks and VACUUM until some
        later sweep, or forever for a stopped query.
        """
        task = self.task
        fate = self.backend.attempt_fate(task.sink_id, task.run_id, task.batch_id, str(gid))
        if fate.named is True or (fate.named is None and not (fate.fenced or fate.aborted)):
            return
        self.backend.rollback_prepared(str(gid))
        if fate.named is False:
            why = f"batch {task.batch_id} was decided without this attempt (a late copy)"
        elif fate.fenced:
            why = f"run {task.run_id} was superseded by a newer run of the sink"
        else:
            why = f"batch {task.batch_id} was aborted (the query failed or was stopped)"
        raise TransientError(
            f"{task.where()}: {why}; its transaction {gid} is rolled back", gid=str(gid)
        )
