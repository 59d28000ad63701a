"""``sqlsink.register``'s warning about Spark's Python workers (issue 15 items 2 and 3):
right for a local venv, the cluster recipe's relative path, and Spark Connect."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from sqlsink.spark.datasource import register


class _Sources:
    def __init__(self) -> None:
        self.registered: list[Any] = []

    def register(self, source: Any) -> None:
        self.registered.append(source)


class ClassicSession:
    """Stands in for SparkSession: register() only calls spark.dataSource.register."""

    def __init__(self) -> None:
        self.dataSource = _Sources()


class ConnectSession(ClassicSession):
    pass


ConnectSession.__module__ = "pyspark.sql.connect.session"

in_venv = pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests run in the venv")


def warned(caplog: pytest.LogCaptureFixture, session: Any) -> bool:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sqlsink"):
        register(session)
    assert session.dataSource.registered
    return any("PYSPARK_PYTHON" in r.getMessage() for r in caplog.records)


@in_venv
def test_warns_when_the_workers_run_another_python(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert warned(caplog, ClassicSession())
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert warned(caplog, ClassicSession())
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert not warned(caplog, ClassicSession())


@in_venv
def test_a_relative_path_to_this_python_is_this_python(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster recipe: PYSPARK_PYTHON=./environment/bin/python, the driver that very
    interpreter (the unpacked copy in the directory it is submitted from)."""
    here = Path(sys.executable).parent.parent
    monkeypatch.chdir(here)
    monkeypatch.setenv("PYSPARK_PYTHON", os.path.join(".", os.path.relpath(sys.executable, here)))
    assert not warned(caplog, ClassicSession())


@in_venv
def test_no_worker_warning_on_a_spark_connect_session(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's PYSPARK_PYTHON does not apply: Connect's workers run on its server."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert not warned(caplog, ConnectSession())
