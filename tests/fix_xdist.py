"""How ``make test`` spreads the suite over processes (pytest-xdist, ``-n N --dist
loadfile``; the Makefile's ``TEST_WORKERS``). Most of the suite waits (on servers, kills,
lock timeouts, Spark's triggers), so three processes on two cores take about half the
time of one.

The unit of work is a test file, as ``--dist loadfile`` makes it: a file's module-scoped
servers and clusters are started once, and its tests run in their order. One exception:
the benchmarks' smoke runs (tests/bench) share ``benchmarks/work`` (the generated data,
the directories of the servers they start, checkpoints that ``run.py`` clears), so they
are one unit and run one after another on one process. The longest units are handed out
first, so that no process is left with one of them at the end. Without ``-n`` (plain
``pytest``), this plugin does nothing.

(pytest-xdist's ``--dist loadgroup`` would group by a mark, but its workers name the
group by a node attribute that pytest 9 no longer reads; the scheduler hook is public.)"""

from __future__ import annotations

from typing import Any

import pytest

SHARED = {"tests/bench/": "benchmarks"}  # a directory whose files must not run side by side
# the units that take longest (several minutes each on 2 cores), handed out first
LONG_FIRST = (
    "benchmarks",
    "tests/lines/test_spark_lines.py",
    "tests/chaos/test_chaos.py",
    "tests/spark/test_clean_stop.py",
    "tests/examples/test_examples.py",
    "tests/spark/test_crash.py",
)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file, or its directory's shared unit."""
    path = nodeid.split("::", 1)[0]
    for prefix, unit in SHARED.items():
        if path.startswith(prefix):
            return unit
    return path


def rank_of(nodeid: str) -> int:
    unit = unit_of(nodeid)
    return LONG_FIRST.index(unit) if unit in LONG_FIRST else len(LONG_FIRST)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Units(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # the order is the workers' (below), not by size
    return Units(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In xdist's workers (each collects the same list): the long units first, the rest
    in their usual order (a stable sort)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: rank_of(item.nodeid))
