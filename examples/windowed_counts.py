"""Windowed counts per page with a watermark, upserted by (window_start, page).

    python examples/windowed_counts.py [--url postgresql://user@host/db]

Output mode: ``append``, not ``update``. Spark 4.3 refuses ``outputMode("update")`` for
a Python data source sink ("sqlsink does not support Update mode"): its write builder
(``PythonWriteBuilder``) does not implement ``SupportsStreamingUpdateAsAppend``, which
Spark requires of a DataSource V2 sink in update mode, and a Python data source cannot
add it. So a stateful aggregation reaches sqlsink in append mode, which needs a
watermark: a window is written once, when it is final, i.e. when a batch runs with a
watermark (the latest event time seen minus the allowed lateness) past the window's
end. The newest windows stay in Spark's state until later events move the watermark;
events that arrive after their window was closed are dropped by Spark. (Do not use
``outputMode("complete")`` either: see examples/README.md.)

Why upsert by (window_start, page) when each window is emitted once: the table stays
right if the aggregation is ever re-run from a fresh checkpoint over the same source
(a backfill, a changed query). That is a new query with a new sink id, so the commit
log cannot deduplicate it; the key does.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg

from _harness import example_main, prepared_left

TABLE = "windowed_page_views"
PAGES = ("home", "cart", "checkout")
WINDOW_S, LATENESS_S = 60, 30
START = datetime(2026, 1, 1, tzinfo=timezone.utc)

Event = tuple[int, str]  # (seconds after START, page)


def event_file(first: int, count: int) -> list[Event]:
    """``count`` events 5 s apart from event number ``first``: 90 s of traffic per 18."""
    # the +2 s keeps every watermark off a window boundary, so no tie needs explaining
    return [(2 + 5 * i, PAGES[(i * i + i // 7) % 3]) for i in range(first, first + count)]


# Run 1 reads three files; then two more arrive, the first one with three late events
# from the first minute (its window is long closed: Spark drops them).
LATE: list[Event] = [(10, "home"), (20, "cart"), (30, "home")]
RUN_1 = [event_file(0, 18), event_file(18, 18), event_file(36, 18)]
RUN_2 = [[*event_file(54, 18), *LATE], event_file(72, 18)]


def run(spark: Any, url: str, workdir: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import sqlsink

    sqlsink.register(spark)
    source, checkpoint = workdir / "page_views", workdir / "checkpoint"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        # the upsert key must be backed by a unique index: here the primary key
        conn.execute(
            f"CREATE TABLE {TABLE} (window_start timestamptz, window_end timestamptz, "
            "page text, views bigint NOT NULL, PRIMARY KEY (window_start, page))"
        )

    def run_once() -> None:
        views = (
            spark.readStream.schema("ts TIMESTAMP, page STRING")
            .option("maxFilesPerTrigger", 1)  # one file per micro-batch: the watermark crawls
            .json(str(source))
        )
        counts = (
            views.withWatermark("ts", f"{LATENESS_S} seconds")
            .groupBy(F.window("ts", f"{WINDOW_S} seconds"), "page")
            .count()
            # flatten the window struct into the table's key; the aggregation's shuffle
            # already puts each (window, page) in one partition, as upsert wants
            .select(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "page",
                F.col("count").alias("views"),
            )
        )
        query = (
            counts.writeStream.format("sqlsink")
            .outputMode("append")  # "update" is refused by Spark for Python sinks
            .option("url", url)
            .option("table", TABLE)
            .option("mode", "upsert")  # keyColumns default to the primary key
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    # Spark runs one more batch, without data, after the last file when
    # noDataMicroBatches is enabled (the default): it closes the windows the last
    # file's watermark passed. Without it they wait for the next file.
    no_data_batches = (
        str(spark.conf.get("spark.sql.streaming.noDataMicroBatches.enabled", "true")).lower()
        == "true"
    )
    write_files(source, RUN_1, first=0)
    run_once()
    after_run_1 = table_counts(url)
    write_files(source, RUN_2, first=len(RUN_1))
    run_once()
    found = table_counts(url)

    expected_1, _ = final_windows([RUN_1], no_data_batches)
    expected, dropped = final_windows([RUN_1, RUN_2], no_data_batches)
    all_windows = Counter((window_of(t), p) for f in RUN_1 + RUN_2 for t, p in f)
    return {
        "windows_final_after_run_1": len(expected_1),
        "windows_final": len(expected),
        "windows_found": len(found),
        "windows_still_open": len(all_windows) - len(expected),
        "late_events_dropped": dropped,
        "wrong_counts": sorted(
            f"{k[0]:%H:%M} {k[1]}: {found.get(k)} != {v}"
            for k, v in expected.items()
            if found.get(k) != v
        ),
        "unexpected": sorted(f"{k[0]:%H:%M} {k[1]}" for k in found if k not in expected),
        "prepared_left": prepared_left(url),
        "ok": after_run_1 == expected_1 and found == expected and prepared_left(url) == 0,
    }


def window_of(second: int) -> datetime:
    return START + timedelta(seconds=second - second % WINDOW_S)


def final_windows(
    runs: list[list[list[Event]]], no_data_batches: bool
) -> tuple[dict[tuple[datetime, str], int], int]:
    """What append mode has written after these runs, and how many events were dropped
    as late: Spark's rule, by hand.

    A batch first drops events whose window ended at or before its watermark, counts
    the rest, then emits the windows that end at or before its watermark. The
    watermark a batch runs with is the max event time of earlier batches minus the
    lateness.
    """
    state: Counter[tuple[datetime, str]] = Counter()
    emitted: dict[tuple[datetime, str], int] = {}
    watermark, max_seen = float("-inf"), float("-inf")
    dropped = 0

    def emit() -> None:
        for key in [k for k in state if (k[0] - START).total_seconds() + WINDOW_S <= watermark]:
            emitted[key] = state.pop(key)

    for files in runs:
        for events in files:
            for second, page in events:
                if second - second % WINDOW_S + WINDOW_S > watermark:
                    state[(window_of(second), page)] += 1
                else:
                    dropped += 1
            emit()
            max_seen = max(max_seen, *(s for s, _ in events))
            watermark = max_seen - LATENESS_S
        if no_data_batches:
            emit()
    return emitted, dropped


def write_files(directory: Path, files: list[list[Event]], first: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for number, events in enumerate(files, start=first):
        lines = [
            json.dumps({"ts": (START + timedelta(seconds=s)).isoformat(), "page": p})
            for s, p in events
        ]
        tmp = directory / f".views-{number:03d}.tmp"  # hidden: the file source skips it
        tmp.write_text("\n".join(lines) + "\n")
        # the file source reads files in modification-time order, and event order drives
        # the watermark: files written in one millisecond would tie (arbitrary order), so
        # stamp each as if it had arrived when its last event happened
        stamp = (START + timedelta(seconds=max(s for s, _ in events))).timestamp()
        os.utime(tmp, (stamp, stamp))
        tmp.rename(directory / f"views-{number:03d}.json")  # appear whole, never half


def table_counts(url: str) -> dict[tuple[datetime, str], int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT window_start, page, views FROM {TABLE}").fetchall()
    return {(start, page): views for start, page, views in rows}


def main() -> int:
    return example_main(__doc__, "sqlsink-windowed-counts", run)


if __name__ == "__main__":
    sys.exit(main())
