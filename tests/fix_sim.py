"""Options of the protocol simulation (tests/sim) and its summary at the end of the run.

pytest tests/sim                    the default run: seeds 0, 1, ... until --sim-steps
pytest tests/sim --sim-seed N       replay one seed of the default run (a failure's)
pytest tests/sim --sim-steps 1000000   a longer run
pytest tests/sim --sim-strict       the known windows (tests/sim/checks.KNOWN) fail too

The foreachBatch writer's state machine (tests/sim/test_writer_api.py, Hypothesis):

pytest tests/sim --api-examples 5000 --api-random   a longer run, not derandomized
pytest tests/sim --api-strict       the known defects (tests/sim/writer_model.KNOWN) fail too
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

DEFAULT_STEPS = 150_000
API_EXAMPLES = 150  # the writer's state machine: examples of the default run
API_STEPS = 40  # and steps per example

_REPORT = pytest.StashKey[list[str]]()


@dataclass(frozen=True)
class SimOptions:
    seed: int | None
    steps: int
    strict: bool


@dataclass(frozen=True)
class ApiOptions:
    """The writer's state machine: how many examples, of how many steps; derandomized
    (the same examples every run, no example database) unless ``random``."""

    examples: int
    steps: int
    random: bool
    strict: bool


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sim", "the protocol simulation (tests/sim)")
    group.addoption(
        "--sim-seed",
        type=int,
        default=None,
        help="run only this seed of the simulation's default run (replays a failure)",
    )
    group.addoption(
        "--sim-steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"steps of the simulation's default run, over seeds 0, 1, ... "
        f"(default {DEFAULT_STEPS})",
    )
    group.addoption(
        "--sim-strict",
        action="store_true",
        default=False,
        help="fail the simulation on the known windows of the core too (checks.KNOWN)",
    )
    group.addoption(
        "--api-examples",
        type=int,
        default=API_EXAMPLES,
        help=f"examples of the writer's state machine (default {API_EXAMPLES})",
    )
    group.addoption(
        "--api-steps",
        type=int,
        default=API_STEPS,
        help=f"steps per example of the writer's state machine (default {API_STEPS})",
    )
    group.addoption(
        "--api-random",
        action="store_true",
        default=False,
        help="the writer's state machine with random examples (not derandomized; a "
        "failure prints the blob that reproduces it)",
    )
    group.addoption(
        "--api-strict",
        action="store_true",
        default=False,
        help="fail the writer's state machine on its known defects too (writer_model.KNOWN)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_REPORT] = []


@pytest.fixture
def sim_options(request: pytest.FixtureRequest) -> SimOptions:
    config = request.config
    return SimOptions(
        config.getoption("--sim-seed"),
        config.getoption("--sim-steps"),
        config.getoption("--sim-strict"),
    )


@pytest.fixture
def api_options(request: pytest.FixtureRequest) -> ApiOptions:
    config = request.config
    return ApiOptions(
        config.getoption("--api-examples"),
        config.getoption("--api-steps"),
        config.getoption("--api-random"),
        config.getoption("--api-strict"),
    )


@pytest.fixture
def sim_report(request: pytest.FixtureRequest) -> list[str]:
    """Lines shown in the summary at the end of the run (what the simulation did)."""
    return request.config.stash[_REPORT]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("protocol simulation")
        for line in lines:
            terminalreporter.write_line(line)
