"""A streaming driver for the standalone cluster, with speculative execution on.

    python -m tests.cluster.speculation_driver MASTER PLAN OUT

PLAN (JSON) holds the event log directory, optionally more Spark settings
(``conf``), and a list of scenarios, each a query of its own (source, checkpoint,
url, table, optionally more sink ``options``) with the faults to arm while it
runs. One application runs them one after the other: the JVMs, executors and
Python workers start once. (``conf`` is for experiments:
``{"spark.python.task.killTimeout": "60s"}`` lets a killed straggler's Python
worker live on, wake up and PREPARE after its batch was decided and committed: a
"zombie" attempt.)

The faults file is the one in ``SQLSINK_FAULTS_FILE``, handed on to the executors;
before each query it is rewritten with the scenario's faults, and after it the
``.fired`` log is moved to the scenario's ``fired`` path.
Between queries the driver waits until no task runs (a killed straggler has
ended), so that the event log holds every attempt's end. OUT receives the hosts
of the executors and the application id.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EXECUTORS = 2
DRIVER_HOST = "127.0.0.1"  # the workers are on 127.0.0.2 and 127.0.0.3
TIMEOUT_S = 120.0
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def executors(spark: Any) -> list[Any]:
    """SparkExecutorInfo of each registered executor (the driver, on 127.0.0.1, excluded)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return [i for i in infos if i.host() != DRIVER_HOST]


def wait_for(what: str, ready: Any) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def main() -> int:
    master, plan_path, out = sys.argv[1:4]
    plan = json.loads(Path(plan_path).read_text())
    faults = Path(os.environ["SQLSINK_FAULTS_FILE"])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import sqlsink
    from tests.spark.streams import run_query

    builder = (
        SparkSession.builder.master(master)
        .appName("sqlsink-speculation")
        .config("spark.driver.host", DRIVER_HOST)
        .config("spark.driver.bindAddress", DRIVER_HOST)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        # small JVMs on a 2-core machine: no C2 compiler to warm up, no GC threads
        .config("spark.driver.extraJavaOptions", QUICK_JVM)
        .config("spark.executor.extraJavaOptions", QUICK_JVM)
        .config("spark.cores.max", str(EXECUTORS))
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.SQLSINK_FAULTS_FILE", str(faults))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # the tasks prefer the executor holding the shuffle output: do not wait for it
        .config("spark.locality.wait", "0s")
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.quantile", "0.5")
        # Only the straggler (asleep for 30 s) may run this long. A task of a Python
        # worker started afresh (Spark destroys the worker of a killed attempt) takes
        # 2-6 s on a loaded 2-core machine: with 1 s it would be speculated too, and a
        # killed copy destroys another worker, and so on
        .config("spark.speculation.minTaskRuntime", "8s")
        # judge a task by its run time alone, not by its rows per second
        .config("spark.speculation.efficiency.enabled", "false")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", Path(plan["events"]).resolve().as_uri())
        .config("spark.eventLog.compress", "false")
        .config("spark.eventLog.rolling.enabled", "false")  # one file, not a directory
    )
    for key, value in plan.get("conf", {}).items():  # for experiments
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    wait_for("both executors", lambda: len(executors(spark)) == EXECUTORS)
    hosts = sorted(str(i.host()) for i in executors(spark))
    print(f"executors on {hosts}", flush=True)
    sqlsink.register(spark)

    def idle() -> bool:
        return all(i.numRunningTasks() == 0 for i in executors(spark))

    fired = Path(f"{faults}.fired")
    for scenario in plan["scenarios"]:
        wait_for("the executors to be idle", idle)
        fired.unlink(missing_ok=True)
        faults.write_text(json.dumps(scenario["faults"]))
        options = {"url": scenario["url"], "table": scenario["table"], "createTable": "true"}
        options.update(scenario.get("options", {}))  # e.g. mode=upsert, lockTimeout
        run_query(spark, Path(scenario["source"]), Path(scenario["checkpoint"]), options)
        wait_for("the executors to be idle", idle)  # the straggler ended (killed or not)
        faults.write_text("[]")
        if fired.exists():
            fired.rename(scenario["fired"])
        print(f"scenario {scenario['name']} drained", flush=True)

    app_id = spark.sparkContext.applicationId
    spark.stop()  # closes the event log
    Path(out).write_text(json.dumps({"hosts": hosts, "app_id": app_id}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
