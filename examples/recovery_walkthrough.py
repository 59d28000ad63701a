"""Recovery walkthrough: a driver dies mid-commit; the on-call person looks and cleans up.

    python examples/recovery_walkthrough.py [--url postgresql://user@host/db]

1. A streaming driver (this file, run with a hidden ``--driver`` flag, in its own
   process group) is SIGKILLed, JVM and Python workers too, during batch 1: right
   after the sink wrote its commit decision, before any ``COMMIT PREPARED``. The crash
   is armed with the sink's fault hook (``SQLSINK_FAULTS_FILE``), as in the tests.
2. Batch 1's partitions are left prepared: invisible, holding their locks.
3. ``sqlsink status`` shows them; ``sqlsink recover --dry-run`` prints the plan
   (commit: batch 1 was decided) and how Spark's checkpoint relates to the commit
   log; ``sqlsink recover`` carries it out.
4. The query restarts from its checkpoint: Spark re-runs batch 1 (it never wrote
   ``commits/1``), the sink sees it is already committed and writes nothing, then
   batch 2 runs. Every record is in the table exactly once.

Without step 3 the restarted query would resolve the leftovers itself, first thing;
``sqlsink recover`` is for when the job will not be back soon.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from _harness import build_session, count_rows, example_main, prepared_left

TABLE = "recovery_events"
BATCHES = [range(0, 30), range(30, 70), range(70, 100)]  # one file per micro-batch
CRASH = {"point": "after_decision", "batch": 1, "action": "kill"}


def run_stream(spark: Any, source: Path, checkpoint: Path, url: str) -> None:
    """The streaming job itself: the crashed driver and the restart run this same code."""
    events = (
        spark.readStream.schema("id BIGINT, payload STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .repartition(2)  # two partitions: two prepared transactions per batch
    )
    query = (
        events.writeStream.format("sqlsink")
        .option("url", url)
        .option("table", TABLE)
        .option("createTable", "true")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def run(spark: Any, url: str, workdir: Path) -> dict[str, Any]:
    import sqlsink

    sqlsink.register(spark)
    source, checkpoint = workdir / "events", workdir / "checkpoint"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    write_files(source)
    verdict: dict[str, Any] = {}

    say(f"1. a driver streams into {TABLE}; armed to be killed at {CRASH}")
    verdict["driver"] = describe(run_driver(source, checkpoint, url, workdir / "faults.json"))
    say(f"   the driver ended with {verdict['driver']}")
    sink_id = query_id(checkpoint)  # the default sink id: the streaming query's id
    verdict["rows_after_crash"] = count_rows(url, TABLE)
    verdict["prepared_after_crash"] = prepared_left(url)
    say(
        f"2. left behind: {verdict['rows_after_crash']} rows visible, "
        f"{verdict['prepared_after_crash']} prepared transactions"
    )

    say("3. the on-call person:")
    verdict["status_exit"] = cli("status", "--url", url, "--sink-id", sink_id)
    # --checkpoint: the sink is the checkpoint's query; relate Spark's logs to the sink's
    recover = ("recover", "--url", url, "--checkpoint", str(checkpoint))
    verdict["dry_run_exit"] = cli(*recover, "--dry-run")
    verdict["recover_exit"] = cli(*recover)
    verdict["rows_after_recover"] = count_rows(url, TABLE)
    verdict["prepared_after_recover"] = prepared_left(url)

    say("4. the query restarts from its checkpoint (in this process's SparkSession)")
    run_stream(spark, source, checkpoint, url)
    expected = BATCHES[-1].stop
    with psycopg.connect(url) as conn:
        total, distinct, low, high = conn.execute(
            f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {TABLE}"
        ).fetchone() or (0, 0, None, None)
    verdict |= {
        "rows_expected": expected,
        "rows_found": total,
        "duplicates": total - distinct,
        "missing": expected - distinct,
        "prepared_left": prepared_left(url),
    }
    verdict["ok"] = (
        verdict["driver"] == "signal SIGKILL"
        and verdict["prepared_after_crash"] == 2
        and verdict["recover_exit"] == 0
        and verdict["prepared_after_recover"] == 0
        and verdict["rows_after_recover"] == BATCHES[1].stop  # batch 1 rolled forward
        and total == distinct == expected
        and (low, high) == (0, expected - 1)
        and verdict["prepared_left"] == 0
    )
    return verdict


def run_driver(source: Path, checkpoint: Path, url: str, faults: Path) -> int:
    """Start the streaming driver as its own program, like a spark-submit that dies."""
    faults.write_text(json.dumps([CRASH]))
    # the workers Spark starts inherit the environment: set it before the driver starts
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYSPARK_PYTHON": sys.executable}
    driver = subprocess.run(
        [sys.executable, __file__, "--driver", str(source), str(checkpoint), url],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # the crash kills this process group, not us
    )
    for line in driver.stdout.splitlines()[-5:]:
        say(f"   driver: {line}")
    if driver.returncode != -signal.SIGKILL:
        say(f"   driver stderr (tail):\n{driver.stderr[-3000:]}")
    return driver.returncode


def driver_main(source: str, checkpoint: str, url: str) -> int:
    """``--driver``: a job of its own, with its own SparkSession."""
    spark = build_session("sqlsink-recovery-driver")
    import sqlsink

    sqlsink.register(spark)
    print("driver: streaming", flush=True)
    run_stream(spark, Path(source), Path(checkpoint), url)
    print("driver: drained without being killed", flush=True)
    return 0


def cli(*args: str) -> int:
    """The on-call tool, as a shell would run it (``sqlsink ...``)."""
    say(f"   $ sqlsink {' '.join(args)}")
    done = subprocess.run(
        [sys.executable, "-m", "sqlsink", *args], capture_output=True, text=True, timeout=120
    )
    for line in (done.stdout + done.stderr).rstrip().splitlines():
        print(f"     {line}", flush=True)
    say(f"   exit code {done.returncode}")
    return done.returncode


def write_files(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for number, ids in enumerate(BATCHES):
        tmp = directory / f".events-{number:03d}.tmp"
        tmp.write_text("".join(json.dumps({"id": i, "payload": f"event {i}"}) + "\n" for i in ids))
        # the file source reads files in modification-time order: one second apart
        os.utime(tmp, (1_767_225_600 + number, 1_767_225_600 + number))
        tmp.rename(directory / f"events-{number:03d}.json")


def query_id(checkpoint: Path) -> str:
    """The query id Spark keeps in the checkpoint's ``metadata`` file."""
    return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])


def describe(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def say(message: str) -> None:
    print(message, flush=True)


def main() -> int:
    if sys.argv[1:2] == ["--driver"]:  # the streaming job of step 1, started by run_driver
        return driver_main(*sys.argv[2:5])
    return example_main(__doc__, "sqlsink-recovery-walkthrough", run)


if __name__ == "__main__":
    sys.exit(main())
