"""Options of the protocol simulation (tests/sim) and its summary at the end of the run.

pytest tests/sim                    the default run: seeds 0, 1, ... until --sim-steps
pytest tests/sim --sim-seed N       replay one seed of the default run (a failure's)
pytest tests/sim --sim-steps 1000000   a longer run
pytest tests/sim --sim-strict       the known windows (tests/sim/checks.KNOWN) fail too
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

DEFAULT_STEPS = 150_000

_REPORT = pytest.StashKey[list[str]]()


@dataclass(frozen=True)
class SimOptions:
    seed: int | None
    steps: int
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
def sim_report(request: pytest.FixtureRequest) -> list[str]:
    """Lines shown in the summary at the end of the run (what the simulation did)."""
    return request.config.stash[_REPORT]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("protocol simulation")
        for line in lines:
            terminalreporter.write_line(line)
