"""Every PySpark line the README claims, each in its own environment (tests/spark_lines.py),
all against the suite's one PostgreSQL: a smoke stream through the foreachBatch writer
(and through format("sqlsink") where the line has the data source API, else its
refusal), and real crash-and-restarts through the foreachBatch writer. The newest line
(the project's venv) runs the whole suite instead.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer
from tests.programs import run_program
from tests.spark.fb_windows import TwoTables, killed_at, restarted
from tests.spark.streams import table_ids, write_source
from tests.spark_lines import LINES, ensure_env

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500)]  # a fresh machine builds the env
REPO = Path(__file__).resolve().parents[2]
# the line's crash windows: two on 3.5 (issue 14), one on every other line
CRASHES = [("3.5", "before_decision"), ("3.5", "mid_commit")] + [
    (line, "mid_commit") for line in LINES if line != "3.5"
]


def line_env() -> dict[str, str]:
    """The clone first on PYTHONPATH: every line runs the code under test."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def has_data_source(line: str) -> bool:
    major, minor = (int(x) for x in line.split("."))
    return (major, minor) >= (4, 1)


@pytest.mark.parametrize("line", list(LINES))
def test_a_smoke_stream_on_every_pyspark_line(
    line: str, tmp_path: Path, pg_url: str, pg_server: PgServer
) -> None:
    python = str(ensure_env(LINES[line]))
    name = uuid.uuid4().hex[:8]
    foreach_table, source_table = f"fb_{name}", f"ds_{name}"
    write_source(tmp_path / "src", [range(0, 40), range(40, 90), range(90, 100)])
    args = [pg_url, foreach_table, str(tmp_path / "src"), str(tmp_path)]
    if has_data_source(line):
        args.append(source_table)
    env = {**os.environ, **line_env(), "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    env.pop("SQLSINK_FAULTS_FILE", None)
    run = run_program("-m", "tests.lines.smoke_program", *args, timeout=600, env=env, python=python)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    try:
        assert report["pyspark"] == LINES[line]
        assert table_ids(pg_url, foreach_table) == list(range(100))
        # the per-batch line in the driver's log (its stderr), with no logging set up by
        # the program: on every line, for the writer (and the data source where it runs)
        sink = "line-" + foreach_table.replace("_", "-")
        assert f" INFO sqlsink: sqlsink {sink}: batch 0: " in run.stderr, run.stderr[-3000:]
        if has_data_source(line):
            assert table_ids(pg_url, source_table) == list(range(100))
            assert report["register_error"] is None
        else:
            assert report["register_error"] == (
                "sqlsink: format('sqlsink') needs PySpark 4.1 or later (the Python data "
                f"source's streaming Arrow writer); this is PySpark {LINES[line]}. Use the "
                "foreachBatch writer instead (sqlsink.ForeachBatchWriter, PySpark 3.5 or "
                "later, the same exactly-once protocol), or upgrade PySpark"
            )
        with psycopg.connect(pg_url) as conn:
            bound = conn.execute(
                "SELECT query_id FROM sqlsink.sinks WHERE sink_id = %s",
                ("line-" + foreach_table.replace("_", "-"),),
            ).fetchall()
            prepared = conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
        assert bound == [(report["query_id"],)]  # Spark's own query id, on every line
        assert [g for (g,) in prepared if name in g] == []
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for table in (foreach_table, source_table):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@pytest.mark.crash
@pytest.mark.parametrize(("line", "point"), CRASHES)
def test_a_crash_and_restart_on_every_pyspark_line(
    line: str, point: str, tmp_path: Path, pg_url: str, pg_server: PgServer
) -> None:
    python = str(ensure_env(LINES[line]))
    tables = TwoTables.create(pg_url, pg_server.admin_url, uuid.uuid4().hex[:10], tmp_path)
    try:
        killed_at(tables, point, python, tmp_path, env=line_env())
        again = tables.driver(python, None, line_env())
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-4000:]
        assert "drained without being killed" in again.stdout
        restarted(tables)
    finally:
        tables.drop()


@pytest.mark.parametrize("line", ["3.5"])
def test_the_foreach_batch_writer_adds_a_column_on_the_oldest_line(
    line: str, tmp_path: Path, pg_url: str, pg_server: PgServer
) -> None:
    """schema_evolution="addColumns" (issue 29 item 1) on the oldest line; on the suite's
    own: tests/spark/test_schema_evolution.py."""
    python = str(ensure_env(LINES[line]))
    table = f"ev_{uuid.uuid4().hex[:8]}"
    write_source(tmp_path / "src", [range(0, 20), range(20, 50)])
    env = {**os.environ, **line_env(), "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    env.pop("SQLSINK_FAULTS_FILE", None)
    args = [pg_url, table, str(tmp_path / "src"), str(tmp_path)]
    run = run_program(
        "-m", "tests.lines.evolve_program", *args, timeout=600, env=env, python=python
    )
    report = json.loads(run.stdout.strip().splitlines()[-1])
    try:
        assert report["pyspark"] == LINES[line]
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, amount, ts IS NULL FROM {} ORDER BY id").format(
                    sql.Identifier(table)
                )
            ).fetchall()
            prepared = conn.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
                ("%" + table.replace("_", "-") + "%",),
            ).fetchone()
        assert rows == [(i, None, True) for i in range(50)] + [
            (i, i / 4, False) for i in range(50, 80)
        ]
        assert prepared == (0,)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@pytest.mark.parametrize("line", ["3.5"])
def test_the_foreach_batch_writer_keeps_the_session_zones_wall_time_on_the_oldest_line(
    line: str, tmp_path: Path, pg_url: str, pg_server: PgServer
) -> None:
    """A timestamp into ``timestamp`` without time zone is the session zone's wall time
    (00:00 in New York stays 00:00) on the oldest line too; ``timestamptz`` the instant."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    from tests.lines.tz_program import WALL, ZONE

    python = str(ensure_env(LINES[line]))
    table = f"tz_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, local_at timestamp, at timestamptz)"
            ).format(sql.Identifier(table))
        )
    env = {**os.environ, **line_env(), "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    env.pop("SQLSINK_FAULTS_FILE", None)
    run = run_program(
        "-m",
        "tests.lines.tz_program",
        pg_url,
        table,
        str(tmp_path),
        timeout=600,
        env=env,
        python=python,
    )
    report = json.loads(run.stdout.strip().splitlines()[-1])
    try:
        assert report == {"pyspark": LINES[line], "error": None}
        with psycopg.connect(pg_url) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            rows = conn.execute(
                sql.SQL("SELECT id, local_at, at FROM {} ORDER BY id").format(sql.Identifier(table))
            ).fetchall()
        walls = [dt.datetime.fromisoformat(t) for t in WALL]
        assert rows == [
            (i, wall, wall.replace(tzinfo=ZoneInfo(ZONE)).astimezone(dt.timezone.utc))
            for i, wall in enumerate(walls)
        ]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@pytest.mark.parametrize("line", ["3.5"])
def test_the_foreach_batch_writer_keeps_dead_letters_on_the_oldest_line(
    line: str, tmp_path: Path, pg_url: str, pg_server: PgServer
) -> None:
    """dead_letter_table= on the oldest line: the good rows in the table, the bad ones in
    the dead-letter table, in the same commit (tests/spark/test_dead_letters.py: the
    suite's own line, and across a driver kill)."""
    from tests.lines.dl_program import COLUMNS

    python = str(ensure_env(LINES[line]))
    name = uuid.uuid4().hex[:8]
    table, dead_table = f"dlt_{name}", f"dld_{name}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (" + COLUMNS + ")").format(sql.Identifier(table)))
    env = {**os.environ, **line_env(), "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    env.pop("SQLSINK_FAULTS_FILE", None)
    run = run_program(
        "-m",
        "tests.lines.dl_program",
        pg_url,
        table,
        dead_table,
        timeout=600,
        env=env,
        python=python,
    )
    report = json.loads(run.stdout.strip().splitlines()[-1])
    try:
        assert report == {"pyspark": LINES[line]}
        assert table_ids(pg_url, table) == [0, 1]
        with psycopg.connect(pg_url) as conn:
            dead = conn.execute(
                sql.SQL("SELECT column_name, (row_json->>'id')::int FROM {} ORDER BY 2").format(
                    sql.Identifier(dead_table)
                )
            ).fetchall()
            prepared = conn.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{name}%",)
            ).fetchone()
        assert dead == [("payload", 100), ("payload", 101), ("qty", 102)]
        assert prepared == (0,)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for t in (table, dead_table):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(t)))
