"""Quickstart: stream JSON files into a PostgreSQL table, exactly once.

    python examples/quickstart.py [--url postgresql://user@host/db]

A directory of JSON files is read as a stream (``readStream``) and appended to a
table with the default ``semantic=exactly_once``: each micro-batch commits all its
partitions together, once. ``trigger(availableNow=True)`` processes what is there
and stops, which suits a scheduled job; more files arrive, and the next run goes on
from the checkpoint: nothing read twice, nothing skipped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg

from _harness import count_rows, example_main, prepared_left

TABLE = "quickstart_events"
SCHEMA = "id BIGINT, kind STRING, amount DOUBLE, ts TIMESTAMP"
PER_FILE = 50
FILE_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z, the first file's modification time


def run(spark: Any, url: str, workdir: Path) -> dict[str, Any]:
    import sqlsink

    sqlsink.register(spark)  # makes format("sqlsink") known to this session
    source, checkpoint = workdir / "events", workdir / "checkpoint"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")  # the example starts from scratch

    def run_once() -> int:
        """One scheduled run: everything available now, then stop."""
        events = (
            spark.readStream.schema(SCHEMA)  # a streaming file source needs its schema
            .option("maxFilesPerTrigger", 1)  # small batches, to see several of them
            .json(str(source))
        )
        query = (
            events.writeStream.format("sqlsink")
            .option("url", url)
            .option("table", TABLE)
            .option("createTable", "true")  # created from the DataFrame's schema if missing
            # where Spark records what it read and wrote: the same directory on every
            # run, never shared by two queries. Its query id is also the sink id.
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()  # raises if the query failed
        return len(query.recentProgress)

    write_files(source, range(0, 3))
    batches_1 = run_once()
    rows_1 = count_rows(url, TABLE)
    write_files(source, range(3, 5))  # new files since the last run
    batches_2 = run_once()

    expected = 5 * PER_FILE
    with psycopg.connect(url) as conn:
        total, distinct, low, high = conn.execute(
            f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {TABLE}"
        ).fetchone() or (0, 0, None, None)
    verdict = {
        "rows_after_run_1": rows_1,
        "batches_run_1": batches_1,
        "batches_run_2": batches_2,
        "rows_expected": expected,
        "rows_found": total,
        "duplicates": total - distinct,
        "missing": expected - distinct,
        "prepared_left": prepared_left(url),
    }
    verdict["ok"] = (
        rows_1 == 3 * PER_FILE
        and total == distinct == expected
        and (low, high) == (0, expected - 1)
        and verdict["prepared_left"] == 0
    )
    return verdict


def write_files(directory: Path, numbers: range) -> None:
    """One JSON-lines file of PER_FILE events per number."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in numbers:
        lines = [
            json.dumps(
                {
                    "id": i,
                    "kind": ("click", "view", "buy")[i % 3],
                    "amount": round(i * 0.25, 2),
                    "ts": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
                }
            )
            for i in range(n * PER_FILE, (n + 1) * PER_FILE)
        ]
        # write under a hidden name, then rename: the file source never sees half a file
        tmp = directory / f".events-{n:03d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        # the file source reads files in modification-time order; files written in one
        # millisecond would tie (then the order is arbitrary): one second apart, as if
        # they had arrived over time
        os.utime(tmp, (FILE_TIME + n, FILE_TIME + n))
        tmp.rename(directory / f"events-{n:03d}.json")


def main() -> int:
    return example_main(__doc__, "sqlsink-quickstart", run)


if __name__ == "__main__":
    sys.exit(main())
