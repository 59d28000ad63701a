"""A smoke stream on one PySpark line, run with that line's python (tests/spark_lines.py).

    python -m tests.lines.smoke_program URL FOREACH_TABLE SOURCE_DIR WORK_DIR [DATA_SOURCE_TABLE]

The foreachBatch writer drains SOURCE_DIR into FOREACH_TABLE; with DATA_SOURCE_TABLE,
format("sqlsink") drains it into that table too. Where this PySpark lacks the data
source API, ``sqlsink.register`` must refuse: its sentence is printed. The last line
of stdout is a JSON report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    url, foreach_table, source, work = sys.argv[1:5]
    data_source_table = sys.argv[5] if len(sys.argv) > 5 else None
    import sqlsink
    from sqlsink.errors import ConfigError
    from tests.spark.foreach_batch_driver import run
    from tests.spark.streams import local_session, run_query

    spark = local_session("sqlsink-line-smoke")
    report: dict[str, object] = {"pyspark": spark.version, "register_error": None}
    writer = sqlsink.ForeachBatchWriter(
        url=url, sink_id="line-" + foreach_table.replace("_", "-"), createTable="true"
    )
    query = run(spark, Path(source), Path(work) / "chk-foreach", writer.to(foreach_table))
    report["query_id"] = str(query.id)
    if data_source_table is not None:
        options = {"url": url, "table": data_source_table, "createTable": "true"}
        run_query(spark, Path(source), Path(work) / "chk-source", options)
    try:
        sqlsink.register(spark)
    except ConfigError as exc:
        report["register_error"] = str(exc)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
