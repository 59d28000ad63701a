"""A view as the target and a role without INSERT, refused at planning in the sink's
words (issue 29 item 3): the first line the user reads from a real Spark query, after
Spark's own fixed prefix, names what is wrong and the fix; nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer
from tests.pg.test_planning_errors import as_role, ensure_log, role  # noqa: F401 -- a fixture
from tests.spark.test_first_errors import batch_error, first_line, stream_error

pytestmark = pytest.mark.spark


@pytest.fixture
def view_over(pg_url: str, table: str) -> Iterator[str]:
    name = f"v_{table[2:]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ddl = "CREATE TABLE {} (id bigint, payload text, ts timestamptz, amount float8)"
        conn.execute(sql.SQL(ddl).format(sql.Identifier(table)))
        view = "CREATE VIEW {} AS SELECT * FROM {}"
        conn.execute(sql.SQL(view).format(sql.Identifier(name), sql.Identifier(table)))
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(name)))


def test_a_stream_into_a_view(spark: Any, pg_url: str, view_over: str, tmp_path: Path) -> None:
    error = stream_error(spark, tmp_path, {"url": pg_url, "table": view_over})
    line = first_line(error)
    base = f"public.t_{view_over[2:]}"
    assert line.startswith(f"sqlsink.errors.ConfigError: table public.{view_over} is a view: "), (
        line
    )
    assert f"Fix: write to its base table {base} (option table={base})" in line, line
    with psycopg.connect(pg_url) as conn:
        count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(view_over))
        assert conn.execute(count).fetchone() == (0,)


def test_a_batch_write_without_insert(
    spark: Any,
    pg_url: str,
    pg_server: PgServer,
    role: str,  # noqa: F811 -- the fixture imported above
    table: str,
) -> None:
    ensure_log(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table)))
        grant = sql.SQL("GRANT SELECT ON {} TO {}")
        conn.execute(grant.format(sql.Identifier(table), sql.Identifier(role)))
    options = {"url": as_role(pg_url, role), "table": table, "sinkId": f"grant-{table[2:]}"}
    line = first_line(batch_error(spark, options))
    assert line.startswith(
        f"sqlsink.errors.ConfigError: role {role} lacks INSERT on table public.{table}; "
    ), line
    assert f'Fix: GRANT INSERT ON "public"."{table}" TO "{role}"' in line, line
