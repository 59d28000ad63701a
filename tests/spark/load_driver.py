"""Named batch loads in one driver process, as a user runs them one after the other.

    python -m tests.spark.load_driver URL TABLE SINK_ID START:STOP [START:STOP ...]

Each START:STOP is one ``df.write.format("sqlsink")`` of the ids START..STOP-1 under
SINK_ID. Stdout gets one line per load, "load START:STOP: ok" or "load START:STOP:
failed: <Spark's error>"; the commits' warnings go to the driver's stderr (Spark copies
its Python workers' stderr there), where a user sees them.
"""

from __future__ import annotations

import sys


def main() -> int:
    url, table, sink_id, *loads = sys.argv[1:]
    from tests.spark.streams import local_session

    spark = local_session("sqlsink-load-driver")
    for load in loads:
        start, stop = (int(n) for n in load.split(":"))
        df = spark.range(start, stop, 1, 4).selectExpr("id", "concat('row ', id) AS payload")
        writer = (
            df.write.format("sqlsink")
            .mode("append")
            .option("url", url)
            .option("table", table)
            .option("createTable", "true")
            .option("sinkId", sink_id)
        )
        try:
            writer.save()
        except Exception as exc:  # the test reads Spark's error text
            print(f"load {load}: failed: {exc}".replace("\n", " | "), flush=True)
        else:
            print(f"load {load}: ok", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
