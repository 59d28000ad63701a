"""The foreachBatch writer on one PySpark line with the session in New York, run with that
line's python (tests/spark_lines.py): a TimestampType value goes into a ``timestamp``
(without time zone) column as the wall time the user wrote in Spark, and into a
``timestamptz`` column as the exact instant (on the suite's own line:
tests/spark/test_timezones.py).

    python -m tests.lines.tz_program URL TABLE WORK_DIR

The last line of stdout is a JSON report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ZONE = "America/New_York"
# wall times in the session's zone: midnight, both sides of the 2026 spring-forward, summer
WALL = [
    "2026-01-15T00:00:00",
    "2026-03-08T01:59:59.999999",
    "2026-03-08T03:00:00",
    "2026-07-01T00:00:00",
]


def main() -> int:
    url, table, work = sys.argv[1:4]
    import sqlsink
    from tests.spark.streams import local_session

    spark = local_session("sqlsink-line-tz")
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    source = Path(work) / "src"
    source.mkdir(parents=True, exist_ok=True)
    (source / "0.json").write_text(
        "".join(json.dumps({"id": i, "at": t}) + "\n" for i, t in enumerate(WALL))
    )
    writer = sqlsink.ForeachBatchWriter(url=url, sink_id="tz-" + table.replace("_", "-"))
    to_table = writer.to(table)

    def write(df: Any, batch_id: int) -> None:
        to_table(df.selectExpr("id", "at AS local_at", "at"), batch_id)

    events = spark.readStream.schema("id BIGINT, at TIMESTAMP").json(str(source))
    query = (
        events.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(Path(work) / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    error = query.exception()
    print(json.dumps({"pyspark": spark.version, "error": None if error is None else str(error)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
