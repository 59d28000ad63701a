"""mode=upsert end to end: last row per key wins, deletes, replays, key conflicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import run_query, write_records

pytestmark = pytest.mark.spark
CDC = "id BIGINT, name STRING, qty INT, deleted BOOLEAN"


def make_table(url: str, table: str, ddl: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(ddl).format(sql.Identifier(table)))


def rows(url: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        query = sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier(table))
        return [tuple(r) for r in conn.execute(query)]


def rec(i: int, name: str, qty: int, deleted: bool = False) -> dict[str, Any]:
    return {"id": i, "name": name, "qty": qty, "deleted": deleted}


BATCHES = [
    [rec(1, "a", 1), rec(2, "b", 1), rec(1, "a2", 2), rec(3, "c", 1), rec(1, "a3", 3)],
    [rec(2, "b2", 5), rec(3, "c", 0, deleted=True), rec(4, "d", 1), rec(4, "d", 9, deleted=True)],
    [rec(4, "d-back", 2), rec(5, "e", 1), rec(2, "b3", 7)],
]
FINAL = [(1, "a3", 3), (2, "b3", 7), (4, "d-back", 2), (5, "e", 1)]


def upsert_options(url: str, table: str, **extra: str) -> dict[str, str]:
    return {"url": url, "table": table, "mode": "upsert", "deleteColumn": "deleted", **extra}


def test_upsert_with_deletes_last_row_wins(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    make_table(pg_url, table, "CREATE TABLE {} (id bigint PRIMARY KEY, name text, qty int)")
    write_records(tmp_path / "src", BATCHES)
    run_query(spark, tmp_path / "src", tmp_path / "chk", upsert_options(pg_url, table), None, CDC)
    assert rows(pg_url, table) == FINAL
    assert prepared_transactions(pg_server.admin_url) == []


def test_upsert_replay_ends_with_the_same_table(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    make_table(pg_url, table, "CREATE TABLE {} (id bigint PRIMARY KEY, name text, qty int)")
    write_records(tmp_path / "src", BATCHES)
    opts = upsert_options(pg_url, table)
    run_query(spark, tmp_path / "src", tmp_path / "chk", opts, None, CDC)
    for batch in ("1", "2"):  # replay the last two batches
        for name in (batch, f".{batch}.crc"):
            (tmp_path / "chk" / "commits" / name).unlink()
    run_query(spark, tmp_path / "src", tmp_path / "chk", opts, None, CDC)
    assert rows(pg_url, table) == FINAL


def test_every_column_a_key_does_nothing_on_conflict(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    make_table(pg_url, table, "CREATE TABLE {} (id bigint, name text, PRIMARY KEY (id, name))")
    write_records(tmp_path / "src", [[{"id": 1, "name": "x"}, {"id": 1, "name": "x"}],
                                     [{"id": 1, "name": "x"}, {"id": 1, "name": "y"}]])  # fmt: skip
    opts = {"url": pg_url, "table": table, "mode": "upsert"}
    run_query(spark, tmp_path / "src", tmp_path / "chk", opts, None, "id BIGINT, name STRING")
    assert rows(pg_url, table) == [(1, "x"), (1, "y")]


def test_explicit_key_columns_need_a_unique_index(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    make_table(pg_url, table, "CREATE TABLE {} (id bigint, name text, qty int)")
    write_records(tmp_path / "src", [[rec(1, "a", 1)]])
    opts = {"url": pg_url, "table": table, "mode": "upsert"}
    with pytest.raises(Exception, match="has no primary key; set the option keyColumns"):
        run_query(
            spark, tmp_path / "src", tmp_path / "chk", opts, None, "id BIGINT, name STRING, qty INT"
        )
    opts["keyColumns"] = "id"
    with pytest.raises(Exception, match=r"CREATE UNIQUE INDEX ON public\.t_\w+ \(id\)"):
        run_query(
            spark,
            tmp_path / "src",
            tmp_path / "chk2",
            opts,
            None,
            "id BIGINT, name STRING, qty INT",
        )
    assert rows(pg_url, table) == []


def test_two_partitions_touching_one_key_fail_fast_with_advice(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    make_table(pg_url, table, "CREATE TABLE {} (id bigint PRIMARY KEY, name text, qty int)")
    write_records(tmp_path / "src", [[rec(7, f"n{i}", i) for i in range(8)]])
    opts = upsert_options(pg_url, table, lockTimeout="1s")
    with pytest.raises(Exception, match="partition the DataFrame by the table's key"):
        run_query(spark, tmp_path / "src", tmp_path / "chk", opts, 2, CDC)
    assert rows(pg_url, table) == []
    assert prepared_transactions(pg_server.admin_url) == []


@pytest.mark.parametrize("semantic", ["at_least_once", "none"])
def test_upsert_with_weaker_semantics(
    spark: Any, tmp_path: Path, pg_url: str, table: str, semantic: str, pg_server: PgServer
) -> None:
    make_table(pg_url, table, "CREATE TABLE {} (id bigint PRIMARY KEY, name text, qty int)")
    write_records(tmp_path / "src", BATCHES)
    opts = upsert_options(pg_url, table, semantic=semantic)
    run_query(spark, tmp_path / "src", tmp_path / "chk", opts, None, CDC)
    assert rows(pg_url, table) == FINAL
    assert prepared_transactions(pg_server.admin_url) == []
