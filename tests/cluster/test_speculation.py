"""Exactly once with Spark's speculative execution and task retries, on a real
standalone cluster.

Local mode never runs a speculative copy (one host), so this starts a Master and
two Workers on 127.0.0.2 and 127.0.0.3 (``fix_cluster``). In the straggler
scenarios one task of batch 1 is a straggler (a ``sleep`` fault on its first
attempt, after PREPARE or mid-COPY), so that Spark launches a speculative copy of
it on the other host. Two attempts of one partition then write the same rows;
exactly one may become visible. ``after_prepare``: the straggler prepared and
sleeps, alive, while the copy runs; the copy adopts the straggler's prepared
transaction (docs/DESIGN.md invariant 12), and the straggler is killed.
``after_prepare_upsert``: the same with mode=upsert into a table with a primary
key, where a copy that wrote its rows again would wait behind the straggler's
prepared row locks until lockTimeout. ``mid_copy``: the straggler is killed before
it prepares.

``retry_after_prepare`` (issue 12 item 10): the first attempt of one task of batch 1
fails right after PREPARE (a ``raise`` fault), in upsert mode into a table with a
primary key; Spark retries the task, and the retry must go on (adopt the prepared
attempt) instead of waiting on its row locks until lockTimeout.

One driver process (``speculation_driver``) runs the scenarios one after the
other, each a query of its own, so that the JVMs and Python workers start once.
The driver exits 0 only if every query drained without failing. Evidence of what
happened: Spark's event log (an attempt marked ``"Speculative": true`` on the
other host; a failed first attempt and its retry), and the sink's commit log,
which names a task id in each partition's decided gid.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
    executor_logs,
    run_in_group,
    spark_home,
    standalone_cluster,
)
from tests.fix_pg import PgServer, prepared_in_test_db
from tests.spark.streams import COMPLETE, commit_log, query_id, write_records, write_source

pytestmark = [pytest.mark.spark, pytest.mark.crash]
REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    point: str  # the fault point of batch SLOW_BATCH, partition SLOW_PARTITION, attempt 0
    action: str  # "sleep": a straggler, speculated; "raise": a failed attempt, retried
    upsert: bool  # mode=upsert into a table with a primary key (else append, no key)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("after_prepare", "after_prepare", "sleep", upsert=False),
        Scenario("after_prepare_upsert", "after_prepare", "sleep", upsert=True),
        Scenario("mid_copy", "mid_copy", "sleep", upsert=False),
        Scenario("retry_after_prepare", "after_prepare", "raise", upsert=True),
    )
}
SPECULATED = [n for n, s in SCENARIOS.items() if s.action == "sleep"]
BATCHES = [range(0, 40), range(40, 100), range(100, 140)]
# upsert: batch 1 rewrites keys of batch 0, batch 2 keys of batch 1; the payload says
# which batch wrote a row, so the final table shows each key's last version
UPSERT_BATCHES = [range(0, 40), range(20, 100), range(80, 140)]
# a copy or a retry that waited on its sibling's prepared row locks would fail after
# this (not the default 60 s: a regression fails the driver well within its timeout)
LOCK_TIMEOUT = "20s"
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

    def fired(self, name: str) -> list[dict[str, Any]]:
        path = self.directory / name / "fired.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def sink_id(self, name: str) -> str:
        return query_id(self.directory / name / "chk")


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
    tables = {name: f"t_spec_{uuid.uuid4().hex[:10]}" for name in SCENARIOS}
    scenarios = []
    for name, scenario in SCENARIOS.items():
        source = directory / name / "src"
        options = {}
        if scenario.upsert:
            write_records(source, upsert_records())
            with psycopg.connect(pg_server.url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (id bigint PRIMARY KEY, payload text, "
                        "ts timestamptz, amount double precision)"
                    ).format(sql.Identifier(tables[name]))
                )
            options = {"mode": "upsert", "lockTimeout": LOCK_TIMEOUT}
        else:
            write_source(source, BATCHES)
        fault: dict[str, Any] = {
            "point": scenario.point,
            "batch": SLOW_BATCH,
            "partition": SLOW_PARTITION,
            "attempt": 0,
            "action": scenario.action,
        }
        if scenario.action == "sleep":
            fault["seconds"] = SLEEP_S
        scenarios.append(
            {
                "name": name,
                "source": str(source),
                "checkpoint": str(directory / name / "chk"),
                "url": pg_server.url,
                "table": tables[name],
                "options": options,
                "faults": [fault],
                "fired": str(directory / name / "fired.jsonl"),
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


def upsert_records() -> list[list[dict[str, Any]]]:
    return [
        [
            {"id": i, "payload": f"batch {b}", "ts": "2026-01-01T00:00:00Z", "amount": float(b)}
            for i in ids
        ]
        for b, ids in enumerate(UPSERT_BATCHES)
    ]


def expected_rows(scenario: Scenario) -> dict[int, str]:
    """id -> payload of the table after a clean run (upsert: each key's last version)."""
    if not scenario.upsert:
        return {i: f"record {i} ✓" for ids in BATCHES for i in ids}
    return {i: f"batch {b}" for b, ids in enumerate(UPSERT_BATCHES) for i in ids}


def table_rows(url: str, table: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
    return [(int(str(i)), str(p)) for i, p in rows]


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
    code = run_in_group(
        [*command, cluster.master_url, str(plan), str(out)],
        cwd=REPO,
        env=env,
        log_path=log_path,
        timeout_s=DRIVER_TIMEOUT_S,
    )
    assert code == 0, (
        f"the driver failed (exit {code}):\n{log_path.read_text(errors='replace')[-6000:]}\n"
        f"{executor_logs(cluster)}"
    )
    return dict(json.loads(out.read_text()))


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
        event["Task Info"]["Task ID"]: event
        for event in events
        if event["Event"] == "SparkListenerTaskEnd"
    }
    # the Task Info of the start, with the end's finish time (0 while it ran)
    return [
        {
            **event["Task Info"],
            "Stage ID": event["Stage ID"],
            "End": ends[tid]["Task End Reason"] if tid in ends else None,
            "Finish Time": ends[tid]["Task Info"]["Finish Time"] if tid in ends else 0,
        }
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


@pytest.mark.parametrize("name", SPECULATED)
def test_a_speculative_copy_of_a_straggler_writes_exactly_once(
    run: Run, pg_url: str, name: str
) -> None:
    scenario = SCENARIOS[name]
    # the straggler's first attempt slept (the fault fired in an executor, once)
    assert [(f["point"], f["batch"], f["partition"]) for f in run.fired(name)] == [
        (scenario.point, SLOW_BATCH, SLOW_PARTITION)
    ]

    # Spark's event log: a speculative copy of that partition ran, on the other host,
    # and won; the straggler was killed ("Stage cancelled: Stage finished")
    sink_id = run.sink_id(name)
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
    # both attempts were alive together: the copy ran from its launch to its success
    # while the straggler (prepared, for after_prepare: the fault fires after PREPARE)
    # still slept; the straggler was killed only afterwards
    assert first["Launch Time"] < copy["Launch Time"] < copy["Finish Time"] <= first["Finish Time"]

    log = commit_log(pg_url, sink_id, "gids", "orphans", COMPLETE)  # batch -> those
    assert sorted(log) == list(range(len(BATCHES)))
    gids, orphans, _ = log[SLOW_BATCH]
    decided = {g.partition_id: g for g in map(Gid.parse, gids) if g is not None}
    assert sorted(decided) == [0, 1], gids
    if scenario.point == "after_prepare":
        # the straggler had prepared before the copy started: the copy adopted its
        # transaction (docs/DESIGN.md invariant 12) instead of writing the rows again
        # (in upsert mode: behind its row locks, until lockTimeout), so the decision
        # names the straggler's gid, and there was nothing to sweep
        assert decided[SLOW_PARTITION].attempt_id == first["Task ID"], gids
        assert orphans == 0, log[SLOW_BATCH]
    else:  # mid COPY: nothing prepared yet, the copy wrote its own transaction
        assert decided[SLOW_PARTITION].attempt_id == copy["Task ID"], gids
        straggler = dataclasses.replace(decided[SLOW_PARTITION], attempt_id=first["Task ID"])
        assert str(straggler) not in gids  # its rows never became visible

    # exactly once, nothing left prepared, every batch complete in the commit log
    assert_exactly_once(run, pg_url, name, log)


def test_a_retry_after_a_failure_past_prepare_adopts_it_and_the_batch_commits(
    run: Run, pg_url: str
) -> None:
    """Issue 12 item 10, on the cluster: the first attempt of partition 0 of batch 1
    prepared, then failed (upsert, a table with a primary key: its prepared transaction
    holds the row locks of every key of the partition); Spark's retry must not wait
    on them until lockTimeout (the query would fail), but adopt the prepared attempt."""
    name = "retry_after_prepare"
    assert [(f["point"], f["batch"], f["partition"]) for f in run.fired(name)] == [
        ("after_prepare", SLOW_BATCH, SLOW_PARTITION)
    ]
    sink_id = run.sink_id(name)
    attempts = task_attempts(run.events, sink_id, SLOW_BATCH)
    # the write stage: the one whose task of that partition was retried (a task retry,
    # not a stage retry: same stage; the job's other stage reads the source)
    (stage,) = {a["Stage ID"] for a in attempts if a["Attempt"] > 0}
    mine = sorted(
        (a for a in attempts if (a["Stage ID"], a["Partition ID"]) == (stage, SLOW_PARTITION)),
        key=lambda a: a["Attempt"],
    )
    assert [a["Attempt"] for a in mine] == [0, 1], attempts
    failed, retry = mine
    assert failed["End"] is not None and failed["End"]["Reason"] == "ExceptionFailure", failed
    assert "injected fault at after_prepare" in json.dumps(failed["End"]), failed
    assert retry["End"] == {"Reason": "Success"}, retry
    assert not failed["Speculative"] and not retry["Speculative"], mine
    assert failed["Finish Time"] <= retry["Launch Time"], mine

    log = commit_log(pg_url, sink_id, "gids", "orphans", COMPLETE)
    assert sorted(log) == list(range(len(UPSERT_BATCHES)))
    gids, orphans, _ = log[SLOW_BATCH]
    decided = {g.partition_id: g for g in map(Gid.parse, gids) if g is not None}
    assert sorted(decided) == [0, 1], gids
    # the retry adopted the failed attempt's prepared transaction: the decision names
    # the first attempt's gid, and nothing was left to sweep
    assert decided[SLOW_PARTITION].attempt_id == failed["Task ID"], (gids, mine)
    assert decided[SLOW_PARTITION].run_id == decided[1 - SLOW_PARTITION].run_id
    assert orphans == 0, log[SLOW_BATCH]
    assert_exactly_once(run, pg_url, name, log)


def assert_exactly_once(run: Run, pg_url: str, name: str, log: dict[int, tuple[Any, ...]]) -> None:
    """The exact rows (each once, each key's last version), nothing left prepared,
    every batch complete and its markers pruned."""
    expected = expected_rows(SCENARIOS[name])
    assert table_rows(pg_url, run.tables[name]) == sorted(expected.items())
    assert run.prepared_after == []
    assert [b for b, row in log.items() if not row[-1]] == []
    assert markers(pg_url, run.sink_id(name)) == set()  # a complete batch's markers are pruned
