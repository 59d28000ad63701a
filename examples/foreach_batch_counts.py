"""Running counts per page in update output mode, upserted exactly once through foreachBatch.

    python examples/foreach_batch_counts.py [--url postgresql://user@host/db]

``format("sqlsink")`` cannot take ``outputMode("update")`` (Spark refuses update mode
for Python data source sinks; see windowed_counts.py). ``foreachBatch`` can: each
micro-batch holds the keys whose count changed, with their new totals, and
``ForeachBatchWriter.to(table, mode="upsert", key=[...])`` replaces those rows, the
whole batch in one decision. No watermark is needed (Spark keeps every page's count in
its state).

Then the last batch is replayed, the way Spark replays after a crash between the
sink's commit and its own ``commits/N``: Spark calls the function again with the same
batch id, the writer finds that batch decided in its commit log, and no row is even
rewritten (their ``xmin`` is unchanged). Two more files follow, and the totals are
right to the row.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from _harness import example_main, prepared_left

TABLE = "page_view_totals"
PAGES = ("home", "cart", "checkout", "search")


def views_file(number: int) -> list[str]:
    """File ``number``: 20 views, pages in a pattern that changes from file to file."""
    return [PAGES[(i * (number + 1) + number) % len(PAGES)] for i in range(20)]


RUN_1 = [views_file(n) for n in range(3)]
RUN_2 = [views_file(n) for n in range(3, 5)]


def run(spark: Any, url: str, workdir: Path) -> dict[str, Any]:
    import sqlsink

    source, checkpoint = workdir / "views", workdir / "checkpoint"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        # the upsert key must be backed by a unique index: here the primary key
        conn.execute(f"CREATE TABLE {TABLE} (page text PRIMARY KEY, views bigint NOT NULL)")

    # the two entry points: a writer per sink, a function per table. The sink id belongs
    # to one query (one checkpoint): this example starts a new checkpoint each time it
    # runs, so it takes a new sink id each time too (a second query on a sink is refused)
    writer = sqlsink.ForeachBatchWriter(url=url, sink_id=f"page-totals-{uuid.uuid4().hex[:8]}")
    upsert_totals = writer.to(TABLE, mode="upsert", key=["page"])

    def run_once() -> Any:
        views = spark.readStream.schema("page STRING").option("maxFilesPerTrigger", 1)
        counts = views.json(str(source)).groupBy("page").count()
        query = (
            counts.withColumnRenamed("count", "views")
            .writeStream.foreachBatch(upsert_totals)
            .outputMode("update")  # each batch: the pages whose count changed
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise query.exception()
        return query

    write_files(source, RUN_1, first=0)
    first = run_once()
    batches_run_1 = len(first.recentProgress)
    after_run_1 = totals(url)

    # a crash after the sink's commit, before Spark's commits/N: Spark runs N again
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    before_replay = row_versions(url)
    replay = run_once()
    replayed = [p["numInputRows"] for p in replay.recentProgress if p["batchId"] == last]
    rewritten = sorted(k for k, v in row_versions(url).items() if before_replay.get(k) != v)

    write_files(source, RUN_2, first=len(RUN_1))
    run_once()
    found = totals(url)
    expected = dict(Counter(p for f in RUN_1 + RUN_2 for p in f))
    expected_1 = dict(Counter(p for f in RUN_1 for p in f))
    return {
        "batches_run_1": batches_run_1,
        "totals_right_after_run_1": after_run_1 == expected_1,
        "replayed_batch": last,
        "replayed_input_rows": sum(replayed),
        "rows_rewritten_by_replay": rewritten,
        "pages_expected": len(expected),
        "pages_found": len(found),
        "wrong_totals": sorted(
            f"{k}: {found.get(k)} != {v}" for k, v in expected.items() if found.get(k) != v
        ),
        "prepared_left": prepared_left(url),
        "ok": after_run_1 == expected_1
        and bool(replayed)
        and not rewritten
        and found == expected
        and prepared_left(url) == 0,
    }


def write_files(directory: Path, files: list[list[str]], first: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for number, pages in enumerate(files, start=first):
        tmp = directory / f".views-{number:03d}.tmp"  # hidden: the file source skips it
        tmp.write_text("".join(json.dumps({"page": p}) + "\n" for p in pages))
        # the file source reads files in modification-time order: one file per batch,
        # in order, even when they are written within one millisecond
        stamp = time.time() + number
        os.utime(tmp, (stamp, stamp))
        tmp.rename(directory / f"views-{number:03d}.json")


def totals(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute(f"SELECT page, views FROM {TABLE}").fetchall())


def row_versions(url: str) -> dict[str, str]:
    """xmin: the transaction that wrote the row's current version."""
    with psycopg.connect(url) as conn:
        return {p: str(x) for p, x in conn.execute(f"SELECT page, xmin FROM {TABLE}")}


def main() -> int:
    return example_main(__doc__, "sqlsink-foreach-batch-counts", run)


if __name__ == "__main__":
    sys.exit(main())
