"""A streaming application as a user would ``spark-submit`` it (tests/cluster/test_submit.py).

    spark-submit ... app.py SOURCE CHECKPOINT URL TABLE OUT

It imports nothing from this repository but ``sqlsink`` (from the shipped
environment) and runs on whatever Python spark-submit gives it. It drains a
directory of JSON files (``availableNow``, one file per micro-batch) into TABLE
with ``format("sqlsink")``, and writes to OUT where its Python ran: the driver's
interpreter, and that of a few tasks on each executor (``mapPartitions``), each
with the paths of the ``sqlsink`` and ``pyspark`` it imported.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import SparkSession

import sqlsink

SCHEMA = "id BIGINT, payload STRING, ts TIMESTAMP, amount DOUBLE"
EXECUTORS = 2
TIMEOUT_S = 120.0


def where_python_runs() -> dict[str, Any]:
    import pyspark

    import sqlsink

    return {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "cwd": os.getcwd(),
        "sqlsink": sqlsink.__file__,
        "pyspark": pyspark.__file__,
        "version": list(sys.version_info[:3]),
    }


def in_task(_: Iterable[int]) -> Iterator[dict[str, Any]]:
    time.sleep(0.5)  # spread the tasks over both executors
    yield where_python_runs()


def executors(spark: Any) -> int:
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    driver = spark.sparkContext.getConf().get("spark.driver.host")
    return sum(1 for i in infos if i.host() != driver)


def main() -> int:
    source, checkpoint, url, table, out = sys.argv[1:6]
    spark = SparkSession.builder.appName("sqlsink-submit").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    sqlsink.register(spark)

    deadline = time.monotonic() + TIMEOUT_S
    while executors(spark) < EXECUTORS:
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for the executors")
        time.sleep(0.2)
    tasks = spark.sparkContext.parallelize(range(8), 8).mapPartitions(in_task).collect()

    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(source)
        .writeStream.format("sqlsink")
        .option("url", url)
        .option("table", table)
        .option("createTable", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")

    with open(out, "w") as file:
        json.dump({"driver": where_python_runs(), "tasks": tasks}, file)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
