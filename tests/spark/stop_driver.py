"""A streaming driver in its own process that stops its query with ``query.stop()`` while
a batch's tasks are writing, then ends; its stderr is what the user's console shows.

    python -m tests.spark.stop_driver ENTRY SOURCE CHECKPOINT URL TABLE SINK_ID

ENTRY is ``data_source`` or ``foreach_batch``. Run it with SQLSINK_FAULTS_FILE arming a
``sleep`` in batch 1 (e.g. at ``mid_copy``: its tasks inside COPY; at ``before_decision``:
its commit on the driver): the driver waits for batch 0's decision, then for the fault
to fire, and stops the query in its sleep.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sqlsink.core.faults import ENV as FAULTS_ENV


def main() -> int:
    entry, source, checkpoint, url, table, sink_id = sys.argv[1:7]
    import sqlsink
    from tests.spark.streams import SCHEMA, local_session

    spark = local_session("sqlsink-stop-driver", master="local[2]")
    spark.sparkContext.setLogLevel("WARN")  # a user's default: WARN and ERROR are shown
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    events = events.repartition(2)
    if entry == "data_source":
        writer = (
            events.writeStream.format("sqlsink")
            .option("url", url)
            .option("table", table)
            .option("sinkId", sink_id)
            .option("createTable", "true")
        )
    else:
        to = sqlsink.ForeachBatchWriter(url=url, sink_id=sink_id, createTable="true").to(table)
        writer = events.writeStream.foreachBatch(to)
    query = writer.option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds")
    query = query.start()
    deadline = time.monotonic() + 120
    while not _decided(url, sink_id, 0):
        assert time.monotonic() < deadline, "batch 0 not decided"
        time.sleep(0.2)
    fired = Path(f"{os.environ[FAULTS_ENV]}.fired")
    while not fired.exists():  # the armed fault's sleep has begun: batch 1 is mid-way
        assert time.monotonic() < deadline, "the armed fault never fired"
        time.sleep(0.1)
    time.sleep(0.5)
    print("stopping", flush=True)
    query.stop()
    print("stopped", flush=True)
    time.sleep(2)  # what the stop leaves behind gets time to log
    spark.stop()
    return 0


def _decided(url: str, sink_id: str, batch: int) -> bool:
    import psycopg

    from tests.spark.streams import decided_batches

    try:
        return decided_batches(url, sink_id).get(batch) is True
    except psycopg.errors.UndefinedTable:  # no commit log yet
        return False


if __name__ == "__main__":
    sys.exit(main())
