"""MariaDB behind the seam, end to end (issue 31): real Spark, a private MariaDB server
(tests/fix_mariadb.py), ``url=mariadb://...``.

- ``format("sqlsink")``: every record exactly once; the driver SIGKILLed before the
  decision and after it, then the query restarted from its checkpoint: every record
  once, nothing of the sink left in ``XA RECOVER`` (the kill between two ``XA COMMIT``s,
  ``mid_commit``, is killed at the protocol level in tests/mariadb/test_crash.py, through
  Spark on PostgreSQL in tests/spark/test_crash.py, and among the protocol steps the
  MariaDB chaos rounds draw their kills from: one driver JVM less here); before the
  restart after a kill before the decision, an operator's ``sqlsink status`` and
  ``recover --checkpoint`` with the query's real checkpoint (the commands' other cases:
  tests/mariadb/test_cli.py). A batch write all or nothing.
- The foreachBatch writer: one batch into two tables, atomically (a part that fails
  leaves nothing of the batch in the other table, nothing prepared)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sqlsink
from sqlsink.mariadb import xid
from sqlsink.mariadb.connection import connect, execute, rows
from tests.fix_mariadb import MariaServer
from tests.mariadb.protocol import ids_of, prepared_of
from tests.mariadb.test_cli import cli, document
from tests.spark.streams import query_id, run_foreach_batch, run_query, write_source
from tests.spark.test_crash import kill_driver_at

pytestmark = pytest.mark.spark
BATCHES = [range(0, 30), range(30, 70), range(70, 100)]


@pytest.fixture
def mtable() -> str:
    return f"m_{uuid.uuid4().hex[:10]}"


def ids(server: MariaServer, table: str) -> list[int]:
    conn = connect(server.url())
    try:
        return sorted(int(r[0]) for r in rows(conn, f"SELECT id FROM `{table}`"))
    finally:
        conn.close()


def sink_branches(server: MariaServer) -> list[str]:
    """The sink's prepared branches (its formatID, a valid gid) in XA RECOVER."""
    conn = server.connect(root=True)
    try:
        with conn.cursor() as cur:
            cur.execute("XA RECOVER")
            found = [xid.from_recover_row(r) for r in cur.fetchall()]
    finally:
        conn.close()
    return sorted(str(g) for g in found if g is not None)


def decided(server: MariaServer, sink_id: str) -> dict[int, bool]:
    conn = connect(server.url())
    try:
        found = rows(
            conn,
            "SELECT batch_id, completed_at IS NOT NULL FROM sqlsink.decisions "
            "WHERE sink_id = %s ORDER BY batch_id",
            (sink_id,),
        )
    finally:
        conn.close()
    return {int(b): bool(c) for b, c in found}


def run_ends(server: MariaServer, sink_id: str, within_s: float = 20.0) -> list[str]:
    """How the sink's runs ended, as the query listener recorded it (it records when the
    query terminates, on Spark's listener thread: waited for, at most ``within_s``)."""
    deadline = time.monotonic() + within_s
    while True:
        conn = connect(server.url())
        try:
            found = rows(
                conn,
                "SELECT ended_how FROM sqlsink.runs WHERE sink_id = %s ORDER BY first_seen",
                (sink_id,),
            )
        finally:
            conn.close()
        ends = [str(r[0]) for r in found]
        if (found and None not in [r[0] for r in found]) or time.monotonic() > deadline:
            return ends
        time.sleep(0.2)


def test_a_stream_writes_every_record_once(
    spark: Any, tmp_path: Path, mariadb_server: MariaServer, mtable: str
) -> None:
    url = mariadb_server.url()
    write_source(tmp_path / "src", BATCHES)
    run_query(
        spark,
        tmp_path / "src",
        tmp_path / "chk",
        {"url": url, "table": mtable, "createTable": "true"},
    )
    assert ids(mariadb_server, mtable) == list(range(100))
    assert decided(mariadb_server, query_id(tmp_path / "chk")) == {0: True, 1: True, 2: True}
    assert sink_branches(mariadb_server) == []
    conn = connect(url)
    try:  # the values round-trip: utf8mb4 text, microsecond UTC timestamps, doubles
        row = rows(conn, f"SELECT payload, ts, amount FROM `{mtable}` WHERE id = 7")[0]
    finally:
        conn.close()
    assert row[0] == "record 7 ✓" and str(row[1]) == "2026-01-01 00:00:07" and row[2] == 1.75
    assert run_ends(mariadb_server, query_id(tmp_path / "chk")) == ["stopped"]
    # a replay of batch 1 (as if the driver died after the commit, before commits/1)
    for name in ("2", ".2.crc"):
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    run_query(spark, tmp_path / "src", tmp_path / "chk", {"url": url, "table": mtable})
    assert ids(mariadb_server, mtable) == list(range(100))


@pytest.mark.parametrize(
    ("point", "decided_then", "left_then"),
    [
        ("before_decision", {0: True}, 2),  # batch 1 prepared, undecided
        ("after_decision", {0: True, 1: False}, 2),  # decided, nothing committed yet
    ],
)
def test_driver_killed_at_a_step_then_restarted(
    spark: Any,
    tmp_path: Path,
    mariadb_server: MariaServer,
    mtable: str,
    point: str,
    decided_then: dict[int, bool],
    left_then: int,
) -> None:
    url = mariadb_server.url()
    write_source(tmp_path / "src", BATCHES)
    kill_driver_at(point, 1, tmp_path, url, mtable)
    sink_id = query_id(tmp_path / "chk")
    assert decided(mariadb_server, sink_id) == decided_then
    left = [g for g in sink_branches(mariadb_server) if f"_{sink_id}_" in f"_{g}_"]
    assert len(left) == left_then, left
    assert ids(mariadb_server, mtable) == list(range(30))  # nothing of batch 1 visible
    if point == "before_decision":
        operator_recovers_with_the_checkpoint(url, mtable, tmp_path / "chk", sink_id, left)
    run_query(spark, tmp_path / "src", tmp_path / "chk", {"url": url, "table": mtable})
    assert ids(mariadb_server, mtable) == list(range(100))
    assert decided(mariadb_server, sink_id) == {0: True, 1: True, 2: True}
    assert sink_branches(mariadb_server) == []


def operator_recovers_with_the_checkpoint(
    url: str, table: str, checkpoint: Path, sink: str, left: list[str]
) -> None:
    """``sqlsink status`` and ``recover --checkpoint`` on a MariaDB URL with the killed
    query's real checkpoint, before its restart: ``status`` shows the live run and its
    undecided branches; ``recover --checkpoint`` finds the sink from the checkpoint and
    leaves the live run's branches; ``--force --run-id`` declares the run dead and, as
    Spark's checkpoint has no commits/1, rolls the branches back: batch 0's rows exactly,
    XA RECOVER empty of the sink's branches."""
    status = document(cli(url, "status", "--json", "--sink-id", sink), "status")
    (doc,) = status["sinks"]
    assert sorted(p["gid"] for p in doc["prepared"]) == sorted(left) and doc["live"] is True
    assert doc["last_complete_batch"] == 0 and doc["incomplete_batches"] == []
    run = doc["runs"][0]["run_id"]

    kept = cli(url, "recover", "--json", "--checkpoint", str(checkpoint))
    plan = document(kept, "recover")
    assert [s["sink_id"] for s in plan["sinks"]] == [sink]
    assert {(a["action"], a["why"]) for a in plan["actions"]} == {("leave", "live_run")}
    relation = {b["batch_id"]: b["state"] for b in plan["checkpoint"]["batches"]}
    assert relation[0] == "consistent" and 1 in relation, plan["checkpoint"]
    assert sorted(prepared_of(url, sink)) == sorted(left)

    done = cli(url, "recover", "--checkpoint", str(checkpoint), "--force", "--run-id", run)
    assert done.code == 0, done.out + done.err
    assert "committed in Spark and in the database" in done.out or "batch 0" in done.out
    assert prepared_of(url, sink) == [] and ids_of(url, table) == list(range(30))


@pytest.fixture
def two_tables(mariadb_server: MariaServer) -> Iterator[tuple[str, str]]:
    a, b = f"fa_{uuid.uuid4().hex[:8]}", f"fb_{uuid.uuid4().hex[:8]}"
    conn = connect(mariadb_server.url())
    execute(conn, f"CREATE TABLE `{a}` (id bigint NOT NULL, payload text) ENGINE=InnoDB")
    execute(conn, f"CREATE TABLE `{b}` (id bigint NOT NULL, half bigint NOT NULL) ENGINE=InnoDB")
    conn.close()
    yield a, b


def test_foreach_batch_writes_one_batch_to_two_tables_atomically(
    spark: Any, tmp_path: Path, mariadb_server: MariaServer, two_tables: tuple[str, str]
) -> None:
    from pyspark.sql import functions as F

    a, b = two_tables
    url = mariadb_server.url()
    writer = sqlsink.ForeachBatchWriter(url=url, sink_id=f"fb-{a[3:]}")

    def both(df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as batch:
            batch.append(df.select("id", "payload"), a)
            # batch 1 carries a NULL into b's NOT NULL column: the part fails
            half = F.when((F.col("id") == 50) & F.lit(batch_id == 1), None).otherwise(
                F.floor(F.col("id") / 2)
            )
            batch.append(df.select("id", half.cast("bigint").alias("half")), b)

    write_source(tmp_path / "src", [range(0, 40), range(40, 90)])
    with pytest.raises(Exception) as failed:
        run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", both, partitions=2)
    assert "half" in str(failed.value)  # the column is named
    assert ids(mariadb_server, a) == list(range(40))  # batch 0 in both tables,
    assert ids(mariadb_server, b) == list(range(40))  # nothing of batch 1 in either
    assert sink_branches(mariadb_server) == []
    assert decided(mariadb_server, writer.sink_id) == {0: True}


def _one_off_loads(server: MariaServer) -> int:
    conn = connect(server.url())
    try:
        return int(
            rows(conn, "SELECT count(*) FROM sqlsink.sinks WHERE sink_id LIKE 'load-%'")[0][0]
        )
    finally:
        conn.close()


def test_a_batch_write_is_all_or_nothing_and_a_named_load_runs_once(
    spark: Any, mariadb_server: MariaServer, mtable: str
) -> None:
    """df.write.format("sqlsink"): one decision for every partition; the one-off load's
    log removed after it; a named load (sinkId) written once however often it runs; the
    password given as the option password, not in the URL."""
    url, password = mariadb_server.url().replace(":sink-pw@", "@"), "sink-pw"

    def save(df: Any, **more: str) -> None:
        writer = df.write.format("sqlsink").mode("append")
        for key, value in {"url": url, "table": mtable, "password": password, **more}.items():
            writer = writer.option(key, value)
        writer.save()

    frame = spark.range(0, 1000, 1, 4).selectExpr("id", "concat('row ', id) AS payload")
    before = _one_off_loads(mariadb_server)
    save(frame, createTable="true")
    assert ids(mariadb_server, mtable) == list(range(1000))
    assert _one_off_loads(mariadb_server) == before
    assert sink_branches(mariadb_server) == []
    load = f"load-{mtable[2:]}"
    more = spark.range(1000, 1300, 1, 3).selectExpr("id", "concat('row ', id) AS payload")
    save(more, sinkId=load)
    save(more, sinkId=load)
    assert ids(mariadb_server, mtable) == list(range(1300))
    # a partition that fails (a NULL into NOT NULL) leaves nothing of the write visible
    bad = spark.range(2000, 2400, 1, 4).selectExpr(
        "id", "CASE WHEN id = 2333 THEN NULL ELSE 'x' END AS payload"
    )
    conn = connect(mariadb_server.url())
    execute(conn, f"ALTER TABLE `{mtable}` MODIFY payload longtext NOT NULL")
    conn.close()
    with pytest.raises(Exception, match="payload"):
        save(bad)
    assert ids(mariadb_server, mtable) == list(range(1300))
    assert sink_branches(mariadb_server) == []
