"""A Spark Connect client (a process of its own: a remote session changes PySpark's mode
for the whole process), against the Connect server of tests/connect/conftest.py.

    python -m tests.connect.client_program CONNECT_URL MODE PG_URL TABLE SOURCE CHECKPOINT

MODE ``foreach``: the foreachBatch writer with the query's checkpoint;
``foreach-bare``: with only url and sink_id (refused: Connect hides the query id);
``two-writers``: two writer objects of one sink, each writing the batch into TABLE (the
second one's rows offset by 1000: a second hand-over of the batch in one run);
``swallow``: ``writer.wrap(f)`` where ``f`` catches the writer's error of batch 1 (raised
inside its block, once: while the file ``SOURCE/../flag`` exists) and returns;
``swallow-bare``: the same function, not wrapped, catching only RuntimeError (the
writer's data-loss error of the next batch stops the query);
``skip-outside``: a function that skips batch 1 inside the stream (``writer.skip``), then,
the query stopped, an operator's ``writer.skip(2)`` from this Connect session of a batch
Spark never ran (the report's ``skip``: its error, or "accepted");
``source``: format("sqlsink"). The last line of stdout is a JSON report.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


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
    elif mode == "two-writers":
        one, two = (
            sqlsink.ForeachBatchWriter(
                url=pg_url, sink_id=sink_id, createTable="true", checkpoint_location=checkpoint
            )
            for _ in range(2)
        )

        def both(df: Any, batch_id: int) -> None:
            one.to(table)(df, batch_id)
            two.to(table)(df.selectExpr("id + 1000 AS id", "payload", "ts", "amount"), batch_id)

        writer = events.repartition(2).writeStream.foreachBatch(both)
    elif mode in ("swallow", "swallow-bare", "skip-outside"):
        fb = sqlsink.ForeachBatchWriter(
            url=pg_url, sink_id=sink_id, createTable="true", checkpoint_location=checkpoint
        )
        flag = os.path.join(os.path.dirname(source), "flag")
        caught: type[Exception] = Exception if mode == "swallow" else RuntimeError

        def swallowing(df: Any, batch_id: int) -> None:
            try:
                with fb.batch(batch_id) as b:
                    b.append(df, table)
                    if batch_id == 1 and os.path.exists(flag):
                        os.remove(flag)
                        raise RuntimeError("a transient failure inside batch 1")
            except caught as exc:  # "keep the stream alive"
                print(f"swallowed: {exc}", flush=True)

        def skipping(df: Any, batch_id: int) -> None:
            if batch_id == 1:
                fb.skip(batch_id)
            else:
                fb.to(table)(df, batch_id)

        function = {"swallow": fb.wrap(swallowing), "swallow-bare": swallowing}.get(mode, skipping)
        writer = events.repartition(2).writeStream.foreachBatch(function)
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
    if mode == "skip-outside":  # an operator's skip, outside the stream, on Connect
        operator = sqlsink.ForeachBatchWriter(
            url=pg_url, sink_id=sink_id, checkpoint_location=checkpoint
        )
        try:
            operator.skip(2)
            report["skip"] = "accepted"
        except Exception as exc:
            report["skip"] = str(exc)
    print(json.dumps(report), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
