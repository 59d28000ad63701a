"""What a user installs: the source distribution and the wheel, built from this checkout
with the project's own build backend, hold what pyproject.toml says and nothing else."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = "import sys, hatchling.build as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def build(kind: str, out: Path) -> Path:
    run = subprocess.run(
        [sys.executable, "-c", BUILD, kind, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out / run.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = build("build_sdist", tmp_path_factory.mktemp("sdist"))
    with tarfile.open(path) as archive:
        names = archive.getnames()
    root = names[0].split("/")[0]
    return sorted(n[len(root) + 1 :] for n in names if n != root)


def test_the_sdist_holds_the_package_sql_docs_and_examples(sdist: list[str]) -> None:
    tops = {name.split("/")[0] for name in sdist}
    assert {"sqlsink", "sql", "docs", "examples", "README.md", "pyproject.toml"} <= tops
    assert "sqlsink/spark/foreach_batch.py" in sdist
    assert "docs/DESIGN.md" in sdist
    assert "sql/setup_role.sql" in sdist
    assert any(name.startswith("sql/001_") for name in sdist)


def test_the_sdist_leaves_out_tests_benchmarks_and_ci(sdist: list[str]) -> None:
    tops = {name.split("/")[0] for name in sdist}
    assert not tops & {"tests", "benchmarks", ".ci", "scripts", "Makefile", ".venv"}
    assert not [name for name in sdist if "__pycache__" in name or name.endswith(".pyc")]


def test_the_wheel_ships_the_sql_inside_the_package_and_no_tests(tmp_path: Path) -> None:
    path = build("build_wheel", tmp_path)
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line
            for line in wheel.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert "sqlsink/sql/setup_role.sql" in names
    assert any(n.startswith("sqlsink/sql/001_") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    # pyspark is the user's: only an extra, never a plain requirement
    spark = [r for r in requires if "pyspark" in r]
    assert spark and all("extra ==" in r for r in spark), spark
