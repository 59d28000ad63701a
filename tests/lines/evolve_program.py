"""The foreachBatch writer with ``schema_evolution="addColumns"`` on one PySpark line, run
with that line's python (tests/spark_lines.py).

    python -m tests.lines.evolve_program URL TABLE SOURCE_DIR WORK_DIR

Run 1 writes the source's files as (id, payload); a third file is added and run 2, from
the same checkpoint, writes every column (id, payload, ts, amount): the sink adds ts and
amount. The last line of stdout is a JSON report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main() -> int:
    url, table, source, work = sys.argv[1:5]
    import sqlsink
    from tests.spark.foreach_batch_driver import run
    from tests.spark.streams import add_source_file, local_session

    spark = local_session("sqlsink-line-evolve")
    writer = sqlsink.ForeachBatchWriter(
        url=url,
        sink_id="evolve-" + table.replace("_", "-"),
        schema_evolution="addColumns",
        createTable="true",
    )
    to_table = writer.to(table)

    def narrow(batch_df: Any, batch_id: int) -> None:
        to_table(batch_df.select("id", "payload"), batch_id)

    checkpoint = Path(work) / "chk"
    run(spark, Path(source), checkpoint, narrow)
    add_source_file(Path(source), 2, range(50, 80))
    query = run(spark, Path(source), checkpoint, to_table)
    print(json.dumps({"pyspark": spark.version, "query_id": str(query.id)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
