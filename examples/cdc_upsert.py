"""Change data capture: apply a stream of inserts, updates and deletes to a table.

    python examples/cdc_upsert.py [--url postgresql://user@host/db]

The changes (id, name, qty, op) come as JSON files, op being 'c' (create), 'u'
(update) or 'd' (delete). With ``mode=upsert`` the sink applies each batch by the
table's primary key: the last change of a key in the batch wins, and a key whose
last change has ``deleteColumn`` true is deleted. The whole batch becomes visible
at once, exactly once: a batch that Spark runs again after a crash (shown here by
deleting its entry in the checkpoint's ``commits/``) writes nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg

from _harness import example_main, prepared_left

TABLE = "cdc_inventory"
FILE_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z, the first file's modification time

Change = tuple[int, str, int, str]  # id, name, qty, op

# One file per micro-batch. Several changes to one key inside one batch: the last wins.
BATCHES: list[list[Change]] = [
    [(1, "apple", 10, "c"), (2, "pear", 5, "c"), (1, "apple", 12, "u"), (3, "fig", 1, "c"),
     (1, "green apple", 11, "u")],
    [(2, "pear", 4, "u"), (3, "fig", 1, "d"), (4, "plum", 7, "c"), (4, "plum", 7, "d"),
     (5, "kiwi", 3, "c")],
    [(4, "plum", 2, "c"), (1, "green apple", 0, "u"), (6, "lime", 9, "c"), (5, "kiwi", 3, "d"),
     (2, "nashi", 4, "u")],
]  # fmt: skip


def run(spark: Any, url: str, workdir: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import sqlsink

    sqlsink.register(spark)
    source, checkpoint = workdir / "changes", workdir / "checkpoint"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        # upsert needs a unique index on the key: the primary key is the default key
        conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, name text, qty int)")
    write_files(source, BATCHES)

    def run_once() -> Any:
        changes = (
            spark.readStream.schema("id BIGINT, name STRING, qty INT, op STRING")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        # The sink keeps the last row of a key in its partition's order, and two
        # partitions must not touch one key (they would wait on each other's locks).
        # A small file is read as one partition, in order, so both hold here. With more
        # data, repartition by the key (df.repartition(n, "id")) and mind that Spark
        # only keeps the order of a key's rows that come from one input partition.
        rows = changes.withColumn("deleted", F.col("op") == "d").drop("op")
        query = (
            rows.writeStream.format("sqlsink")
            .option("url", url)
            .option("table", TABLE)
            .option("mode", "upsert")
            .option("deleteColumn", "deleted")  # true: delete the key; not a table column
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return query

    run_once()
    after_stream = table_rows(url)

    # Replay: forget that Spark committed the last batch, as if the driver had died
    # between the sink's commit and Spark's commits/N. Spark runs that batch again.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    before_replay = row_versions(url)
    replay = run_once()
    replayed = [p["numInputRows"] for p in replay.recentProgress if p["batchId"] == last]
    after_replay = table_rows(url)
    # Re-applying the last batch would give the same values (upserts are idempotent
    # on their own), so look deeper: no row was even rewritten by the replay.
    rewritten = sorted(k for k, v in row_versions(url).items() if before_replay.get(k) != v)

    expected = apply_changes(BATCHES)
    verdict = {
        "changes": sum(map(len, BATCHES)),
        "rows_expected": len(expected),
        "rows_found": len(after_stream),
        "missing": sorted(set(expected) - set(after_stream)),
        "unexpected": sorted(set(after_stream) - set(expected)),
        "wrong": sorted(k for k, v in after_stream.items() if k in expected and expected[k] != v),
        "replayed_batch": last,
        "replayed_input_rows": sum(replayed),
        "table_unchanged_by_replay": after_replay == after_stream,
        "rows_rewritten_by_replay": rewritten,
        "prepared_left": prepared_left(url),
    }
    verdict["ok"] = (
        after_stream == expected
        and bool(replayed)  # the batch did run again...
        and after_replay == after_stream  # ...and changed nothing
        and not rewritten  # ...not even by writing the same values again
        and verdict["prepared_left"] == 0
    )
    return verdict


def apply_changes(batches: list[list[Change]]) -> dict[int, tuple[str, int]]:
    """The table the changes describe, applied one by one in order."""
    table: dict[int, tuple[str, int]] = {}
    for batch in batches:
        for key, name, qty, op in batch:
            if op == "d":
                table.pop(key, None)
            else:
                table[key] = (name, qty)
    return table


def write_files(directory: Path, batches: list[list[Change]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for number, changes in enumerate(batches):
        lines = [
            json.dumps({"id": i, "name": name, "qty": qty, "op": op})
            for i, name, qty, op in changes
        ]
        tmp = directory / f".changes-{number:03d}.tmp"  # hidden until renamed
        tmp.write_text("\n".join(lines) + "\n")
        # The file source takes files in modification-time order, and files written in
        # the same millisecond tie (then the order is the directory's, arbitrary). Order
        # matters for changes: give each file its own time, as files arriving over time
        # have.
        os.utime(tmp, (FILE_TIME + number, FILE_TIME + number))
        tmp.rename(directory / f"changes-{number:03d}.json")


def table_rows(url: str) -> dict[int, tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return {i: (n, q) for i, n, q in conn.execute(f"SELECT id, name, qty FROM {TABLE}")}


def row_versions(url: str) -> dict[int, str]:
    """xmin: the transaction that wrote the row's current version."""
    with psycopg.connect(url) as conn:
        return {i: str(x) for i, x in conn.execute(f"SELECT id, xmin FROM {TABLE}")}


def main() -> int:
    return example_main(__doc__, "sqlsink-cdc-upsert", run)


if __name__ == "__main__":
    sys.exit(main())
