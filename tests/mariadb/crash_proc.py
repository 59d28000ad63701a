"""A partition task or a committing driver in a process of its own, for the crash tests
(tests/mariadb/test_crash.py): the kill faults (``SQLSINK_FAULTS_FILE``, core/faults.py)
SIGKILL this process's whole session, as a crash of an executor or of Spark's driver.

    python -m tests.mariadb.crash_proc task   '{"url":..,"table":..,"sink":..,"run":..,
                                                "batch":0,"partition":0,"attempt":1,
                                                "ids":[0,10],"rows_per_batch":5}'
    python -m tests.mariadb.crash_proc commit '{"url":..,"sink":..,"run":..,"batch":0,
                                                "outcomes":[...]}'

A task prints its outcome as JSON; a commit prints its report's committed gids.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import pyarrow as pa

from sqlsink.core.committer import Committer
from sqlsink.core.model import PartitionOutcome, TaskIdentity
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect
from sqlsink.mariadb.partition import LoadTarget, write_partition


def outcome_json(outcome: PartitionOutcome) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(outcome).items() if k != "key_range"}


def outcome_of(data: dict[str, Any]) -> PartitionOutcome:
    return PartitionOutcome(**data)


def task(args: dict[str, Any]) -> None:
    low, high = args["ids"]
    step = int(args.get("rows_per_batch", high - low) or 1)
    batches = [
        pa.RecordBatch.from_pydict({"id": pa.array(range(s, min(s + step, high)), pa.int64())})
        for s in range(low, high, step)
    ]
    identity = TaskIdentity(
        args["sink"], args["batch"], args["partition"], args["run"], args["attempt"], 0, "q1"
    )
    target = LoadTarget(args["url"], args["table"], 10.0, run_timeout_s=args.get("live_s", 300.0))
    print(json.dumps(outcome_json(write_partition(target, identity, batches))))


def commit(args: dict[str, Any]) -> None:
    conn = connect(args["url"])
    try:
        committer = Committer(
            MariaDBBackend(conn, 10.0), args["sink"], run_timeout_s=args.get("live_s", 300.0)
        )
        outcomes: list[PartitionOutcome | None] = [outcome_of(o) for o in args["outcomes"]]
        report = committer.commit_batch(args["batch"], outcomes, query_id="q1", run_id=args["run"])
    finally:
        conn.close()
    print(json.dumps(sorted(report.committed)))


if __name__ == "__main__":
    role, given = sys.argv[1], json.loads(sys.argv[2])
    {"task": task, "commit": commit}[role](given)
