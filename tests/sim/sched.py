"""The baton scheduler: every actor is a thread, and exactly one of them runs at a time.

The core is synchronous code, so an actor (a task attempt, a driver, a ``recover``)
runs the real core in a thread of its own. Whenever it is about to do something
another actor could observe (a statement on the in-memory server, a write to a Spark
checkpoint) it calls ``Actor.step``: that hands the baton back to the scheduler and
waits. The scheduler picks the next actor with its seeded ``random.Random``, so a
seed fixes the whole interleaving, and the result does not depend on how the
operating system schedules threads: they never run at the same time.

A crash is delivered at a step: the actor's ``step`` raises ``Crash`` (a
``BaseException``, so no ``except Exception`` of the code under test can swallow it)
and from then on every step raises it again at once, without yielding, so the
thread unwinds to its end.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRACE_KEPT = 30


class Crash(BaseException):
    """The actor's process died here (raised inside the actor at its current step)."""


class Violation(BaseException):
    """An invariant of docs/DESIGN.md section 2 was broken."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"invariant {invariant}: {message}")
        self.invariant = invariant
        self.message = message


@dataclass
class Failure:
    """Why a simulated world failed: the first violation or unexpected exception."""

    kind: str  # "violation" | "exception" | "stuck"
    text: str
    invariant: str | None = None


class Actor:
    """One simulated process (or thread of one), running ``program(actor)``."""

    def __init__(self, sim: Sim, name: str, kind: str, program: Callable[[Actor], Any]) -> None:
        self.sim = sim
        self.name = name
        self.kind = kind
        self.program = program
        self.thread: threading.Thread | None = None
        self._go = threading.Lock()
        self._go.acquire()
        self.label = "start"
        self.wait: Callable[[], bool] | None = None
        self.deadline: float | None = None
        self.paused_until = 0.0
        self.done = False
        self.crashed = False
        self.crash_pending = False
        self.killed = False  # Spark asked to kill it: it may die at any later step
        self.result: Any = None
        self.error: BaseException | None = None
        self.on_exit: list[Callable[[Actor], None]] = []
        self.data: dict[str, Any] = {}

    # -- inside the actor's thread ------------------------------------------------------

    def step(
        self, label: str, wait: Callable[[], bool] | None = None, deadline: float | None = None
    ) -> None:
        """Yield to the scheduler before doing ``label``; resumed when picked.

        ``wait``: the actor is only picked once it returns True (or ``deadline`` passed)."""
        if self.crashed or self.sim.failure is not None:
            self.crashed = True
            raise Crash
        self.label, self.wait, self.deadline = label, wait, deadline
        self.sim._baton.release()
        self._go.acquire()
        self.wait = self.deadline = None
        if self.crash_pending or self.sim.failure is not None:
            self.crash_pending = False
            self.crashed = True
            raise Crash

    def _main(self) -> None:
        try:
            self.result = self.program(self)
        except Crash:
            self.crashed = True
        except Violation as exc:
            self.sim.fail(Failure("violation", str(exc), exc.invariant))
        except BaseException as exc:
            self.error = exc
        finally:
            self.done = True
            for callback in self.on_exit:
                try:
                    callback(self)
                except Violation as exc:
                    self.sim.fail(Failure("violation", str(exc), exc.invariant))
                except BaseException as exc:  # a bug of the simulation itself
                    self.sim.fail(Failure("exception", f"{self.name} exit: {exc!r}"))
            self.sim._baton.release()

    # -- seen from the scheduler --------------------------------------------------------

    def ready(self, now: float) -> bool:
        if self.done or now < self.paused_until:
            return False
        if self.wait is None:
            return True
        return self.wait() or (self.deadline is not None and now >= self.deadline)

    def wakes_at(self, now: float) -> float | None:
        """When this actor becomes ready by time alone (None: only by someone's action)."""
        if self.done:
            return None
        if now < self.paused_until:
            return self.paused_until
        return self.deadline


class Sim:
    """The scheduler of one world: its clock, its actors, its trace."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.steps = 0
        self.actors: list[Actor] = []
        self.trace: deque[str] = deque(maxlen=TRACE_KEPT)
        self.failure: Failure | None = None
        self.current: Actor | None = None
        self._baton = threading.Lock()
        self._baton.acquire()

    def clock(self) -> float:
        return self.now

    def spawn(self, name: str, kind: str, program: Callable[[Actor], Any]) -> Actor:
        actor = Actor(self, name, kind, program)
        self.actors.append(actor)
        return actor

    def fail(self, failure: Failure) -> None:
        if self.failure is None:
            self.failure = failure

    def live(self) -> list[Actor]:
        self.actors = [a for a in self.actors if not a.done]
        return self.actors

    def resume(self, actor: Actor, *, crash: bool = False) -> None:
        """Run ``actor`` until its next step (or its end); ``crash``: it dies at this step."""
        if actor.done:
            return
        if crash and actor.thread is None:  # never ran: it simply never starts
            actor.crashed = actor.done = True
            for callback in actor.on_exit:
                callback(actor)
            return
        actor.crash_pending = crash
        self.current = actor
        if actor.thread is None:
            actor.thread = threading.Thread(target=actor._main, name=actor.name, daemon=True)
            actor.thread.start()
        else:
            actor._go.release()
        self._baton.acquire()
        self.current = None
        if actor.done and actor.thread is not None:
            actor.thread.join()

    def record(self, text: str) -> None:
        self.trace.append(f"#{self.steps:<6} t={self.now:9.2f}  {text}")

    def teardown(self) -> None:
        """End every actor still alive (after a failure, or at the end of a world)."""
        for actor in list(self.actors):
            while not actor.done:
                self.resume(actor, crash=True)
        self.actors.clear()

    def describe(self) -> str:
        return "\n".join(self.trace)
