"""The simulation has teeth: with a fix reverted, it finds a violation.

For each of issue 12's items 1, 2, 3, 8, 9 and 10, and issue 26's C1, R1 and R2, the
fix is patched out (``mutants``) and worlds of seeds 0, 1, ... run until one fails,
within ``MAX_STEPS``. Each item has a profile that makes its scenario common (a second
writer, a checkpoint restored from an older copy, zombies, retries after PREPARE, a
query replaced while half-committed; failovers, two queries in one driver, restarts
in the same process), built from the same world as the default run.

Issue 31's are MariaDB's, on the MariaDB flavour of the in-memory server, where a branch
stays attached to the session that prepared it: the partition written as PostgreSQL's
(no disconnect after XA PREPARE, its session kept for the next use), and the backend's
finish without its wait for a branch still attached (XAER_NOTA read as "not prepared").

Issue 26's three were windows of main (cf9f957) that this simulation found: there the
mutant is the code itself. While a fix is not merged, ``checks.KNOWN`` lists its code
(the default run counts it) and ``test_the_world_holds_with_the_fix`` is expected to
fail for it (``xfail``, strict); once its code leaves ``KNOWN`` (fix/cone and fix/rone
are merged) the profile must run clean, and the mutant must still be found.

The checks that see a broken rule at once (a task going on for a writer the sink
refuses, a plain DELETE erasing an incomplete decision) are then silenced, and the
simulation must still find the harm the revert does further on: a decided batch
partly rolled back, a writer taking another's batch for its own, a batch committed
below the highest, a zombie resolving the newest run's transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import pytest

from tests.fix_sim import SimOptions
from tests.sim import mutants
from tests.sim.checks import KNOWN
from tests.sim.memory import MARIADB
from tests.sim.world import Profile, World, report

MAX_STEPS = 60_000
TASK_CHECKS = frozenset({"task-refused-writer", "task-below-highest", "task-fenced"})


@dataclass(frozen=True)
class Case:
    item: str
    what: str
    mutant: Callable[[], AbstractContextManager[None]]
    profile: Profile
    invariants: frozenset[str]  # what the first violation may be
    silenced: frozenset[str] = frozenset()  # checks silenced for the second search
    harm: frozenset[str] = frozenset()  # what the harm found then may be
    needle: str = ""  # the second search goes on until a violation says this
    found_as: frozenset[str] = frozenset()  # checks.KNOWN codes it may show as: never tolerated
    branch: str = ""  # issue 26: the branch whose merge fixes it
    issue: str = ""  # named by its issue (else issue 12's item, or issue 26's with a branch)


BASE = replace(Profile(), p_second_writer=0.0, p_second_sink=0.0, p_rollback=0.0)

CASES = [
    Case(
        "1",
        "decisions cascade from sinks and no trigger keeps them (schema 1)",
        mutants.none,
        replace(
            BASE,
            cascade=True,
            p_replace=1.0,
            crash_at=(("COMMIT PREPARED", 0.3), ("mark complete", 0.3)),
        ),
        frozenset({"1"}),
        frozenset({"log-erased"}),
        frozenset({"1"}),
    ),
    Case(
        "2",
        "a binding without a query id (a batch load) passes every check",
        mutants.item_2_null_binding_passes,
        replace(BASE, p_second_writer=1.0, p_second_is_load=1.0),
        frozenset({"8"}),
        TASK_CHECKS,
        frozenset({"8", "7"}),
    ),
    Case(
        "3",
        "no check_forward: a batch below the highest decided passes as a replay",
        mutants.item_3_no_forward_check,
        replace(BASE, p_rollback=1.0, rollback=0.2),
        frozenset({"9"}),
        TASK_CHECKS,
        frozenset({"9", "7"}),
    ),
    Case(
        "8",
        "abort without the binding check, acting on other runs (b5cc5c7's abort_batch)",
        mutants.item_8_abort_beyond_its_run,
        replace(BASE, p_second_writer=1.0),
        frozenset({"10", "8"}),
        frozenset(),
        frozenset({"10", "8"}),
        "an abort acts beyond its own run",
        frozenset({"abort-acts-on-another-query"}),
    ),
    Case(
        "9",
        "fencing ignored: superseded runs commit, resolve, write",
        mutants.item_9_fencing_ignored,
        replace(BASE, pause=0.03, zombie_restart=0.3),
        frozenset({"10"}),
        TASK_CHECKS,
        frozenset({"10"}),
        "superseded before it took the sink lock, rolled back",
    ),
    Case(
        "10",
        "a retry does not adopt its earlier attempt's prepared transaction",
        mutants.item_10_no_adoption,
        replace(BASE, p_keyed=1.0),
        frozenset({"12"}),
    ),
    Case(
        "C1",
        "a failover took batch K's decision, Spark committed K: its prepared transactions "
        "are rolled back as any leftover (main's before_write and Scope.keeps)",
        mutants.c1_lost_decision_resolved,
        replace(BASE, failover=0.01, p_shared_driver=0.0),
        frozenset({"9"}),
        needle="held the last copy of its rows",
        found_as=frozenset({"lost-decision-rolled-back"}),
        branch="fix/cone",
    ),
    Case(
        "C1-blind",
        "a recover that read no checkpoint rolls back a streaming sink's undecided batch "
        "above the highest decided one: the last copy of a batch Spark committed whose "
        "decision a failover took (main's cli/recover.py without Scope.unsure)",
        mutants.c1_blind_recover,
        replace(BASE, failover=0.03, p_shared_driver=0.0, p_checkpoint_unreadable=1.0),
        frozenset({"9"}),
        needle="a recover without --checkpoint",
        found_as=frozenset({"lost-decision-rolled-back-blind"}),
        branch="fix/recover",
    ),
    Case(
        "R1",
        "a second query in the owner's driver: its abort, with no message, takes the "
        "owner's run by the shared driver token (main's abort_batch and data source)",
        mutants.r1_abort_by_driver_token,
        replace(BASE, p_shared_driver=1.0, failover=0.0),
        frozenset({"10"}),
        needle="an abort acts beyond its own run",
        found_as=frozenset({"abort-acts-on-another-query"}),
        branch="fix/rone",
    ),
    Case(
        "R2",
        "a kept session that a fenced run recorded as its lock holder serves the new run, "
        "and is ended as the fenced run's (main's end_fenced_holders and unlock_sink)",
        mutants.r2_holder_by_stale_record,
        replace(  # runs end by failed tasks (drivers live on) and restart in their
            BASE,  # process; every first commit lists slowly; recover comes often
            same_process=1.0,
            restart=0.3,
            crash_driver=0.0,
            crash_task=0.03,
            slow_listing=1.0,
            slow_listing_s=(15.0, 30.0),
            recover=0.05,
            failover=0.0,
            p_shared_driver=0.0,
        ),
        frozenset({"10"}),
        needle="which is not superseded",
        found_as=frozenset({"live-session-ended"}),
        branch="fix/rone",
    ),
    Case(
        "MariaDB-disconnect",
        "MariaDB: the partition keeps its session after XA PREPARE (checks after PREPARE "
        "on it, then gives it back to be kept, as on PostgreSQL) instead of disconnecting",
        mutants.mariadb_no_disconnect_after_prepare,
        replace(BASE, flavour=MARIADB),
        frozenset({"1"}),
        needle="still prepared after the final recover",
        issue="31",
    ),
    Case(
        "MariaDB-wait",
        "MariaDB: XAER_NOTA on a listed branch (still attached to the session that "
        "prepared it) read as not prepared, instead of waited for (MariaDBBackend._finish)",
        mutants.mariadb_nota_read_as_gone,
        replace(BASE, flavour=MARIADB),
        frozenset({"5"}),
        issue="31",
    ),
]
ISSUE_26 = [c for c in CASES if c.branch]


def search(
    case: Case, silenced: frozenset[str], invariants: frozenset[str], needle: str = ""
) -> tuple[World, str, int, int]:
    """Worlds of seeds 0, 1, ... under the mutant until one fails (with ``needle`` in its
    violation): (world, its report, the seed, the steps run in all). Every failure met
    on the way must be a violation of ``invariants``."""
    steps = seed = 0
    tolerate = (frozenset(KNOWN) - case.found_as) | silenced
    with case.mutant():
        while steps < MAX_STEPS:
            world = World(seed, case.profile, tolerate=tolerate)
            failure = world.run()
            steps += world.sim.steps
            seed += 1
            if failure is None:
                continue
            text = report(world, failure)
            assert failure.kind == "violation", text
            assert failure.invariant in invariants, text
            if needle in failure.text:
                return world, text, seed - 1, steps
    pytest.fail(
        f"{_name(case)} reverted ({case.what}): no violation in {steps:,} steps over {seed} seeds",
        pytrace=False,
    )


def _name(case: Case) -> str:
    if case.issue:
        return f"issue {case.issue} {case.item}"
    return f"issue 26 {case.item}" if case.branch else f"issue 12 item {case.item}"


@pytest.mark.parametrize("case", CASES, ids=[f"item-{c.item}" for c in CASES])
def test_the_simulation_finds_a_reverted_fix(
    case: Case, sim_options: SimOptions, sim_report: list[str]
) -> None:
    if sim_options.seed is not None:
        pytest.skip("--sim-seed replays one seed of the default run")
    searches = [(frozenset[str](), case.invariants, "")]
    if case.harm:
        searches.append((case.silenced, case.harm, case.needle))
    for silenced, invariants, needle in searches:
        world, _, seed, steps = search(case, silenced, invariants, needle)
        failure = world.sim.failure
        assert failure is not None
        how = (
            "first violation"
            if not (silenced or needle)
            else "with the direct checks silenced, its harm"
            if silenced
            else "its harm"
        )
        sim_report.append(
            f"{_name(case)} reverted ({case.what}): {how} found at seed {seed}, "
            f"after {steps:,} steps (step {world.sim.steps} of that world): "
            f"{failure.text.splitlines()[0]}"
        )


HOLD_STEPS = 15_000  # each issue-26 profile, without its mutant


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            marks=pytest.mark.xfail(
                bool(c.found_as & KNOWN.keys()),
                reason=f"open on main until {c.branch} is merged: checks.KNOWN lists "
                f"{sorted(c.found_as & KNOWN.keys())}; then remove it from there",
                strict=True,
            ),
        )
        for c in ISSUE_26
    ],
    ids=[f"issue-26-{c.item}" for c in ISSUE_26],
)
def test_the_world_holds_with_the_fix(
    case: Case, sim_options: SimOptions, sim_report: list[str]
) -> None:
    """Issue 26's profiles run clean on the code as it is (its window's checks strict)."""
    if sim_options.seed is not None:
        pytest.skip("--sim-seed replays one seed of the default run")
    steps = seed = 0
    tolerate = frozenset(KNOWN) - case.found_as
    while steps < HOLD_STEPS:
        world = World(seed, case.profile, tolerate=tolerate)
        failure = world.run()
        if failure is not None:
            pytest.fail(report(world, failure), pytrace=False)
        steps += world.sim.steps
        seed += 1
    sim_report.append(f"issue 26 {case.item}'s profile, no mutant: {steps:,} steps, clean")
