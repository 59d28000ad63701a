"""``sqlsink status`` after a stop and a failure of the foreachBatch writer's query, on one
PySpark line, run with that line's python (tests/spark_lines.py).

    python -m tests.lines.status_program URL GOOD_TABLE BAD_TABLE GOOD_SOURCE BAD_SOURCE WORK

A query into GOOD_TABLE is stopped with ``query.stop()`` once its batch 0 is decided; a
query into BAD_TABLE fails on its data. After each, ``sqlsink status --json`` is read
until the sink's state is the expected one (at most 10 s). The last line of stdout is a
JSON report: each sink's state, how long after the query's end it was seen, its end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any


def state(url: str, sink_id: str, expected: str) -> tuple[dict[str, Any], float]:
    """The sink's status once its state is ``expected`` (or after 10 s), and the wait."""
    started = time.monotonic()
    while True:
        args = ["-m", "sqlsink", "status", "--url", url, "--sink-id", sink_id, "--json"]
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True)
        [sink] = json.loads(done.stdout)["sinks"]
        waited = time.monotonic() - started
        if sink["state"] == expected or waited > 10:
            return sink, waited
        time.sleep(0.2)


def main() -> int:
    url, good_table, bad_table, good_source, bad_source, work = sys.argv[1:7]
    import psycopg

    import sqlsink
    from tests.spark.streams import SCHEMA, local_session

    spark = local_session("sqlsink-line-status")
    report: dict[str, Any] = {"pyspark": spark.version}

    def start(source: str, table: str, sink_id: str) -> Any:
        writer = sqlsink.ForeachBatchWriter(url=url, sink_id=sink_id, createTable="true")
        events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
        return (
            events.writeStream.foreachBatch(writer.to(table))
            .option("checkpointLocation", f"{work}/chk-{sink_id}")
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    stop_sink, fail_sink = ("line-" + t.replace("_", "-") for t in (good_table, bad_table))
    query = start(good_source, good_table, stop_sink)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        with psycopg.connect(url) as conn:
            exists = conn.execute("SELECT to_regclass('sqlsink.decisions')").fetchone()
            row = (
                exists
                and exists[0]
                and conn.execute(
                    "SELECT 1 FROM sqlsink.decisions WHERE sink_id = %s AND batch_id = 0 "
                    "AND completed_at IS NOT NULL",
                    (stop_sink,),
                ).fetchone()
            )
        if row:
            break
        time.sleep(0.2)
    query.stop()
    report["stop_run_id"] = str(query.runId)
    report["stop"], report["stop_seen_after_s"] = state(url, stop_sink, "stopped")

    failing = start(bad_source, bad_table, fail_sink)
    try:
        failing.awaitTermination(180)
    except Exception as exc:  # the query's error, raised by Spark
        report["raised"] = type(exc).__name__
    report["fail"], report["fail_seen_after_s"] = state(url, fail_sink, "failed")
    print(json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
