"""Batch (non-streaming) writes: all partitions or none, and idempotent named loads."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import table_ids

pytestmark = pytest.mark.spark


def frame(spark: Any, ids: range, partitions: int = 4) -> Any:
    return spark.range(ids.start, ids.stop, 1, partitions).selectExpr(
        "id", "concat('row ', id) AS payload"
    )


def save(df: Any, url: str, table: str, mode: str = "append", **options: str) -> None:
    writer = df.write.format("sqlsink").mode(mode).option("url", url).option("table", table)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_batch_append_and_one_off_log_is_removed(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    def one_off_loads() -> Any:
        with psycopg.connect(pg_url) as conn:  # a failed load elsewhere may leave its own
            ensure_schema(conn)  # type: ignore[arg-type]  # when this test runs first
            return conn.execute(
                "SELECT count(*) FROM sqlsink.sinks WHERE sink_id LIKE 'load-%'"
            ).fetchone()

    before = one_off_loads()
    save(frame(spark, range(0, 1000)), pg_url, table, createTable="true")
    assert table_ids(pg_url, table) == list(range(1000))
    assert prepared_transactions(pg_server.admin_url) == []
    assert one_off_loads() == before


def test_batch_write_is_all_or_nothing(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint CHECK (id <> 777), payload text)").format(
                sql.Identifier(table)
            )
        )
    with pytest.raises(Exception, match=r"batch 0, partition \d: writing to table .* failed"):
        save(frame(spark, range(0, 1000)), pg_url, table)
    assert table_ids(pg_url, table) == []  # the three good partitions are not visible either
    assert prepared_transactions(pg_server.admin_url) == []


def test_named_load_runs_once(spark: Any, pg_url: str, table: str) -> None:
    load = f"load-{table[2:]}"
    save(frame(spark, range(0, 300)), pg_url, table, createTable="true", sinkId=load)
    save(frame(spark, range(0, 300)), pg_url, table, createTable="true", sinkId=load)
    assert table_ids(pg_url, table) == list(range(300))


def test_overwrite_is_refused(spark: Any, pg_url: str, table: str) -> None:
    with pytest.raises(Exception, match="sqlsink does not overwrite"):
        save(frame(spark, range(0, 10)), pg_url, table, mode="overwrite", createTable="true")
