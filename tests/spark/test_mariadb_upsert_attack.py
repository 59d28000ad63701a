"""Attack on mode=upsert on MariaDB through real Spark: a key in two partitions of one
batch (a DataFrame not partitioned by the key), with a short lockTimeout."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sqlsink.mariadb.connection import connect, execute
from tests.fix_mariadb import MariaServer
from tests.spark.test_mariadb_stream import sink_branches
from tests.spark.test_mariadb_upsert import CDC, table_of

pytestmark = pytest.mark.spark


def test_a_key_in_two_partitions_of_a_batch_write_fails_with_the_fix_nothing_left(
    spark: Any, mariadb_server: MariaServer
) -> None:
    """Key 1 in both partitions: the second waits on the first's prepared branch until
    lockTimeout; the write fails saying so and how to partition; the table is as before
    and nothing of the sink is left prepared (as on PostgreSQL, whose second partition
    waits the same way)."""
    url = mariadb_server.url()
    table = f"mua_{uuid.uuid4().hex[:10]}"
    conn = connect(url)
    try:
        execute(conn, f"CREATE TABLE `{table}` (id bigint PRIMARY KEY, name varchar(20), qty int)")
        execute(conn, f"INSERT INTO `{table}` VALUES (1, 'old', 0)")
    finally:
        conn.close()
    data = [(1, "a", 1, False), (2, "b", 1, False), (1, "c", 2, False), (3, "d", 1, False)]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(data, 2), CDC)
    assert frame.rdd.glom().map(lambda p: sorted({r[0] for r in p})).collect() == [[1, 2], [1, 3]]
    with pytest.raises(Exception) as caught:
        (
            frame.write.format("sqlsink").mode("append")
            .option("url", url).option("table", table).option("mode", "upsert")
            .option("deleteColumn", "deleted").option("lockTimeout", "1")
            .save()
        )  # fmt: skip
    text = str(caught.value)
    assert "Lock wait timeout exceeded" in text, text[-3000:]
    assert "repartition(n, key)" in text, text[-3000:]
    assert table_of(mariadb_server, table) == [(1, "old", 0)]
    assert sink_branches(mariadb_server) == []
