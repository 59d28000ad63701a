"""Option deadLetterTable through real Spark: a stream with bad rows of each kind the
sink judges, across a driver killed after its partitions prepared, keeps the good rows
and the dead letters exactly once and goes on; without the option the batch fails
naming the row and the column; the foreachBatch writer's ``dead_letter_table=``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import decided_batches, query_id, run_query, table_ids, write_records

pytestmark = [pytest.mark.spark, pytest.mark.crash]
REPO = Path(__file__).resolve().parents[2]
SCHEMA = "id BIGINT, payload STRING, amount DOUBLE, qty BIGINT, ratio DOUBLE"
COLUMNS = "id bigint, payload varchar(20), amount real, qty integer, ratio numeric"

# each kind of row the sink judges: (column, the record's change, reason's start)
KINDS = [
    ("payload", {"payload": "a\x00b"}, "a NUL character"),
    ("id", {"id": None}, "NULL into a NOT NULL column"),
    ("payload", {"payload": "x" * 25}, "longer than character varying(20)"),
    ("amount", {"amount": 1e300}, "out of range for real"),
    ("qty", {"qty": 2**40}, "out of range for integer"),
    ("ratio", {"ratio": float("inf")}, "infinity cannot be stored in numeric"),
]


def good(i: int) -> dict[str, Any]:
    return {"id": i, "payload": f"p{i}", "amount": i / 4, "qty": i, "ratio": i / 8}


def bad(batch: int, kind: int) -> dict[str, Any]:
    """A bad row of a kind; its ratio (when not the bad value) tells batch and kind apart."""
    record = {**good(1000 + 10 * batch + kind), **KINDS[kind][1]}
    if KINDS[kind][0] != "ratio":
        record["ratio"] = float(1000 + 10 * batch + kind)
    return record


def batches() -> list[list[dict[str, Any]]]:
    out = []
    for b, ids in enumerate([range(0, 30), range(30, 70), range(70, 100)]):
        records = [good(i) for i in ids]
        for kind in range(len(KINDS)):
            records.insert(3 * kind + 1, bad(b, kind))
        out.append(records)
    return out


def write_bad_source(directory: Path) -> None:
    """JSON lines with Infinity as JSON's extension (Spark's reader allows it)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_records(directory, batches())


@pytest.fixture
def dead_table(pg_url: str) -> Iterator[str]:
    name = f"dl_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def make_table(url: str, table: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (" + COLUMNS + ")").format(sql.Identifier(table)))
        conn.execute(sql.SQL("ALTER TABLE {} ALTER id SET NOT NULL").format(sql.Identifier(table)))


def dead_letters(url: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            sql.SQL(
                "SELECT batch_id, column_name, reason, row_json FROM {} "
                "ORDER BY batch_id, (row_json->>'ratio')"
            ).format(sql.Identifier(table))
        ).fetchall()


def kill_driver_at(point: str, batch: int, tmp_path: Path, url: str, table: str, dead: str) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": point, "batch": batch, "action": "kill"}]))
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYSPARK_PYTHON": sys.executable}
    driver = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.spark.crash_driver",
            "--schema",
            SCHEMA,
            str(tmp_path / "src"),
            str(tmp_path / "chk"),
            url,
            table,
            f"deadLetterTable={dead}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # the fault kills this group, never the test runner
    )
    assert driver.returncode == -signal.SIGKILL, (
        f"the driver was not killed at {point} (exit {driver.returncode}):\n"
        f"{driver.stdout[-2000:]}\n{driver.stderr[-4000:]}"
    )


def test_bad_rows_go_to_the_dead_letters_exactly_once_across_a_driver_kill(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str, dead_table: str
) -> None:
    make_table(pg_url, table)
    write_bad_source(tmp_path / "src")
    kill_driver_at("before_decision", 1, tmp_path, pg_url, table, dead_table)
    assert prepared_transactions(pg_server.admin_url), "batch 1 should be left prepared"
    assert table_ids(pg_url, table) == list(range(30))  # nothing of batch 1 visible
    assert len(dead_letters(pg_url, dead_table)) == len(KINDS)  # batch 0's only
    options = {"url": pg_url, "table": table, "deadLetterTable": dead_table}
    run_query(spark, tmp_path / "src", tmp_path / "chk", options, schema=SCHEMA)
    sink_id = query_id(tmp_path / "chk")
    assert decided_batches(pg_url, sink_id) == {0: True, 1: True, 2: True}  # went on
    assert table_ids(pg_url, table) == list(range(100))  # the good rows, once
    assert [g for g, _ in prepared_transactions(pg_server.admin_url)] == []
    dead = dead_letters(pg_url, dead_table)
    expected = sorted(
        (b, column, float(bad(b, kind)["ratio"]))
        for b in range(3)
        for kind, (column, _, _) in enumerate(KINDS)
    )
    assert sorted((b, c, float(row["ratio"])) for b, c, _, row in dead) == expected  # once each
    for _, column, reason, _ in dead:
        assert any(reason.startswith(r) for c, _, r in KINDS if c == column), reason
    with psycopg.connect(pg_url, autocommit=True) as conn:
        figures = conn.execute(
            "SELECT batch_id, figures->'dead_letters' FROM sqlsink.decisions "
            "WHERE sink_id = %s ORDER BY batch_id",
            (sink_id,),
        ).fetchall()
    assert figures == [(0, len(KINDS)), (1, len(KINDS)), (2, len(KINDS))]
    # status counts them: a column of the recent batches, and the batches' figures in JSON
    status = [sys.executable, "-m", "sqlsink", "status", "--url", pg_url, "--sink-id", sink_id]
    human = subprocess.run(status, capture_output=True, text=True, timeout=60).stdout
    assert "DEAD_LETTERS" in human, human
    doc = json.loads(
        subprocess.run([*status, "--json"], capture_output=True, text=True, timeout=60).stdout
    )
    recent = doc["sinks"][0]["recent_batches"]
    assert sorted(b["figures"]["dead_letters"] for b in recent) == [len(KINDS)] * 3


def test_without_the_option_a_bad_row_fails_the_batch_naming_row_and_column(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    make_table(pg_url, table)
    write_records(tmp_path / "src", [[good(0), good(1), {**good(2), "payload": "a\x00b"}]])
    options = {"url": pg_url, "table": table}
    with pytest.raises(Exception) as failed:
        run_query(spark, tmp_path / "src", tmp_path / "chk", options, partitions=1, schema=SCHEMA)
    text = str(failed.value)
    assert "row 3 of the partition's COPY" in text and "column 'payload'" in text, text[-3000:]
    assert table_ids(pg_url, table) == []


def test_the_foreach_batch_writer_takes_the_option(
    spark: Any, pg_url: str, table: str, dead_table: str
) -> None:
    import sqlsink

    make_table(pg_url, table)
    records = [good(0), bad(0, 0), good(1), bad(0, 2), bad(0, 4)]
    df = spark.createDataFrame(records, SCHEMA).coalesce(1)
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=f"fb-{table[2:]}", query_id="dl-query", dead_letter_table=dead_table
    )
    writer.to(table)(df, 0)
    assert table_ids(pg_url, table) == [0, 1]
    dead = dead_letters(pg_url, dead_table)
    assert [(b, c) for b, c, _, _ in dead] == [(0, "payload"), (0, "payload"), (0, "qty")]
    plain = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fp-{table[2:]}", query_id="dl-plain")
    with pytest.raises(Exception) as failed:
        plain.to(table)(spark.createDataFrame(records[:4], SCHEMA).coalesce(1), 0)
    text = str(failed.value)
    assert "column 'payload'" in text and "row 2 of the partition's COPY" in text, text[-3000:]
