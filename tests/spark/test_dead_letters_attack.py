"""Attacks on option deadLetterTable through real Spark (issue 29 item 2)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.spark.streams import table_ids

pytestmark = pytest.mark.spark


@pytest.fixture
def dead_table(pg_url: str) -> Iterator[str]:
    name = f"dl_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.mark.xfail(
    strict=True,
    reason="spark/datasource.py's rerun() compares the load's input rows (dead letters "
    "included) with the decision's rows (dead letters excluded): the same load run "
    "again is refused as 'not a re-run'; the decision would have to carry its dead letters",
)
def test_a_named_load_with_dead_letters_run_again_is_a_rerun(
    spark: Any, pg_url: str, table: str, dead_table: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint NOT NULL, payload text)").format(
                sql.Identifier(table)
            )
        )
    df = spark.range(0, 20, 1, 2).selectExpr(
        "id", "CASE WHEN id = 7 THEN concat('a', char(0), 'b') ELSE concat('p', id) END AS payload"
    )

    def save() -> None:
        (
            df.write.format("sqlsink")
            .mode("append")
            .option("url", pg_url)
            .option("table", table)
            .option("sinkId", f"load-{table[2:]}")
            .option("deadLetterTable", dead_table)
            .save()
        )

    save()
    assert table_ids(pg_url, table) == [i for i in range(20) if i != 7]
    save()  # the same load again: skipped with a warning, never refused
    assert table_ids(pg_url, table) == [i for i in range(20) if i != 7]
