"""The per-batch line in a real driver's log, with no logging set up by anyone: the
driver runs in its own process (tests/spark/crash_driver.py for ``format("sqlsink")``,
whose commit runs in a Spark Python worker; tests/spark/foreach_batch_driver.py for the
writer, whose commit runs in the driver's process), its standard error captured. Each
batch's line is there at INFO, and says what the commit log's figures of that batch say
(``BatchFigures.line``), nothing else."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from sqlsink.core.model import BatchFigures
from sqlsink.postgres.survey import decisions as survey
from tests.spark.streams import keyed_table, write_source

pytestmark = [pytest.mark.spark]
REPO = Path(__file__).resolve().parents[2]
BATCHES = [range(0, 30), range(30, 70), range(70, 100)]


def run_driver(module: str, *args: str) -> str:
    """The driver's standard error (its log), after it drained the source."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("SQLSINK_FAULTS_FILE", None)
    driver = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert driver.returncode == 0 and "drained" in driver.stdout, driver.stderr[-4000:]
    return driver.stderr


def lines_of(log: str, sink: str) -> dict[int, str]:
    """The INFO lines of the sink's batches in the log: batch -> the message."""
    found = re.findall(
        rf"^\S+ \S+ INFO sqlsink: (sqlsink {re.escape(sink)}: batch (\d+): .*)$", log, re.M
    )
    return {int(batch): message for message, batch in found}


def figures_of(url: str, sink: str) -> dict[int, BatchFigures | None]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = survey.recent_decisions(conn, sink, 100)  # type: ignore[arg-type]
    return {d.batch_id: d.figures for d in rows}


def test_the_data_sources_line_reaches_the_drivers_log(
    tmp_path: Path, pg_url: str, table: str
) -> None:
    write_source(tmp_path / "src", BATCHES)
    sink = f"log-{uuid.uuid4().hex[:8]}"
    log = run_driver(
        "tests.spark.crash_driver",
        str(tmp_path / "src"),
        str(tmp_path / "chk"),
        pg_url,
        table,
        f"sinkId={sink}",
    )
    figures = figures_of(pg_url, sink)
    assert sorted(figures) == [0, 1, 2]
    said = lines_of(log, sink)
    assert said == {b: f.line(sink, b) for b, f in figures.items() if f is not None}, log[-4000:]
    assert [f.rows for f in figures.values() if f] == [30, 40, 30]


def test_the_writers_line_reaches_the_drivers_log(tmp_path: Path, pg_url: str) -> None:
    write_source(tmp_path / "src", BATCHES)
    sink = f"log-{uuid.uuid4().hex[:8]}"
    orders, lines = f"o_{uuid.uuid4().hex[:8]}", f"l_{uuid.uuid4().hex[:8]}"
    keyed_table(pg_url, orders)
    keyed_table(pg_url, lines)
    log = run_driver(
        "tests.spark.foreach_batch_driver",
        str(tmp_path / "src"),
        str(tmp_path / "chk"),
        pg_url,
        sink,
        orders,
        lines,
    )
    figures = figures_of(pg_url, sink)
    assert sorted(figures) == [0, 1, 2]
    said = lines_of(log, sink)
    assert said == {b: f.line(sink, b) for b, f in figures.items() if f is not None}, log[-4000:]
    assert [f.partitions for f in figures.values() if f] == [2, 2, 2]  # two tables a batch
