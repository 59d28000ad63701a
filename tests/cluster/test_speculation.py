"""Exactly once with Spark's speculative execution on, on a real standalone cluster.

Local mode never runs a speculative copy (one host), so this starts a Master and
two Workers on 127.0.0.2 and 127.0.0.3 (``fix_cluster``). In each scenario one
task of batch 1 is a straggler (a ``sleep`` fault on its first attempt, after
PREPARE or mid-COPY), so that Spark launches a speculative copy of it on the other
host. Two attempts of one partition then write the same rows; exactly one may
become visible. ``after_prepare``: both attempts prepare, and the straggler's
transaction is the orphan that the batch's commit must roll back. ``mid_copy``:
the straggler is killed before it prepares.

One driver process (``speculation_driver``) runs the scenarios one after the
other, each a query of its own, so that the JVMs and Python workers start once.
Evidence that speculation happened: Spark's event log has an attempt marked
``"Speculative": true`` of the straggler's partition, on the other host, and the
sink's commit log names that attempt's task id in the partition's decided gid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.gid import Gid
from tests.cluster.fix_cluster import (
    WORKER_HOSTS,
    StandaloneCluster,
    spark_home,
    standalone_cluster,
)
from tests.fix_pg import PgServer, prepared_in_test_db
from tests.spark.streams import COMPLETE, commit_log, query_id, table_ids, write_source

pytestmark = [pytest.mark.spark, pytest.mark.crash]
REPO = Path(__file__).resolve().parents[2]
POINTS = ("after_prepare", "mid_copy")
BATCHES = [range(0, 40), range(40, 100), range(100, 140)]
# The straggler sleeps far longer than it takes Spark to speculate (after
# spark.speculation.minTaskRuntime = 8 s, see the driver), let the copy win and kill
# the straggler (its Python worker is destroyed spark.python.task.killTimeout = 2 s
# after the kill): it never wakes up, and a killed straggler costs no time.
SLOW_BATCH, SLOW_PARTITION, SLEEP_S = 1, 0, 30
DRIVER_TIMEOUT_S = 400


@dataclasses.dataclass
class Run:
    """What the driver left: its output, and the state of the database right after it."""

    directory: Path
    hosts: list[str]
    prepared_after: list[tuple[str, str]]
    tables: dict[str, str]
    events: list[dict[str, Any]]

    def fired(self, point: str) -> list[dict[str, Any]]:
        path = self.directory / point / "fired.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def sink_id(self, point: str) -> str:
        return query_id(self.directory / point / "chk")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(scope="module")
def run(
    cluster: StandaloneCluster, pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run]:
    directory = tmp_path_factory.mktemp("speculation")
    (directory / "events").mkdir()
    tables = {point: f"t_spec_{uuid.uuid4().hex[:10]}" for point in POINTS}
    scenarios = []
    for point in POINTS:
        write_source(directory / point / "src", BATCHES)
        straggler = {"point": point, "batch": SLOW_BATCH, "partition": SLOW_PARTITION}
        scenarios.append(
            {
                "name": point,
                "source": str(directory / point / "src"),
                "checkpoint": str(directory / point / "chk"),
                "url": pg_server.url,
                "table": tables[point],
                "faults": [{**straggler, "attempt": 0, "action": "sleep", "seconds": SLEEP_S}],
                "fired": str(directory / point / "fired.jsonl"),
            }
        )
    plan = directory / "plan.json"
    plan.write_text(json.dumps({"events": str(directory / "events"), "scenarios": scenarios}))
    try:
        out = run_driver(cluster, directory, plan)
        yield Run(
            directory,
            hosts=out["hosts"],
            # now, before the per-test guard rolls back (and hides) what was left
            prepared_after=prepared_in_test_db(pg_server),
            tables=tables,
            events=spark_events(directory / "events"),
        )
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            for name in tables.values():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def run_driver(cluster: StandaloneCluster, directory: Path, plan: Path) -> dict[str, Any]:
    """The driver in a process group of its own, killed as a group whatever happens."""
    out, log_path = directory / "driver.json", directory / "driver.log"
    env = {
        **os.environ,
        "SQLSINK_FAULTS_FILE": str(directory / "faults.json"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(spark_home()),  # the cluster's: one Spark version
    }
    command = [sys.executable, "-m", "tests.cluster.speculation_driver"]
    with open(log_path, "wb") as log:
        driver = subprocess.Popen(
            [*command, cluster.master_url, str(plan), str(out)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = driver.wait(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)  # its JVM too, if still there
            driver.wait()
    assert code == 0, (
        f"the driver failed (exit {code}):\n{log_path.read_text(errors='replace')[-6000:]}\n"
        f"{executor_logs(cluster)}"
    )
    return dict(json.loads(out.read_text()))


def executor_logs(cluster: StandaloneCluster) -> str:
    """The end of every executor's stderr (in the workers' work directories)."""
    return "\n".join(
        f"--- {path} ---\n{path.read_text(errors='replace')[-3000:]}"
        for path in sorted(cluster.directory.glob("worker*/app-*/*/stderr"))
    )


def spark_events(directory: Path) -> list[dict[str, Any]]:
    (log,) = [p for p in directory.iterdir() if not p.name.startswith(".")]
    assert log.is_file() and not log.name.endswith(".inprogress"), f"event log: {log}"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def task_attempts(events: list[dict[str, Any]], query: str, batch: int) -> list[dict[str, Any]]:
    """Every launched task attempt of a streaming batch: its Task Info and end reason."""
    stages: set[int] = set()
    for event in events:
        properties = event.get("Properties") or {}
        if (
            event["Event"] == "SparkListenerJobStart"
            and properties.get("sql.streaming.queryId") == query
            and properties.get("streaming.sql.batchId") == str(batch)
        ):
            stages.update(event["Stage IDs"])
    ends = {
        event["Task Info"]["Task ID"]: event["Task End Reason"]
        for event in events
        if event["Event"] == "SparkListenerTaskEnd"
    }
    return [
        {**event["Task Info"], "Stage ID": event["Stage ID"], "End": ends.get(tid)}
        for event in events
        if event["Event"] == "SparkListenerTaskStart" and event["Stage ID"] in stages
        for tid in [event["Task Info"]["Task ID"]]
    ]


def markers(url: str, sink_id: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT gid FROM sqlsink.markers WHERE sink_id = %s", (sink_id,))
        return {str(r[0]) for r in rows}


def test_the_executors_run_on_two_hosts(run: Run) -> None:
    assert run.hosts == sorted(WORKER_HOSTS)


@pytest.mark.parametrize("point", POINTS)
def test_a_speculative_copy_of_a_straggler_writes_exactly_once(
    run: Run, pg_url: str, point: str
) -> None:
    # the straggler's first attempt slept (the fault fired in an executor, once)
    assert [(f["point"], f["batch"], f["partition"]) for f in run.fired(point)] == [
        (point, SLOW_BATCH, SLOW_PARTITION)
    ]

    # Spark's event log: a speculative copy of that partition ran, on the other host,
    # and won; the straggler was killed ("Stage cancelled: Stage finished")
    sink_id = run.sink_id(point)
    attempts = task_attempts(run.events, sink_id, SLOW_BATCH)
    # (on a very slow machine another task may be speculated too: not asserted)
    speculative = [a for a in attempts if a["Speculative"] and a["Partition ID"] == SLOW_PARTITION]
    assert len(speculative) == 1, f"batch {SLOW_BATCH}: no single speculative copy: {attempts}"
    copy = speculative[0]
    assert copy["Attempt"] == 1
    (first,) = [
        a
        for a in attempts
        if (a["Stage ID"], a["Partition ID"], a["Attempt"]) == (copy["Stage ID"], SLOW_PARTITION, 0)
    ]
    assert {first["Host"], copy["Host"]} == set(WORKER_HOSTS), (first, copy)
    assert copy["End"] == {"Reason": "Success"}, copy
    assert first["End"] is not None and first["End"]["Reason"] == "TaskKilled", first

    log = commit_log(pg_url, sink_id, "gids", "orphans", COMPLETE)  # batch -> those
    assert sorted(log) == list(range(len(BATCHES)))
    gids, orphans, _ = log[SLOW_BATCH]
    decided = {g.partition_id: g for g in map(Gid.parse, gids) if g is not None}
    assert sorted(decided) == [0, 1], gids
    if point == "after_prepare":
        # the straggler had prepared before the copy started: the copy adopted its
        # transaction (docs/DESIGN.md invariant 12) instead of writing the rows again
        # behind its row locks, so the decision names the straggler's gid, and there
        # was nothing to sweep
        assert decided[SLOW_PARTITION].attempt_id == first["Task ID"], gids
        assert orphans == 0, log[SLOW_BATCH]
    else:  # mid COPY: nothing prepared yet, the copy wrote its own transaction
        assert decided[SLOW_PARTITION].attempt_id == copy["Task ID"], gids
        straggler = dataclasses.replace(decided[SLOW_PARTITION], attempt_id=first["Task ID"])
        assert str(straggler) not in gids  # its rows never became visible

    # exactly once, nothing left prepared, every batch complete in the commit log
    assert table_ids(pg_url, run.tables[point]) == list(range(140))
    assert run.prepared_after == []
    assert [b for b, (_, _, complete) in log.items() if not complete] == []
    assert markers(pg_url, sink_id) == set()  # a complete batch's markers are pruned
