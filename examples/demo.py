"""sqlsink demo: an exactly-once stream into PostgreSQL that survives a driver crash.

    make demo                      # embedded PostgreSQL, nothing to set up
    make demo ARGS="--url postgresql://user@host/db"   # a real server
    make demo ARGS="--backend mariadb"                 # a private MariaDB server, XA

1. starts an embedded PostgreSQL (max_prepared_transactions on) unless --url; with
   --backend mariadb a private mariadbd instead (Debian's binaries, its own data
   directory and a free port, the binary log on; never the machine's :3306);
2. writes a numbered event stream as JSON files (a replayable source);
3. runs a streaming query into table demo_events and SIGKILLs its driver (JVM,
   workers and all) in the middle of a batch, after the commit decision;
4. restarts the query from its checkpoint and lets it drain the source;
5. prints a verdict: records, rows, duplicates, missing, prepared transactions left
   (on MariaDB: the sink's branches in XA RECOVER).
The server the demo started is stopped at the end, on an error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORK = HERE.parent / "demo-work"
TABLE = "demo_events"
BATCHES, PER_BATCH, CRASH_BATCH = 6, 5_000, 3
DRIVER_TIMEOUT_S = 600.0  # one run of the driver; then it is killed and the demo fails
MARIADB_DATABASE = "sqlsink_demo"  # the table's database on the private MariaDB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        choices=("postgresql", "mariadb"),
        help="the database the demo starts (default: postgresql, or the --url's)",
    )
    parser.add_argument(
        "--url",
        help="a server to use instead of the one the demo starts "
        "(postgresql://… or, with --backend mariadb, mariadb://…)",
    )
    parser.add_argument(
        "--driver", nargs=3, metavar=("SOURCE", "CHECKPOINT", "URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.driver:
        return run_driver(*args.driver)
    given = (args.url or "").removeprefix("jdbc:").split(":", 1)[0]
    backend = args.backend or ("mariadb" if given in ("mariadb", "mysql") else "postgresql")
    if args.url and (backend == "mariadb") != (given in ("mariadb", "mysql")):
        parser.error(f"--url {given}://… is not a {backend} URL")
    try:
        if backend == "mariadb":
            return run_mariadb_demo(args.url)
        return run_demo(args.url)
    except KeyboardInterrupt:
        say("interrupted: the driver and the server the demo started are stopped")
        return 130


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
        return crash_story(url, "mid COMMIT PREPARED", report_state, verdict)
    finally:
        if server is not None:
            server.destroy()


def run_mariadb_demo(url: str | None) -> int:
    """The same story on MariaDB: its own mariadbd unless --url, XA instead of PREPARE."""
    from sqlsink.mariadb.connection import connect, execute

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    server = None
    try:
        if url is None:
            from sqlsink.mariadb.embedded import EmbeddedMariaDB, binaries_present

            if not binaries_present():  # what make setup does on a fresh machine
                say("installing MariaDB's server binaries (scripts/ensure-mariadb.sh)")
                script = HERE.parent / "scripts" / "ensure-mariadb.sh"
                subprocess.run(["bash", str(script)], check=False, timeout=900)
            server = EmbeddedMariaDB(WORK / "mariadb", databases=(MARIADB_DATABASE,))
            say(
                f"starting a private MariaDB server (mariadbd on 127.0.0.1:{server.port}, "
                "its own data directory, binary log on; not the machine's :3306)"
            )
            server.start()
            say(f"  mariadbd (pid {server.process.pid if server.process else '?'}) is up")
            url = server.url(MARIADB_DATABASE)
        conn = connect(url)
        try:
            execute(conn, f"DROP TABLE IF EXISTS `{TABLE}`")
        finally:
            conn.close()
        return crash_story(url, "between its two XA COMMITs", report_mariadb_state, mariadb_verdict)
    finally:
        if server is not None:
            say("stopping the MariaDB server the demo started")
            server.destroy()


def crash_story(
    url: str,
    where: str,
    report: Callable[[str, Path], None],
    judge: Callable[[str, Path], int],
) -> int:
    """Steps 2 to 5: the source, run 1 killed mid-commit, run 2, the verdict."""
    source, checkpoint = WORK / "source", WORK / "checkpoint"
    write_source(source)
    say(f"source: {BATCHES * PER_BATCH} numbered events in {BATCHES} files (one per batch)")

    say(
        f"run 1: streaming into {TABLE}; the driver will be killed during batch "
        f"{CRASH_BATCH}, after its commit decision, {where}"
    )
    faults = WORK / "faults.json"
    faults.write_text(json.dumps([{"point": "mid_commit", "batch": CRASH_BATCH, "action": "kill"}]))
    code = driver_process(source, checkpoint, url, faults)
    say(f"run 1: driver died with {describe(code)}")
    report(url, checkpoint)

    say("run 2: restarting the query from its checkpoint")
    faults.write_text("[]")
    code = driver_process(source, checkpoint, url, faults)
    if code != 0:
        say(f"run 2 failed: {describe(code)}")
        return 1
    return judge(url, checkpoint)


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
    """Run the driver to its end (at most DRIVER_TIMEOUT_S); whatever is left of its
    session (JVM, Python workers) is killed afterwards, also on Ctrl-C or an error."""
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYSPARK_PYTHON": sys.executable}
    process = subprocess.Popen(
        [sys.executable, __file__, "--driver", str(source), str(checkpoint), url],
        env=env,
        start_new_session=True,  # a crash kills this session, not the demo
    )
    try:
        return process.wait(DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"the Spark driver (pid {process.pid}) ran longer than {DRIVER_TIMEOUT_S:.0f} s: "
            "killed; see its output above"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


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


def report_state(url: str, checkpoint: Path) -> None:
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


def verdict(url: str, checkpoint: Path) -> int:
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


# -- MariaDB: the same questions, in XA's words -----------------------------------------


def sink_id_of(checkpoint: Path) -> str:
    """The sink's id: the query's id, in the checkpoint's metadata."""
    return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])


def mariadb_facts(url: str, checkpoint: Path) -> dict[str, Any]:
    """The table's counts, the sink's branches in XA RECOVER and its commit log."""
    from sqlsink.mariadb.connection import LOG_DATABASE, connect, rows
    from sqlsink.mariadb.xid import from_recover_row

    sink = sink_id_of(checkpoint)
    conn = connect(url)
    try:
        total, distinct, low, high = rows(
            conn, f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM `{TABLE}`"
        )[0]
        branches = [from_recover_row(r) for r in rows(conn, "XA RECOVER")]
        decisions = rows(
            conn,
            f"SELECT batch_id, completed_at IS NOT NULL FROM `{LOG_DATABASE}`.decisions "
            "WHERE sink_id = %s ORDER BY batch_id",
            (sink,),
        )
    finally:
        conn.close()
    return {
        "total": int(total),
        "distinct": int(distinct),
        "range": (low, high),
        "prepared": sorted(
            (g.batch_id, g.partition_id) for g in branches if g is not None and g.sink_id == sink
        ),
        "decided": {int(b): bool(done) for b, done in decisions},
    }


def report_mariadb_state(url: str, checkpoint: Path) -> None:
    facts = mariadb_facts(url, checkpoint)
    prepared = facts["prepared"]
    branches = ", ".join(f"batch {b} partition {p}" for b, p in prepared) or "none"
    say(
        f"  after the crash: {facts['total']} rows visible; XA RECOVER lists "
        f"{len(prepared)} prepared branch(es) of the sink ({branches})"
    )
    pending = [b for b, done in facts["decided"].items() if not done]
    say(
        "  commit log (sqlsink.decisions): batches "
        + ", ".join(f"{b} {'completed' if done else 'DECIDED, not completed'}"
                    for b, done in facts["decided"].items())
    )  # fmt: skip
    if prepared:
        say(
            f"  (batch {', '.join(map(str, pending)) or '?'} is decided: its row in the commit "
            "log says commit. One branch was XA COMMITted before the kill, the other is still "
            "XA PREPAREd, so a reader sees the batch part-committed until the restart (or "
            "sqlsink recover) runs XA COMMIT on what XA RECOVER lists: its outcome is "
            "decided, its visibility is not yet whole)"
        )


def mariadb_verdict(url: str, checkpoint: Path) -> int:
    facts = mariadb_facts(url, checkpoint)
    total, distinct = facts["total"], facts["distinct"]
    expected = BATCHES * PER_BATCH
    missing, duplicates, left = expected - distinct, total - distinct, len(facts["prepared"])
    completed = sum(facts["decided"].values())
    ok = missing == duplicates == left == 0 and facts["range"] == (0, expected - 1)
    print()
    print("verdict")
    print(f"  records in the source       {expected}")
    print(f"  rows in {TABLE:<18} {total}")
    print(f"  duplicates                  {duplicates}")
    print(f"  missing                     {missing}")
    print(f"  XA branches left prepared   {left}   (XA RECOVER, the sink's)")
    print(f"  batches committed           {completed}   (sqlsink.decisions, completed)")
    print(f"  {'EXACTLY ONCE' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
