"""What Spark's Python workers import of the sink before it does anything.

Every Python worker of ``format("sqlsink")`` is a fresh process (Spark forks it from a
daemon and imports its worker module after the fork): the planning worker, each task's
worker, the worker that re-creates the data source, and the commit worker. Each of them
imports ``sqlsink.spark.datasource`` to unpickle the data source, on a run's first
batch, so what that module pulls in is paid on the critical path of the first batch in
every one of them (benchmarks/first_batch.py). These tests pin the module set: the
foreachBatch writer's modules never come with it, the PostgreSQL driver comes only where
a worker connects, and ``import sqlsink`` is the errors and ``register`` only."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.programs import REPO

HEAVY_FOR_THE_DATA_SOURCE = {
    "psycopg",  # only where a worker connects (planning, tasks, commit)
    "sqlsink.spark.foreach_batch",  # the foreachBatch writer's
    "sqlsink.core.writer_batch",
    "sqlsink.core.committer",
    "sqlsink.postgres.views",
    "sqlsink.options",
    "pyarrow",
}


def imported_by(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after ``statement``."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_data_source_module_imports_neither_the_driver_nor_the_writer() -> None:
    """The worker that only re-creates the data source needs its class, nothing more."""
    found = imported_by("import sqlsink.spark.datasource")
    assert not found & HEAVY_FOR_THE_DATA_SOURCE, sorted(found & HEAVY_FOR_THE_DATA_SOURCE)


def test_import_sqlsink_is_light_and_still_gives_the_writer() -> None:
    found = imported_by("import sqlsink")
    assert "sqlsink.spark.foreach_batch" not in found
    assert "psycopg" not in found
    # the public names stay where they were
    names = imported_by(
        "import sqlsink\nfrom sqlsink import ForeachBatchWriter\n"
        "assert sqlsink.ForeachBatchWriter is ForeachBatchWriter\n"
        "assert ForeachBatchWriter.__module__ == 'sqlsink.spark.foreach_batch'\n"
        "from sqlsink import *\nassert 'ForeachBatchWriter' in dir()"
    )
    assert "sqlsink.spark.foreach_batch" in names


def test_an_unknown_name_of_the_package_is_an_attribute_error() -> None:
    import pytest

    import sqlsink

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        sqlsink.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
