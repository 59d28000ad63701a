"""mode=upsert on MariaDB end to end: real Spark, a private MariaDB (tests/fix_mariadb.py).

- ``format("sqlsink")``: keys repeated across batches and a deleteColumn; the driver
  SIGKILLed before batch 1's decision, the query restarted from its checkpoint: the
  exact final table, nothing of the sink left in ``XA RECOVER``.
- The foreachBatch writer (``batch.upsert``, range-partitioned by the key) and a batch
  write (``df.write.format("sqlsink")``, mode=upsert) give the same table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import sqlsink
from sqlsink.mariadb.connection import connect, execute, rows
from tests.fix_mariadb import MariaServer
from tests.spark.streams import query_id, run_query, write_records
from tests.spark.test_mariadb_stream import decided, sink_branches

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]
CDC = "id BIGINT, name STRING, qty INT, deleted BOOLEAN"


def rec(i: int, name: str, qty: int, deleted: bool = False) -> dict[str, Any]:
    return {"id": i, "name": name, "qty": qty, "deleted": deleted}


# each key at most once in a batch (a round-robin shuffle orders a batch's rows anyhow);
# repeated across batches: the later batch wins
BATCHES = [
    [rec(1, "a", 1), rec(2, "b", 1), rec(3, "c", 1), rec(4, "d", 1)],
    [rec(1, "a2", 2), rec(3, "c", 0, deleted=True), rec(5, "e", 1), rec(2, "b2", 2)],
    [rec(3, "c-back", 3), rec(1, "a", 0, deleted=True), rec(6, "f", 1), rec(2, "b3", 3)],
]
AFTER_0 = [(1, "a", 1), (2, "b", 1), (3, "c", 1), (4, "d", 1)]
FINAL = [(2, "b3", 3), (3, "c-back", 3), (4, "d", 1), (5, "e", 1), (6, "f", 1)]


@pytest.fixture
def keyed(mariadb_server: MariaServer) -> str:
    table = f"mu_{uuid.uuid4().hex[:10]}"
    conn = connect(mariadb_server.url())
    try:
        execute(
            conn,
            f"CREATE TABLE `{table}` (id bigint PRIMARY KEY, name varchar(20), qty int) "
            "ENGINE=InnoDB",
        )
    finally:
        conn.close()
    return table


def table_of(server: MariaServer, table: str) -> list[tuple[Any, ...]]:
    conn = connect(server.url())
    try:
        return [tuple(r) for r in rows(conn, f"SELECT id, name, qty FROM `{table}` ORDER BY id")]
    finally:
        conn.close()


def test_an_upsert_stream_killed_before_a_decision_restarts_to_the_exact_table(
    spark: Any, tmp_path: Path, mariadb_server: MariaServer, keyed: str
) -> None:
    url = mariadb_server.url()
    write_records(tmp_path / "src", BATCHES)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "before_decision", "batch": 1, "action": "kill"}]))
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYSPARK_PYTHON": sys.executable}
    driver = subprocess.run(
        [sys.executable, "-m", "tests.spark.crash_driver", "--schema", CDC,
         str(tmp_path / "src"), str(tmp_path / "chk"), url, keyed,
         "mode=upsert", "deleteColumn=deleted"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        start_new_session=True,
    )  # fmt: skip
    assert driver.returncode == -signal.SIGKILL, driver.stderr[-4000:]
    sink_id = query_id(tmp_path / "chk")
    assert decided(mariadb_server, sink_id) == {0: True}
    assert table_of(mariadb_server, keyed) == AFTER_0  # nothing of batch 1 visible
    assert [g for g in sink_branches(mariadb_server) if sink_id in g]  # batch 1 prepared
    options = {"url": url, "table": keyed, "mode": "upsert", "deleteColumn": "deleted"}
    run_query(spark, tmp_path / "src", tmp_path / "chk", options, schema=CDC)
    assert table_of(mariadb_server, keyed) == FINAL
    assert decided(mariadb_server, sink_id) == {0: True, 1: True, 2: True}
    assert sink_branches(mariadb_server) == []


def test_the_foreach_batch_writer_and_a_batch_write_upsert(
    spark: Any, tmp_path: Path, mariadb_server: MariaServer, keyed: str
) -> None:
    url = mariadb_server.url()
    writer = sqlsink.ForeachBatchWriter(url=url, sink_id=f"fbu-{keyed[3:]}")

    def upsert(df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as batch:
            batch.upsert(df, keyed, delete_column="deleted")

    write_records(tmp_path / "src", BATCHES)
    events = spark.readStream.schema(CDC).option("maxFilesPerTrigger", 1)
    query = (
        events.json(str(tmp_path / "src")).repartition(2).writeStream.foreachBatch(upsert)
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    assert table_of(mariadb_server, keyed) == FINAL
    assert decided(mariadb_server, writer.sink_id) == {0: True, 1: True, 2: True}
    frame = spark.createDataFrame(
        [(4, "d2", 4, False), (5, None, None, True), (7, "g", 1, False)], CDC
    ).repartition(2, "id")
    (
        frame.write.format("sqlsink").mode("append")
        .option("url", url).option("table", keyed)
        .option("mode", "upsert").option("deleteColumn", "deleted")
        .save()
    )  # fmt: skip
    assert table_of(mariadb_server, keyed) == [
        (2, "b3", 3), (3, "c-back", 3), (4, "d2", 4), (6, "f", 1), (7, "g", 1)
    ]  # fmt: skip
    assert sink_branches(mariadb_server) == []
