"""The consistent view end to end: a streaming query with option consistentView, in the
shared SparkSession against a real PostgreSQL (what it hides mid-commit:
tests/pg/test_consistent_view.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.postgres import views
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import query_id, run_query, table_ids, write_source

pytestmark = pytest.mark.spark


@pytest.fixture
def view(pg_url: str) -> Iterator[str]:
    name = f"v_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:  # before the table fixture drops
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier("public", name)))


def test_a_stream_with_consistent_view_creates_the_view_and_ends_with_the_tables_rows(
    spark: Any, tmp_path: Path, pg_url: str, table: str, view: str, pg_server: PgServer
) -> None:
    write_source(tmp_path / "src", [range(0, 40), range(40, 90), range(90, 100)])
    options = {"url": pg_url, "table": table, "createTable": "true", "consistentView": view}
    run_query(spark, tmp_path / "src", tmp_path / "chk", options)
    assert table_ids(pg_url, table) == list(range(100))
    sink_id = query_id(tmp_path / "chk")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [found] = [v for v in views.find_views(conn) if v.view.name == view]  # type: ignore[arg-type]
        assert (found.sink_id, found.table) == (sink_id, f'"public"."{table}"')
        columns = conn.execute(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 ORDER BY attnum",
            (f"public.{view}",),
        ).fetchall()
        assert [c[0] for c in columns] == ["id", "payload", "ts", "amount"]
        differ = conn.execute(
            sql.SQL(
                "(SELECT * FROM {t} EXCEPT ALL SELECT * FROM {v}) "
                "UNION ALL (SELECT * FROM {v} EXCEPT ALL SELECT * FROM {t})"
            ).format(t=sql.Identifier(table), v=sql.Identifier(view))
        ).fetchall()
        assert differ == []  # every batch complete: the view shows the table's rows
        left = "SELECT count(*) FROM sqlsink.markers WHERE sink_id = %s"
        assert conn.execute(left, (sink_id,)).fetchone() == (0,)
    assert prepared_transactions(pg_server.admin_url) == []
