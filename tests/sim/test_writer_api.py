"""The foreachBatch writer's API under Hypothesis: sequences of the calls a user's function
makes, restarts and recoveries, against the in-memory backend (``writer_machine``,
``writer_model``), with the invariants checked after every step and at the end.

- ``test_the_writer_api_holds``: the default run, derandomized (the same examples in
  every run, no example database): ``--api-examples``/``--api-steps`` for more,
  ``--api-random`` for new ones, ``--api-strict`` to fail on the known defects too.
- ``test_the_machine_finds_a_reverted_fix``: with a fix of the writer reverted (issue
  26's F1 and C2 in ``mutants``; the second hand-over refused, one process run id per
  sink and query, the tail skip and ``wrap`` here), the machine finds a violation of
  that very invariant.
- ``test_a_known_defect_still_happens``: each defect the machine found in the rules
  (``writer_model.KNOWN``, tolerated by the default run), as its shortest sequence: it
  fails once the defect is fixed; then remove it from ``KNOWN``.
- ``test_a_fixed_defect_holds``: each defect fixed since, as its shortest sequence, holds
  every invariant with nothing tolerated.
- ``test_a_skipped_last_batch``: the documented case, end to end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from sqlsink.core import writer_batch
from sqlsink.core.writer_batch import PartStart
from tests.fix_sim import API_STEPS, ApiOptions
from tests.sim import mutants
from tests.sim.world import isolated
from tests.sim.writer_machine import machine, profile
from tests.sim.writer_model import (
    KNOWN,
    LINES,
    ORDERS,
    Broken,
    Call,
    Frame,
    Function,
    WriterObject,
    WriterWorld,
)

# what the default run must have met, so that it cannot quietly stop testing something
PATHS = (
    "to returned",
    "block returned",
    "skip returned",
    "task skips (replay)",  # a new run's replay of a decided batch
    "gap filled",  # batches a run never handed, decided empty before the next
    "ConfigError",  # a second hand-over refused
    "wrap skipped",  # a wrapped function returned without handing its batch over
    "documented data-loss error",  # a run skipped its last batch and stopped
)


def test_the_writer_api_holds(api_options: ApiOptions, sim_report: list[str]) -> None:
    started, cpu = time.monotonic(), time.process_time()
    tolerate = frozenset[str]() if api_options.strict else frozenset(KNOWN)
    tested = machine(tolerate)
    with isolated():
        run_state_machine_as_test(
            tested,
            settings=profile(
                api_options.examples, api_options.steps, derandomize=not api_options.random
            ),
        )
    seen = tested.seen
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    sim_report.append(
        f"writer API: {seen['examples']} runs of the machine ({seen['runs']} query runs, "
        f"{seen['batches']} batches) in {elapsed:.1f} s ({cpu:.1f} s of CPU), invariants held"
    )
    known = {k: n for k, n in seen.items() if k.startswith("known: ")}
    if known:
        sim_report.append(
            "  known defects met (tolerated, see tests/sim/writer_model.KNOWN): "
            + ", ".join(f"{k[7:]} x{n}" for k, n in sorted(known.items()))
        )
    assert not [p for p in PATHS if not seen[p]], f"never met: {seen}"


# -- the machine has teeth ----------------------------------------------------------------


@contextmanager
def handed_before_ignored() -> Iterator[None]:
    """A run's second hand-over of a batch in one process judged by the decision only
    (before ``judge_part`` took ``handed_before``)."""
    judge = writer_batch.judge_part

    def judge_part(*args: Any, handed_before: bool = False, **kwargs: Any) -> PartStart:
        return judge(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_batch, "judge_part", judge_part)
        yield


@contextmanager
def run_id_per_writer_object() -> Iterator[None]:
    """The process-made run id per writer object, as before ``ProcessRuns``."""

    def process_run_id(self: WriterWorld, writer: WriterObject) -> str:
        return writer.process_run_id

    def renew_run_id(self: WriterWorld, writer: WriterObject, old: str) -> None:
        writer.process_run_id = self._id("p")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(WriterWorld, "process_run_id", process_run_id)
        mp.setattr(WriterWorld, "renew_run_id", renew_run_id)
        yield


@contextmanager
def skip_outside_passes_nothing() -> Iterator[None]:
    """A skip outside the stream counts every later undecided batch as missing."""
    check = writer_batch.check_skip_outside

    def check_skip_outside(*args: Any) -> frozenset[int]:
        check(*args)
        return frozenset()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_batch, "check_skip_outside", check_skip_outside)
        yield


@contextmanager
def wrap_skips_nothing() -> Iterator[None]:
    """``writer.wrap(function)`` that only calls the function."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(WriterWorld, "unhanded", lambda self, run, batch_id: None)
        yield


@dataclass(frozen=True)
class Reverted:
    fix: str
    mutant: Callable[[], AbstractContextManager[None]]
    invariants: tuple[str, ...]  # what the machine must find broken (one of them)


REVERTED = [
    Reverted("F1", mutants.f1_replay_whenever_decided, ("F1",)),
    Reverted("C2", mutants.c2_unhanded_batches_undecided, ("C2",)),
    Reverted("handed-before", handed_before_ignored, ("F1", "gids")),
    Reverted("connect-writers", run_id_per_writer_object, ("F1", "C2")),
    Reverted("tail-skip", skip_outside_passes_nothing, ("advice",)),
    Reverted("wrap", wrap_skips_nothing, ("C2",)),
]
TEETH_EXAMPLES = 200  # the search's bound; each is found within the first few


@pytest.mark.parametrize("case", REVERTED, ids=[c.fix for c in REVERTED])
def test_the_machine_finds_a_reverted_fix(case: Reverted, sim_report: list[str]) -> None:
    tested = machine(frozenset(KNOWN))  # a known defect is not what it must find
    search = settings(
        profile(TEETH_EXAMPLES, API_STEPS), phases=[Phase.explicit, Phase.generate]
    )  # not shrunk: the first failure is enough, and shrinking it can take minutes
    with case.mutant(), isolated(), pytest.raises(Broken) as found:
        run_state_machine_as_test(tested, settings=search)
    assert found.value.invariant in case.invariants, str(found.value)
    first = str(found.value).splitlines()[0]
    sim_report.append(
        f"writer API, {case.fix} reverted: found after {tested.seen['examples']} examples: "
        f"{first[:200]}"
    )


# -- the known defects, each its shortest sequence ----------------------------------------


def to(table: str, k: int = 0, writer: int = 0) -> Call:
    return Call("to", writer, (Frame(table, k),))


SKIP = Call("skip", 0)
EARLY = Function(())  # if df.isEmpty(): return


def doing(*calls: Call) -> Function:
    return Function(calls)


def batches(world: WriterWorld, *functions: Function, records: int = 2) -> None:
    for function in functions:
        world.run_batch(function, records, 2, None)


def unhanded_first(world: WriterWorld) -> None:
    world.start_run(same_process=False)
    batches(world, doing(to(ORDERS)))
    world.end_run("stopped")
    world.start_run(same_process=True)
    batches(world, EARLY, doing(to(ORDERS)))  # batch 1 not handed: run 1's first


def empty_replayed(world: WriterWorld) -> None:
    world.start_run(same_process=False)
    batches(world, doing(SKIP, to(ORDERS)))  # the second hand-over: refused
    world.start_run(same_process=True)
    batches(world, doing(SKIP, to(ORDERS)))  # the replay: orders skipped


def table_replayed(world: WriterWorld) -> None:
    world.start_run(same_process=False)
    batches(world, doing(to(ORDERS, 0), to(ORDERS, 1)))  # the second to(): refused
    world.start_run(same_process=True)
    batches(world, doing(to(ORDERS, 0), to(ORDERS, 1)))  # the replay: orders#1 skipped


def connect_writers_gap(world: WriterWorld) -> None:
    world.start_run(same_process=False)
    batches(world, doing(to(ORDERS)), EARLY, doing(to(LINES, writer=1)))


def connect_writers_skip(world: WriterWorld) -> None:
    world.start_run(same_process=False)
    batches(world, doing(to(ORDERS, 0), to(ORDERS, 1, writer=1)))


def nested(world: WriterWorld) -> None:
    """with writer.batch(0) as b: b.append(orders, ...); a_helper() -> writer.to(orders)"""
    world.start_run(same_process=False)
    inner = to(ORDERS, 1)
    batches(world, doing(Call("block", 0, (Frame(ORDERS, 0),), inner, 1)))


def nested_after_two_parts(world: WriterWorld) -> None:
    """The inner call adopts the block's first part and rolls back its second."""
    world.start_run(same_process=False)
    outer = (Frame(ORDERS, 0), Frame(LINES, 0))
    batches(world, doing(Call("block", 0, outer, to(ORDERS, 1), 2)))


def skipped_last(world: WriterWorld, *, skipped: int) -> None:
    world.start_run(same_process=False)
    batches(world, doing(to(ORDERS)), *[EARLY] * skipped)
    world.end_run("stopped")


def loss_text(world: WriterWorld) -> None:
    skipped_last(world, skipped=1)
    world.start_run(same_process=True)
    batches(world, doing(to(ORDERS)))


def tail_skip(world: WriterWorld) -> None:
    skipped_last(world, skipped=2)
    world.skip_outside(world.undecided_commits())


@dataclass(frozen=True)
class Defect:
    code: str
    mode: str
    sequence: Callable[[WriterWorld], None]
    invariant: str
    says: str  # in the violation's text


DEFECTS = [
    Defect("unhanded-first", "classic", unhanded_first, "C2", "batches [1] were run"),
]

# fixed since: each sequence holds every invariant with nothing tolerated, and ends as
# the code now ends it (``refused``: the ConfigErrors the writer raised, in order)
FIXED = [
    ("table-replayed", "classic", table_replayed, 2),
    ("connect-writers", "connect", connect_writers_gap, 0),
    ("connect-writers", "connect", connect_writers_skip, 1),
    ("nested-hand-over", "classic", nested, 2),
    ("nested-hand-over", "classic", nested_after_two_parts, 2),
    ("tail-skip", "classic", tail_skip, 0),
]


@pytest.mark.parametrize(
    ("code", "mode", "sequence", "refused"),
    FIXED,
    ids=[f"{f[0]}-{f[2].__name__}" for f in FIXED],
)
def test_a_fixed_defect_holds(
    code: str, mode: str, sequence: Callable[[WriterWorld], None], refused: int
) -> None:
    with isolated():
        world = WriterWorld(mode, frozenset())
        sequence(world)
        world.check()
        world.recover()
        world.check(final=True)
    assert not [k for k in world.stats if k.startswith("known: ")], world.stats
    assert world.stats["ConfigError"] == refused, world.log


@pytest.mark.parametrize(
    "defect", DEFECTS, ids=[f"{d.code}-{d.sequence.__name__}" for d in DEFECTS]
)
def test_a_known_defect_still_happens(defect: Defect) -> None:
    """Not tolerated, the sequence breaks the invariant; tolerated, it is counted as
    this very defect (and as nothing unknown)."""
    with isolated():
        strict = WriterWorld(defect.mode, frozenset(KNOWN) - {defect.code})
        with pytest.raises(Broken) as broken:
            defect.sequence(strict)
            strict.check()
        assert broken.value.invariant == defect.invariant, str(broken.value)
        assert defect.says in str(broken.value), str(broken.value)
        tolerant = WriterWorld(defect.mode, frozenset(KNOWN))
        defect.sequence(tolerant)
        tolerant.check()
    assert tolerant.stats[f"known: {defect.code}"] >= 1, tolerant.stats


# -- the documented case ------------------------------------------------------------------


def rows_of(world: WriterWorld, table: str) -> Sequence[tuple[int, str, int, int]]:
    return sorted(world.table_rows(table).elements())


def test_a_skipped_last_batch() -> None:
    """A run skips its last batch and stops: the restart's first commit stops on it with
    a data-loss error naming it; writer.skip(N) outside the stream, the query stopped,
    decides it empty, and the restart then writes."""
    with isolated():
        world = WriterWorld("classic", frozenset({"loss-text"}))
        skipped_last(world, skipped=1)  # batch 0 written, batch 1 not handed
        world.start_run(same_process=True)
        batches(world, doing(to(ORDERS)))  # batch 2: refused, the run ends
        assert world.run is None and world.stats["documented data-loss error"] == 1
        assert world.undecided_commits() == [1] and 2 not in world.commits
        assert world.calls[-1].outcome == "raised DataLossError"
        world.skip_outside([1])
        assert world.undecided_commits() == []
        world.start_run(same_process=True)
        batches(world, doing(to(ORDERS)))  # batch 2 again
        world.check()
        world.recover()
        world.check(final=True)
    assert world.commits == {0, 1, 2}
    assert rows_of(world, ORDERS) == [(b, ORDERS, 0, i) for b in (0, 2) for i in range(2)]
    assert world.server.prepared == {}
