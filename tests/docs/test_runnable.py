"""Every fenced block the documentation marks ``<!-- runnable -->`` runs as written:
Python blocks in this process, whose ``SparkSession.builder.getOrCreate()`` is the
suite's shared session, each against the embedded server it starts itself; shell
blocks under ``bash -e`` against a database of the suite's PostgreSQL (``$URL``, the
sink's schema installed), with this venv's ``sqlsink`` on PATH. Blocks that need a
cluster or a Spark Connect server are marked ``<!-- exempt: why -->`` in their page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlsink.postgres.schema import ensure_schema
from tests.docs.pages import Block, blocks, pages


def _marked(marker: str) -> list[Block]:
    seen: dict[str, Block] = {}
    for page in pages():
        for block in blocks(page):
            if block.marker == marker and block.code not in seen:  # README repeats a page
                seen[block.code] = block
    return list(seen.values())


RUNNABLE = _marked("runnable")
PYTHON = [b for b in RUNNABLE if b.language == "python"]
SHELL = [b for b in RUNNABLE if b.language in ("sh", "bash", "shell")]


def test_the_quick_starts_are_marked_runnable() -> None:
    readme = [b for b in blocks(pages()[0]) if b.language == "python"]
    assert len(readme) == 2 and all(b.marker == "runnable" for b in readme)
    assert all(b.language in ("python", "sh", "bash", "shell") for b in RUNNABLE)
    assert SHELL, "the runbook's first commands are runnable"


@pytest.mark.spark
@pytest.mark.parametrize("block", PYTHON, ids=[b.name for b in PYTHON])
def test_a_python_block_runs_as_written(block: Block, spark: Any) -> None:
    code = compile(block.code, block.name, "exec")
    exec(code, {"__name__": "__docs__"})  # the documentation's own example


@pytest.mark.parametrize("block", SHELL, ids=[b.name for b in SHELL])
def test_a_shell_block_runs_as_written(block: Block, pg_server: Any, tmp_path: Path) -> None:
    with pg_server.database("docs") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            ensure_schema(conn)
        env = {**os.environ, "URL": url}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, f"{block.name}:\n{done.stdout}\n{done.stderr}"
