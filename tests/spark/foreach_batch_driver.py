"""A foreachBatch query writing two tables per batch, in its own process, to be killed
for real by an armed fault (see tests/spark/crash_driver.py for the data source's).

    python -m tests.spark.foreach_batch_driver SOURCE CHECKPOINT URL SINK_ID ORDERS LINES [views]

With ``views``, both tables are appended, each with its consistent view (``v_`` and the
table's name).

Run it with SQLSINK_FAULTS_FILE set and in a new session (process group).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def two_tables(
    url: str, sink_id: str, orders: str, lines: str, *, views: bool = False
) -> Callable[[Any, int], None]:
    """Each batch into two tables, one decision: ``orders`` appended, ``lines`` upserted
    (``views``: appended too, each table with its consistent view ``v_<table>``).

    One partition per table, so a batch has exactly two transactions (part 0, part 1)."""
    import sqlsink

    writer = sqlsink.ForeachBatchWriter(url=url, sink_id=sink_id)

    def write(batch_df: Any, batch_id: int) -> None:
        with writer.batch(batch_id) as b:
            if views:
                b.append(batch_df.select("id", "payload").coalesce(1), orders, view="v_" + orders)
                b.append(batch_df.select("id", "amount").coalesce(1), lines, view="v_" + lines)
                return
            b.append(batch_df.select("id", "payload").coalesce(1), orders)
            b.upsert(batch_df.select("id", "amount").coalesce(1), lines, key=["id"])

    return write


def run(spark: Any, source: Path, checkpoint: Path, function: Callable[[Any, int], None]) -> Any:
    """The source's files, one a batch, through ``function`` (tests/spark/streams.py)."""
    from tests.spark.streams import run_foreach_batch

    return run_foreach_batch(spark, source, checkpoint, function)


def main() -> int:
    source, checkpoint, url, sink_id, orders, lines = sys.argv[1:7]
    views = sys.argv[7:8] == ["views"]
    from tests.spark.streams import local_session

    spark = local_session("sqlsink-foreach-batch-crash-driver")
    function = two_tables(url, sink_id, orders, lines, views=views)
    run(spark, Path(source), Path(checkpoint), function)
    print("drained without being killed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
