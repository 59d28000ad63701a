"""A Spark Connect client (a process of its own: a remote session changes PySpark's mode
for the whole process), against the Connect server of tests/connect/conftest.py.

    python -m tests.connect.client_program CONNECT_URL MODE PG_URL TABLE SOURCE CHECKPOINT

MODE ``foreach``: the foreachBatch writer with the query's checkpoint;
``foreach-bare``: with only url and sink_id (refused: Connect hides the query id);
``source``: format("sqlsink"). The last line of stdout is a JSON report.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    connect_url, mode, pg_url, table, source, checkpoint = sys.argv[1:7]
    from pyspark.sql import SparkSession

    import sqlsink
    from tests.spark.streams import SCHEMA

    spark = SparkSession.builder.remote(connect_url).create()
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    sink_id = "cx-" + table.replace("_", "-")
    if mode == "source":
        sqlsink.register(spark)
        writer = (
            events.repartition(2)
            .writeStream.format("sqlsink")
            .option("url", pg_url)
            .option("table", table)
            .option("createTable", "true")
        )
    else:
        kwargs = {"checkpoint_location": checkpoint} if mode == "foreach" else {}
        fb = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id, createTable="true", **kwargs)
        writer = events.repartition(2).writeStream.foreachBatch(fb.to(table))
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    error = None
    try:
        query.awaitTermination()
    except Exception as exc:  # the query's failure, as Connect reports it
        error = str(exc)
    report = {"query_id": str(query.id), "run_id": str(query.runId), "error": error}
    print(json.dumps(report), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
