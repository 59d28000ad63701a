"""The foreachBatch writer's API as a Hypothesis state machine (``writer_model`` does the work).

Rules are what a user's code and Spark do: a run starts (a new process, or the same
one: a restart in a notebook); Spark runs the next batch (or re-runs the uncommitted
one with the same records) and calls the user's function, which makes up to two
calls of the writer's API (``to(table)``, a ``batch()`` block with any DataFrames,
``skip``; through the first writer object or a second one with the same sink id) or
none (returns early), at times given as ``writer.wrap(function)``, with at times a
fault (its code raises inside a block or after its calls; the driver dies inside a
block, or before ``commits/N``); the query stops;
``sqlsink recover`` runs with the clock past runTimeout; the user follows the advice
of the documented data-loss error (a run skipped its last batches and stopped:
``writer.skip(N)`` outside the stream, the query stopped), before the restart hits
it or once it did (and the same for a batch a tolerated known defect left undecided).
The user may change the function before a restart (the re-run batch gets the new
code). The checks run after every step, and once more after a final recover
(``teardown``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.sim.writer_model import (
    KNOWN,
    TABLES,
    Call,
    Fault,
    Frame,
    Function,
    WriterWorld,
    failing,
)

Drawn = tuple[str, int, tuple[str, ...], "tuple[int, Drawn] | None"]


def _numbered(calls: list[Drawn]) -> Function:
    """Each table's DataFrames numbered in the order the function hands them."""
    seen: dict[str, int] = {}

    def made(drawn: Drawn) -> Call:
        kind, writer, tables, inner = drawn
        frames, nested, at = [], None, 0
        for index, table in enumerate((*tables, None)):
            if inner is not None and inner[0] == index:
                at, nested = index, made(inner[1])
            if table is not None:
                frames.append(Frame(table, seen.get(table, 0)))
                seen[table] = seen.get(table, 0) + 1
        return Call(kind, writer, tuple(frames), nested, at)

    return Function(tuple(made(c) for c in calls))


WRITERS = st.sampled_from([0, 1])
TABLE = st.sampled_from(TABLES)
SIMPLE = st.one_of(
    st.tuples(st.just("to"), WRITERS, st.tuples(TABLE), st.none()),
    st.tuples(st.just("block"), WRITERS, st.lists(TABLE, max_size=3).map(tuple), st.none()),
    st.tuples(st.just("skip"), WRITERS, st.just(()), st.none()),
)
NESTED = st.tuples(  # a block that makes another call inside it, after some of its parts
    st.just("block"),
    WRITERS,
    st.lists(TABLE, min_size=1, max_size=2).map(tuple),
    st.tuples(st.integers(0, 2), SIMPLE),
)
CALL = st.one_of(SIMPLE, SIMPLE, SIMPLE, NESTED)
# mostly one call per batch (what the API asks for); at times none (returns early), or two
# (a second hand-over of the batch: refused, and its restarts too, until the code changes)
ONE_CALL = st.lists(CALL, min_size=1, max_size=1)
CALLS = st.one_of(ONE_CALL, ONE_CALL, ONE_CALL, st.just([]), st.lists(CALL, min_size=2, max_size=2))
# at times given to foreachBatch as writer.wrap(function)
FUNCTIONS = st.tuples(CALLS, st.sampled_from([False, False, True])).map(
    lambda drawn: replace(_numbered(drawn[0]), wrapped=drawn[1])
)
FAULTS = st.one_of(
    st.none(),
    st.none(),
    st.none(),
    st.builds(
        Fault,
        kind=st.sampled_from(["raise", "die"]),
        call=st.one_of(st.none(), st.integers(0, 1)),
        after=st.integers(0, 2),
    ),
)


class WriterMachine(RuleBasedStateMachine):
    """Sequences of writer calls, restarts and recoveries against the in-memory backend."""

    tolerate: ClassVar[frozenset[str]] = frozenset(KNOWN)  # counted, not failed
    seen: ClassVar[Counter[str]] = Counter()  # what the examples did, summed
    world: WriterWorld

    @initialize(mode=st.sampled_from(["classic", "connect"]))
    def begin(self, mode: str) -> None:
        self.world = WriterWorld(mode, self.tolerate)

    @precondition(lambda self: self.world.run is None)
    @rule(same_process=st.booleans(), recover=st.booleans())
    def restart(self, same_process: bool, recover: bool) -> None:
        """The query starts (again) from its checkpoint; ``recover``: sqlsink recover
        ran before, with the clock past runTimeout."""
        world = self.world
        if recover:
            world.recover()
        if world.loss_seen and world.stuck():  # its user read the error and follows it
            world.skip_outside(world.stuck())
        world.loss_seen = False
        world.start_run(same_process)

    @precondition(lambda self: self.world.run is None and self.world.pending() is not None)
    @rule(function=FUNCTIONS)
    def change_the_function(self, function: Function) -> None:
        """Before a restart, the user changes the function (after a refusal, say): the
        batch Spark re-runs gets the new code with its old records."""
        self.world.change_function(function)

    @precondition(lambda self: self.world.run is not None)
    @rule(
        data=st.data(),
        partitions=st.integers(1, 3),
        fault=FAULTS,
        then=st.sampled_from(["go on", "go on", "go on", "stop", "recover"]),
    )
    def batch(self, data: st.DataObject, partitions: int, fault: Fault, then: str) -> None:
        """Spark runs a batch and calls the function: for a batch planned now, its
        records and what the function does with them are drawn (a re-run has its own);
        then the query goes on, is stopped, or sqlsink recover runs (the clock past
        runTimeout) while it goes on."""
        world = self.world
        function, records = Function(()), 0
        if world.next_batch() not in world.offsets:
            function = data.draw(FUNCTIONS, label="function")
            records = data.draw(st.integers(0, 3), label="records")
        world.run_batch(function, records, partitions, fault)
        if then == "stop" and world.run is not None:
            world.end_run("stopped")
        elif then == "recover":
            world.recover()

    @precondition(lambda self: self.world.run is None and bool(self.world.stuck()))
    @rule()
    def follow_the_advice(self) -> None:
        """writer.skip(N) for each batch a run skipped last before it stopped, before
        the restart's data-loss error."""
        self.world.skip_outside(self.world.stuck())

    @invariant()
    def holds(self) -> None:
        if hasattr(self, "world"):
            self.world.check()

    def teardown(self) -> None:
        if not hasattr(self, "world"):
            return
        world = self.world
        if not failing():
            world.recover()
            world.check(final=True)
        self.seen.update(world.stats)
        self.seen.update(examples=1, runs=len(world.runs), batches=len(world.offsets))


def machine(tolerate: frozenset[str]) -> type[WriterMachine]:
    """The machine with ``tolerate`` (the KNOWN defects counted, not failed) and its own
    ``seen``."""
    attributes = {"tolerate": tolerate, "seen": Counter[str]()}
    return type("WriterMachine", (WriterMachine,), attributes)


def profile(examples: int, steps: int, *, derandomize: bool = True) -> settings:
    """Settings of a run: derandomized (the same examples every time, no example
    database) unless asked otherwise."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=derandomize,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        print_blob=not derandomize,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
