"""Batch loads: a DataFrame into PostgreSQL all or nothing, and a named load that runs once.

    python examples/batch_load.py [--url postgresql://user@host/db]

``df.write.format("sqlsink").mode("append")`` loads every partition of the DataFrame
in one prepared transaction each and commits them together: readers see all of the
load or none of it (Spark's JDBC writer commits each partition on its own, so a failed
load leaves part of it behind). Shown here with a load that fails in one partition:
the table stays empty. With a ``sinkId`` the load is idempotent: the commit log
remembers it, and running it again (a retried Airflow task, a re-run notebook) writes
nothing.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

from _harness import count_rows, example_main, prepared_left

TABLE = "batch_orders"
ROWS, PARTITIONS = 400, 4


def orders(spark: Any, first: int, count: int, bad_id: int | None = None) -> Any:
    """``count`` orders from id ``first`` in PARTITIONS partitions; ``bad_id`` lacks its
    customer (the table's NOT NULL refuses it)."""
    return spark.range(first, first + count, 1, PARTITIONS).selectExpr(
        "id",
        f"IF(id = {bad_id if bad_id is not None else -1}, NULL, concat('c-', id % 37)) AS customer",
        "CAST(id % 100 + 0.99 AS DECIMAL(10, 2)) AS total",
        "date_add(DATE'2026-01-01', CAST(id % 28 AS INT)) AS order_date",
    )


def save(df: Any, url: str, **options: str) -> None:
    writer = df.write.format("sqlsink").mode("append")  # "overwrite" is refused
    writer = writer.option("url", url).option("table", TABLE)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def run(spark: Any, url: str, workdir: Path) -> dict[str, Any]:
    import sqlsink

    sqlsink.register(spark)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, customer text NOT NULL, "
            "total numeric(10, 2), order_date date)"
        )

    # 1. A load with one bad row, in the last of four partitions. The other partitions
    # have prepared their rows by then; the failure rolls them all back.
    print("1. a load with one bad row: the task error Spark logs next is expected", flush=True)
    try:
        save(orders(spark, 0, ROWS, bad_id=ROWS - 23), url)
        failed_load_raised = False
    except Exception as exc:  # Spark wraps the sink's error: batch, partition, cause
        failed_load_raised = "customer" in str(exc)
    rows_after_failed_load = count_rows(url, TABLE)

    # 2. The data fixed, the same load again: every partition at once.
    print("2. the same load with the row fixed", flush=True)
    save(orders(spark, 0, ROWS, bad_id=ROWS - 23).fillna({"customer": "unknown"}), url)
    rows_after_load = count_rows(url, TABLE)

    # 3. A named load, run twice: the second run finds the name in the commit log and
    # writes nothing. In production the name identifies the input (a file, a date); the
    # random suffix only lets this example run again against the same database.
    load_id = f"orders-2026-01-02-{uuid.uuid4().hex[:8]}"
    print(f"3. a named load (sinkId={load_id}), twice", flush=True)
    save(orders(spark, ROWS, 100), url, sinkId=load_id)
    rows_after_named_load = count_rows(url, TABLE)
    # without the sinkId this would fail on the primary key (or, without one, duplicate)
    save(orders(spark, ROWS, 100), url, sinkId=load_id)
    rows_after_named_load_again = count_rows(url, TABLE)

    with psycopg.connect(url) as conn:
        total, distinct = conn.execute(
            f"SELECT count(*), count(DISTINCT id) FROM {TABLE}"
        ).fetchone() or (0, 0)
    expected = ROWS + 100
    verdict = {
        "failed_load_raised": failed_load_raised,
        "rows_after_failed_load": rows_after_failed_load,
        "rows_after_load": rows_after_load,
        "rows_after_named_load": rows_after_named_load,
        "rows_after_named_load_again": rows_after_named_load_again,
        "rows_expected": expected,
        "duplicates": total - distinct,
        "missing": expected - distinct,
        "prepared_left": prepared_left(url),
    }
    verdict["ok"] = (
        failed_load_raised
        and rows_after_failed_load == 0
        and rows_after_load == ROWS
        and rows_after_named_load == rows_after_named_load_again == expected
        and total == distinct == expected
        and verdict["prepared_left"] == 0
    )
    return verdict


def main() -> int:
    return example_main(__doc__, "sqlsink-batch-load", run)


if __name__ == "__main__":
    sys.exit(main())
