"""tests/fix_xdist.py: how make test's processes share the suite."""

from __future__ import annotations

from pathlib import Path

from tests.fix_xdist import LONG_FIRST, SHARED, rank_of, unit_of

REPO = Path(__file__).resolve().parents[2]


def test_a_file_is_a_unit_and_the_benchmarks_smokes_are_one() -> None:
    assert unit_of("tests/pg/test_cli.py::test_x[a::b]") == "tests/pg/test_cli.py"
    assert unit_of("tests/bench/test_steady_smoke.py::test_y") == "benchmarks"
    assert unit_of("tests/bench/test_bench_smoke.py::test_z") == "benchmarks"
    assert rank_of("tests/bench/test_bench_smoke.py::t") == 0
    assert rank_of("tests/unit/test_options.py::t") == len(LONG_FIRST)


def test_every_unit_named_exists() -> None:
    """A renamed file would silently lose its place in the order."""
    for prefix in SHARED:
        assert (REPO / prefix).is_dir(), prefix
    for unit in LONG_FIRST:
        assert unit in SHARED.values() or (REPO / unit).is_file(), unit
