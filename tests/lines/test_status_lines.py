"""``sqlsink status`` is true at once on PySpark 3.5 too (issue 30 item 1), through the
foreachBatch writer (the only entry point there): a stopped query is STOPPED within 5 s,
one failing on bad data FAILED with its error, a driver killed mid-commit not "all well"
(tests/spark/test_status_live.py runs the same on the project's PySpark, both entry
points)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer
from tests.lines.test_spark_lines import line_env
from tests.programs import run_program
from tests.spark.fb_windows import TwoTables, killed_at
from tests.spark.streams import write_records, write_source
from tests.spark.test_status_live import STOPPED_WITHIN_S, finished_by_its_fix
from tests.spark_lines import LINES, ensure_env

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500)]
LINE = "3.5"


def test_stopped_and_failed_on_pyspark_35(tmp_path: Path, pg_url: str, pg_server: PgServer) -> None:
    python = str(ensure_env(LINES[LINE]))
    name = uuid.uuid4().hex[:8]
    good, bad = f"good_{name}", f"bad_{name}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint, payload text, ts timestamptz, "
                "amount float8 CONSTRAINT amount_positive CHECK (amount >= 0))"
            ).format(sql.Identifier(bad))
        )
    write_source(tmp_path / "good", [range(0, 10)])
    row = {"id": 1, "payload": "b", "ts": "2026-01-01T00:00:00Z", "amount": -1.0}
    write_records(tmp_path / "bad", [[row]])
    env = {**os.environ, **line_env(), "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    env.pop("SQLSINK_FAULTS_FILE", None)
    args = [pg_url, good, bad, str(tmp_path / "good"), str(tmp_path / "bad"), str(tmp_path)]
    try:
        run = run_program(
            "-m", "tests.lines.status_program", *args, timeout=900, env=env, python=python
        )
        report = json.loads(run.stdout.strip().splitlines()[-1])
        assert report["pyspark"] == LINES[LINE]
        assert report["stop"]["state"] == "stopped", report
        assert report["stop"]["ended"]["run_id"] == report["stop_run_id"]
        assert report["stop_seen_after_s"] < STOPPED_WITHIN_S, report
        assert report["raised"], report
        assert report["fail"]["state"] == "failed", report
        assert "amount_positive" in report["fail"]["ended"]["error"], report
        assert report["fail_seen_after_s"] < STOPPED_WITHIN_S, report
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for table in (good, bad):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@pytest.mark.crash
def test_killed_mid_commit_on_pyspark_35(tmp_path: Path, pg_url: str, pg_server: PgServer) -> None:
    python = str(ensure_env(LINES[LINE]))
    tables = TwoTables.create(pg_url, pg_server.admin_url, uuid.uuid4().hex[:10], tmp_path)
    try:
        killed_at(tables, "mid_commit", python, tmp_path, env=line_env())
        finished_by_its_fix(pg_url, tables.sink_id)
    finally:
        tables.drop()
