"""The protocol's executor side: what one partition task checks before and after it writes.

    before the write   the sink is bound elsewhere  -> refuse (invariant 8)
                       a batch below the decided    -> refuse (invariant 9)
                       the batch is decided         -> skip (a replay writes nothing)
                       leftovers of dead runs       -> resolve them first (their locks)
    after PREPARE      the batch was decided        -> roll back our own gid (a late or
                       without this attempt            speculative copy)

The load itself (BEGIN, COPY, marker, PREPARE) is the backend's; these rules are
the core's, beside the committer whose side of the same races they answer.
"""

from __future__ import annotations

from typing import Protocol

from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.committer import Committer, TimeoutPolicy, check_binding, check_forward
from sqlsink.core.gid import Gid
from sqlsink.core.model import Binding, TaskIdentity, TaskState
from sqlsink.core.resolution import Scope
from sqlsink.errors import TransientError


class ParticipantBackend(TwoPhaseBackend, Protocol):
    """A partition task's session: the committer's operations plus two reads of its own."""

    def task_state(self, sink_id: str, batch_id: int) -> TaskState:
        """What the task must know before writing, in one read."""
        ...

    def decided_with(self, sink_id: str, batch_id: int, gid: str) -> bool | None:
        """None: the batch is undecided; else whether its decision names ``gid``."""
        ...


def task_gid(task: TaskIdentity) -> Gid:
    """The gid of this task attempt's transaction."""
    return Gid(task.sink_id, task.batch_id, task.partition_id, task.run_id, task.attempt_id)


class Participant:
    """One partition task attempt's side of the protocol."""

    def __init__(
        self, backend: ParticipantBackend, task: TaskIdentity, timeouts: TimeoutPolicy
    ) -> None:
        self.backend = backend
        self.task = task
        self.timeouts = timeouts

    def before_write(self) -> bool:
        """Check replay and binding, resolve dead runs' leftovers; True: skip (decided)."""
        task = self.task
        state = self.backend.task_state(task.sink_id, task.batch_id)
        check_binding(task.sink_id, state.bound, state.highest, Binding.of(task.query_id))
        check_forward(task.sink_id, task.batch_id, state.highest)
        if state.decided:
            return True
        scope = Scope.live(task.run_id, task.batch_id)
        gids = (Gid.parse(g) for g in state.prepared)
        if any(g is not None and not scope.in_flight(g) for g in gids):
            committer = Committer(self.backend, task.sink_id, timeouts=self.timeouts)
            committer.resolve_leftovers(task.run_id, task.batch_id)
            # the resolution may have completed this very batch
            return self.backend.task_state(task.sink_id, task.batch_id).decided
        return False

    def after_prepare(self, gid: Gid) -> None:
        """Roll back our own prepared transaction if the batch was decided without it.

        A zombie attempt (the loser of a speculative pair, killed late, or a task of a
        run that was declared dead) can prepare after its batch's decision. The
        commit's sweep reads the prepared transactions after writing the decision: it
        either saw ours, or our read here sees its decision. A decision cannot name us
        yet (our commit message has not left this task), so a decision found here
        means: roll back, now, rather than hold locks and VACUUM until a later sweep.
        """
        task = self.task
        if self.backend.decided_with(task.sink_id, task.batch_id, str(gid)) is not False:
            return
        self.backend.rollback_prepared(str(gid))
        raise TransientError(
            f"{task.where()}: batch {task.batch_id} was decided without this attempt "
            f"(a late or speculative copy); its transaction {gid} is rolled back",
            gid=str(gid),
        )
