"""The foreachBatch writer with ``dead_letter_table=`` on one PySpark line, run with that
line's python (tests/spark_lines.py); on the suite's own line:
tests/spark/test_dead_letters.py.

    python -m tests.lines.dl_program URL TABLE DEAD_TABLE

Writes good rows and bad ones (a NUL in text, a value longer than its column, one out
of an integer's range) as batch 0 of a named query; the last line of stdout is a JSON
report.
"""

from __future__ import annotations

import json
import sys

SCHEMA = "id BIGINT, payload STRING, qty BIGINT"
COLUMNS = "id bigint NOT NULL, payload varchar(20), qty integer"
RECORDS = [
    {"id": 0, "payload": "p0", "qty": 0},
    {"id": 100, "payload": "a\x00b", "qty": 1},
    {"id": 1, "payload": "p1", "qty": 1},
    {"id": 101, "payload": "x" * 25, "qty": 1},
    {"id": 102, "payload": "p", "qty": 2**40},
]


def main() -> int:
    url, table, dead_table = sys.argv[1:4]
    import sqlsink
    from tests.spark.streams import local_session

    spark = local_session("sqlsink-line-dead-letters")
    df = spark.createDataFrame(RECORDS, SCHEMA).coalesce(1)
    writer = sqlsink.ForeachBatchWriter(
        url=url,
        sink_id="dl-" + table.replace("_", "-"),
        query_id="dl-line-query",
        dead_letter_table=dead_table,
    )
    writer.to(table)(df, 0)
    print(json.dumps({"pyspark": spark.version}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
