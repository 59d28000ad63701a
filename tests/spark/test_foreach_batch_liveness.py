"""A foreachBatch batch of two DataFrames whose second one computes for longer than
runTimeout, with ``sqlsink recover`` run meanwhile (docs/DESIGN.md invariant 10).

Part 0's partitions are prepared while part 1's Spark job computes its input (here a
slow Python UDF before a shuffle: no task of the sink runs, nothing prepares). The
batch's heartbeat registers the run from the driver while the block is open, so the
operator's recover leaves part 0 to the live run, and the batch commits whole.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sqlsink
from tests.fix_pg import PgServer, forget_sink, prepared_transactions
from tests.pg.test_cli import Result
from tests.pg.test_cli import sqlsink as sqlsink_cli
from tests.spark.streams import decided_batches, run_foreach_batch, table_ids, write_source

pytestmark = pytest.mark.spark

RUN_TIMEOUT_S = 3
COMPUTE_S = 4 * RUN_TIMEOUT_S  # part 1's job: twice as long as the wait before recover


def prepared_of(url: str, sink: str) -> list[tuple[str, float]]:
    """(gid, seconds since it prepared) of the sink's prepared transactions."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT gid, extract(epoch FROM clock_timestamp() - prepared)::float8 "
            "FROM pg_prepared_xacts WHERE gid LIKE %s ORDER BY gid",
            (f"sqlsink\\_{sink}\\_%",),
        ).fetchall()
    return [(str(g), float(a)) for g, a in rows]


def test_recover_while_the_next_part_computes_leaves_the_batch_to_its_run(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    from pyspark.sql import functions as F

    sink = f"slow-{uuid.uuid4().hex[:8]}"
    writer = sqlsink.ForeachBatchWriter(
        url=pg_url, sink_id=sink, createTable="true", runTimeout=f"{RUN_TIMEOUT_S}s"
    )
    write_source(tmp_path / "src", [range(0, 10)])
    part0_prepared = threading.Event()
    recovered: list[Result] = []
    seen: list[list[tuple[str, float]]] = []
    runs: list[str] = []

    # part 1's input: one row takes COMPUTE_S to compute (no type hints: PySpark would
    # take hints for an Arrow UDF's)
    slow_udf = F.udf(lambda i: (time.sleep(COMPUTE_S) if i == 0 else None, i + 100)[1], "bigint")

    def write(df: Any, batch_id: int) -> None:
        runs.append(df.sparkSession.sparkContext.getLocalProperty("spark.jobGroup.id"))
        with writer.batch(batch_id) as b:
            b.append(df.select("id"), table)
            part0_prepared.set()
            # computed before a shuffle: no task of the sink runs while it computes
            b.append(df.select(slow_udf("id").alias("id")).repartition(2), table)

    def operator() -> None:
        """Once part 0 is prepared, wait until its transactions are twice runTimeout old
        (part 1 still computing), then run sqlsink recover as an operator does."""
        if not part0_prepared.wait(120):
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = prepared_of(pg_url, sink)
            if found and min(age for _, age in found) >= 2 * RUN_TIMEOUT_S:
                seen.append(found)
                break
            time.sleep(0.1)
        recovered.append(sqlsink_cli("recover", "--url", pg_url, "--sink-id", sink, "--json"))
        seen.append(prepared_of(pg_url, sink))

    beside = threading.Thread(target=operator, name="operator", daemon=True)
    beside.start()
    try:
        query = run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", write, partitions=2)
        beside.join(60)
        assert not beside.is_alive()
        print("part 0 prepared, before recover:", seen[0])
        print("after recover:", seen[1])
        (result,) = recovered
        assert result.code in (0, 1), result.out + result.err
        (doc,) = result.json["sinks"]
        assert doc["rolled_back"] == 0 and doc["live_runs"] == [str(query.runId)] == runs
        assert [g for g, _ in seen[1]] == [g for g, _ in seen[0]] and len(seen[0]) == 2
        assert all(age >= 2 * RUN_TIMEOUT_S for _, age in seen[0])
        assert query.exception() is None
        assert table_ids(pg_url, table) == [*range(10), *range(100, 110)]
        assert decided_batches(pg_url, sink) == {0: True}
        assert [g for g, _ in prepared_transactions(pg_server.admin_url) if sink in g] == []
        beating = [t for t in threading.enumerate() if t.name.startswith("sqlsink heartbeat")]
        assert beating == []  # ended with the block
    finally:
        forget_sink(pg_url, sink)
