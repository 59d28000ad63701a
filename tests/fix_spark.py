"""One local SparkSession shared by every test that needs Spark.

Spark's Python workers must run in this interpreter (the venv with pyarrow and
psycopg): PYSPARK_PYTHON is set before the JVM starts. ``local[2,3]`` gives two
cores and lets a failed task be retried (plain local mode never retries).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sqlsink.core.faults import ENV as FAULTS_ENV


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-rounds",
        type=int,
        default=1,
        help="rounds of tests/chaos (each drains a source through repeated crashes)",
    )
    parser.addoption("--chaos-seed", type=int, default=None, help="seed of the chaos runs")
    parser.addoption(
        "--chaos-kill-weights",
        default=None,
        help="protocol steps drawn more often for kills, e.g. mid_commit=5,after_decision=2",
    )
    parser.addoption(
        "--soak-batches",
        type=int,
        default=25,
        help="micro-batches of tests/spark/test_soak.py (a long run: 500)",
    )


@pytest.fixture(scope="session")
def faults_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "faults.json"
    path.write_text("[]")
    return path


@pytest.fixture(scope="session")
def spark(faults_file: Path) -> Iterator[Any]:
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ[FAULTS_ENV] = str(faults_file)
    from tests.spark.streams import local_session

    session = local_session(
        "sqlsink-tests",
        master="local[2,3]",
        **{
            "spark.python.worker.reuse": "true",
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        },
    )
    yield session
    session.stop()


class Faults:
    """Arm faults for one test; ``fired()`` lists those that went off."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = Path(f"{path}.fired")

    def __call__(self, specs: list[dict[str, Any]]) -> None:
        self.log.unlink(missing_ok=True)
        self.path.write_text(json.dumps(specs))

    def fired(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def faults(faults_file: Path) -> Iterator[Faults]:
    armed = Faults(faults_file)
    yield armed
    faults_file.write_text("[]")
    armed.log.unlink(missing_ok=True)
