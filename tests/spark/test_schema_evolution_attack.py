"""Option schemaEvolution attacked through the foreachBatch writer on a real Spark: a
batch whose later part adds a column to a table an earlier part of the same batch
wrote (the earlier part's prepared transactions hold the table until the batch's own
decision, so the ALTER can never get its lock)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import sqlsink
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import decided_batches, run_foreach_batch, write_source

pytestmark = pytest.mark.spark


def columns_of(url: str, table: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f"public.{table}",),
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_a_later_part_adding_a_column_to_a_table_the_batch_wrote_is_refused_at_once(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """Part 0 appends (id, payload) to the table, part 1 the same rows' (id, payload,
    amount) to it: part 1's ALTER would wait on part 0's prepared transactions, which
    only this batch's decision ends. The sink refuses part 1 at once (not after the lock
    wait, not naming its own batch's transactions as a dead run's to recover), saying
    what to do; nothing of the batch is committed, nothing stays prepared, the table
    is unchanged."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint, payload text)").format(sql.Identifier(table))
        )
    sink_id = f"evolve-{uuid.uuid4().hex[:8]}"
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=sink_id, schema_evolution="addColumns", lockTimeout="30s"
    )

    def two_parts(batch_df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as b:
            b.append(batch_df.select("id", "payload"), table)
            b.append(batch_df.select("id", "payload", "amount"), table)

    write_source(tmp_path / "src", [range(0, 10)])
    with pytest.raises(Exception) as failed:
        run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", two_parts, partitions=2)
    text = str(failed.value)  # foreachBatch's: Spark's prefix, then the function's error
    assert "[FOREACH_BATCH_USER_FUNCTION_ERROR]" in text.splitlines()[0], text[:500]
    refusal = (
        f"sqlsink.errors.ConfigError: sink {sink_id!r}: part 1 of batch 0 would alter table "
        f"public.{table} (add column 'amount': schemaEvolution), but part 0 of this batch "
        "wrote rows to it: its prepared transactions hold the table until the batch's "
        "decision, so the ALTER TABLE cannot run now. Nothing was changed; nothing of the "
        "batch is committed. Fix: give the DataFrame with the new columns or types first "
        "among the batch's parts writing the table"
    )
    assert refusal in text, text[:3000]
    assert columns_of(pg_url, table) == ["id", "payload"]
    assert prepared_transactions(pg_server.admin_url) == []
    assert decided_batches(pg_url, sink_id) == {}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        assert count.fetchone() == (0,)


def test_an_upsert_stream_gains_columns_then_a_narrower_run_keeps_them(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """mode=upsert with addColumns: the key is unchanged, the new columns are added and
    upserted; a later run from the checkpoint with the old (narrower) schema upserts
    keys again: their rows keep the values of the columns it does not write (an upsert
    updates the columns written), new keys have NULL there; nothing prepared."""
    from tests.spark.streams import add_source_file, run_query

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, payload text)").format(
                sql.Identifier(table)
            )
        )
    options = {"url": pg_url, "table": table, "mode": "upsert", "schemaEvolution": "addColumns"}
    write_source(tmp_path / "src", [range(0, 20), range(10, 30)])
    run_query(spark, tmp_path / "src", tmp_path / "chk", options)
    assert columns_of(pg_url, table) == ["id", "payload", "ts", "amount"]
    add_source_file(tmp_path / "src", 2, range(25, 40))
    run_query(
        spark, tmp_path / "src", tmp_path / "chk", options, schema="id BIGINT, payload STRING"
    )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, payload, amount FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
    assert rows == [(i, f"record {i} ✓", i / 4 if i < 30 else None) for i in range(40)]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        key = conn.execute(
            "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
            "i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass "
            "AND i.indisprimary",
            (f"public.{table}",),
        ).fetchall()
    assert key == [("id",)]
    assert prepared_transactions(pg_server.admin_url) == []


def test_a_later_part_adds_a_column_when_the_earlier_part_wrote_no_rows(
    spark: Any, pg_url: str, table: str, pg_server: PgServer
) -> None:
    """An earlier part with no rows prepared nothing: nothing holds the table, so a
    later part's column is added, and the batch commits."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table)))
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url,
        sink_id=f"evolve-{uuid.uuid4().hex[:8]}",
        query_id="evolve-parts",
        schema_evolution="addColumns",
    )
    with writer.batch(0) as b:
        b.append(spark.range(0, 0), table)
        b.append(spark.range(0, 3).selectExpr("id", "CAST(id AS STRING) AS note"), table)
    assert columns_of(pg_url, table) == ["id", "note"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, note FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
    assert rows == [(0, "0"), (1, "1"), (2, "2")]
    assert prepared_transactions(pg_server.admin_url) == []
