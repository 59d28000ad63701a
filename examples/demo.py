"""sqlsink demo: an exactly-once stream into PostgreSQL that survives a driver crash.

    make demo                      # embedded PostgreSQL, nothing to set up
    make demo ARGS="--url postgresql://user@host/db"   # a real server

1. starts an embedded PostgreSQL (max_prepared_transactions on) unless --url;
2. writes a numbered event stream as JSON files (a replayable source);
3. runs a streaming query into table demo_events and SIGKILLs its driver (JVM,
   workers and all) in the middle of a batch, after the commit decision;
4. restarts the query from its checkpoint and lets it drain the source;
5. prints a verdict: records, rows, duplicates, missing, prepared transactions left.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE.parent / "demo-work"
TABLE = "demo_events"
BATCHES, PER_BATCH, CRASH_BATCH = 6, 5_000, 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a PostgreSQL server to use instead of the embedded one")
    parser.add_argument(
        "--driver", nargs=3, metavar=("SOURCE", "CHECKPOINT", "URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.driver:
        return run_driver(*args.driver)
    return run_demo(args.url)


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_demo(url: str | None) -> int:
    import psycopg

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    server = None
    if url is None:
        from sqlsink.embedded import EmbeddedPostgres

        say("starting an embedded PostgreSQL (max_prepared_transactions = 64)")
        server = EmbeddedPostgres(WORK / "pg").start()
        url = server.url()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        source, checkpoint = WORK / "source", WORK / "checkpoint"
        write_source(source)
        say(f"source: {BATCHES * PER_BATCH} numbered events in {BATCHES} files (one per batch)")

        say(
            f"run 1: streaming into {TABLE}; the driver will be killed during batch "
            f"{CRASH_BATCH}, after its commit decision, mid COMMIT PREPARED"
        )
        faults = WORK / "faults.json"
        faults.write_text(
            json.dumps([{"point": "mid_commit", "batch": CRASH_BATCH, "action": "kill"}])
        )
        code = driver_process(source, checkpoint, url, faults)
        say(f"run 1: driver died with {describe(code)}")
        report_state(url)

        say("run 2: restarting the query from its checkpoint")
        faults.write_text("[]")
        code = driver_process(source, checkpoint, url, faults)
        if code != 0:
            say(f"run 2 failed: {describe(code)}")
            return 1
        return verdict(url)
    finally:
        if server is not None:
            server.destroy()


def write_source(source: Path) -> None:
    source.mkdir(parents=True)
    for batch in range(BATCHES):
        ids = range(batch * PER_BATCH, (batch + 1) * PER_BATCH)
        lines = (
            json.dumps({"id": i, "kind": ("click", "view", "buy")[i % 3], "amount": i % 97})
            for i in ids
        )
        (source / f"events-{batch:03d}.json").write_text("\n".join(lines) + "\n")


def driver_process(source: Path, checkpoint: Path, url: str, faults: Path) -> int:
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYSPARK_PYTHON": sys.executable}
    process = subprocess.Popen(
        [sys.executable, __file__, "--driver", str(source), str(checkpoint), url],
        env=env,
        start_new_session=True,  # a crash kills this session, not the demo
    )
    return process.wait()


def describe(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def run_driver(source: str, checkpoint: str, url: str) -> int:
    """The streaming job itself, as a user writes it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import sqlsink

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlsink-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sqlsink.register(spark)
    events = (
        spark.readStream.schema("id BIGINT, kind STRING, amount INT")
        .option("maxFilesPerTrigger", 1)
        .json(source)
        .repartition(2)  # two partitions, two prepared transactions per batch
    )
    query = (
        events.writeStream.format("sqlsink")
        .option("url", url)
        .option("table", TABLE)
        .option("createTable", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    while query.isActive:
        progress = query.lastProgress
        if progress:
            say(f"  batch {progress['batchId']}: {progress['numInputRows']} rows")
        time.sleep(2)
    query.awaitTermination()
    return 0


def report_state(url: str) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
    say(
        f"  after the crash: {rows[0] if rows else 0} rows visible, "
        f"{prepared[0] if prepared else 0} prepared transaction(s) left for recovery"
    )
    if prepared and prepared[0]:
        say(
            "  (a reader of the table sees the crashed batch part-committed until the "
            "restart or sqlsink recover finishes it: its outcome is decided, its visibility "
            "is not yet whole)"
        )


def verdict(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        total, distinct, low, high = conn.execute(
            f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {TABLE}"
        ).fetchone() or (0, 0, None, None)
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
        batches = conn.execute(
            "SELECT count(*) FROM sqlsink.decisions WHERE completed_at IS NOT NULL"
        ).fetchone()
    expected = BATCHES * PER_BATCH
    missing = expected - distinct
    duplicates = total - distinct
    left = prepared[0] if prepared else 0
    ok = missing == 0 and duplicates == 0 and left == 0 and (low, high) == (0, expected - 1)
    print()
    print("verdict")
    print(f"  records in the source       {expected}")
    print(f"  rows in {TABLE:<18} {total}")
    print(f"  duplicates                  {duplicates}")
    print(f"  missing                     {missing}")
    print(f"  prepared transactions left  {left}")
    print(f"  batches committed           {batches[0] if batches else 0}")
    print(f"  {'EXACTLY ONCE' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
