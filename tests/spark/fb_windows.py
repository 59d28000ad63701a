"""The crash windows of the design, killed for real through the foreachBatch writer.

A two-table query (tests/spark/foreach_batch_driver.py: ``orders`` appended, ``lines``
upserted, one partition each, so every batch is two prepared transactions) runs in
its own process with a fault armed at batch 1 of three (30, 40 and 30 records); the
fault SIGKILLs the driver, its JVM and its workers. ``killed_at`` asserts what the
kill left (the commit log, the prepared transactions, the rows), ``restarted`` what
the restart makes of it: every record once in both tables, nothing left prepared.
Shared by the main suite (PySpark of the venv) and tests/lines (each older line).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from tests.fix_pg import prepared_transactions
from tests.spark.streams import decided_batches, table_ids, write_source

REPO = Path(__file__).resolve().parents[2]
BATCHES = [range(0, 30), range(30, 70), range(70, 100)]


@dataclass(frozen=True)
class Window:
    """What a kill at ``point`` of batch 1 leaves."""

    point: str
    decided: dict[int, bool]  # the commit log's batches: complete or not
    prepared: int  # batch 1's transactions still prepared
    rows: list[int]  # rows in (orders, lines), sorted


WINDOWS = {
    "before_decision": Window("before_decision", {0: True}, 2, [30, 30]),
    "mid_commit": Window("mid_commit", {0: True, 1: False}, 1, [30, 70]),
    "after_commit": Window("after_commit", {0: True, 1: True}, 0, [70, 70]),
}


@dataclass(frozen=True)
class TwoTables:
    url: str
    admin_url: str
    sink_id: str
    orders: str
    lines: str
    source: Path
    checkpoint: Path
    views: bool = False  # both appended, each with its consistent view v_<table>

    @classmethod
    def create(
        cls, url: str, admin_url: str, name: str, work: Path, *, views: bool = False
    ) -> TwoTables:
        tables = cls(
            url,
            admin_url,
            f"fb-{name}",
            f"o_{name}",
            f"l_{name}",
            work / "src",
            work / "chk",
            views,
        )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint, payload text)").format(
                    sql.Identifier(tables.orders)
                )
            )
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, amount float8)").format(
                    sql.Identifier(tables.lines)
                )
            )
        write_source(tables.source, BATCHES)
        return tables

    def drop(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            for table in (self.orders, self.lines):
                view = sql.Identifier("v_" + table)
                conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view))
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))

    def driver(
        self, python: str, faults: Path | None, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """The query in its own process (session): killed by the fault, or drained."""
        args = [
            str(self.source),
            str(self.checkpoint),
            self.url,
            self.sink_id,
            self.orders,
            self.lines,
            *(["views"] if self.views else []),
        ]
        environment = {
            **os.environ,
            **env,
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
        }
        environment.pop("SQLSINK_FAULTS_FILE", None)
        if faults is not None:
            environment["SQLSINK_FAULTS_FILE"] = str(faults)
        return subprocess.run(
            [python, "-m", "tests.spark.foreach_batch_driver", *args],
            cwd=REPO,
            env=environment,
            capture_output=True,
            text=True,
            timeout=420,
            start_new_session=True,  # the fault kills this group, never the test runner
        )

    def sink_prepared(self) -> list[str]:
        return [gid for gid, _ in prepared_transactions(self.admin_url) if f"{self.sink_id}" in gid]

    def rows(self) -> list[int]:
        return sorted([len(table_ids(self.url, self.orders)), len(table_ids(self.url, self.lines))])


def killed_at(
    tables: TwoTables, point: str, python: str, work: Path, env: dict[str, str] | None = None
) -> None:
    """Run the driver with a kill armed at ``point`` of batch 1; assert what it left."""
    window = WINDOWS[point]
    faults = work / "faults.json"
    faults.write_text(json.dumps([{"point": point, "batch": 1, "action": "kill"}]))
    run = tables.driver(python, faults, env or {})
    output = run.stdout[-2000:] + run.stderr[-4000:]
    assert run.returncode == -signal.SIGKILL, output
    assert decided_batches(tables.url, tables.sink_id) == window.decided, output
    assert len(tables.sink_prepared()) == window.prepared, tables.sink_prepared()
    assert tables.rows() == window.rows


def restarted(tables: TwoTables) -> None:
    """After the restart: every record once in both tables, nothing prepared, all decided."""
    assert table_ids(tables.url, tables.orders) == list(range(100))
    assert table_ids(tables.url, tables.lines) == list(range(100))
    assert tables.sink_prepared() == []
    assert decided_batches(tables.url, tables.sink_id) == {0: True, 1: True, 2: True}
    with psycopg.connect(tables.url) as conn:  # each decision names both tables (status)
        named = conn.execute(
            "SELECT DISTINCT tables FROM sqlsink.decisions WHERE sink_id = %s",
            (tables.sink_id,),
        ).fetchall()
    assert named == [([f"public.{tables.orders}", f"public.{tables.lines}"],)]
