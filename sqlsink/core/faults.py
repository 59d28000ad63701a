"""Fault injection for the crash tests: make a real crash happen at a protocol step.

Off unless ``SQLSINK_FAULTS_FILE`` names a file (set before Spark starts, so that
its Python workers inherit it). The file holds a JSON list of faults, e.g.
``[{"point": "after_decision", "batch": 2, "action": "kill"}]``; a fault may also
name a ``partition`` and an ``attempt`` (Spark's attemptNumber). Actions:
``kill`` SIGKILLs the whole process group (the driver, its JVM and every worker:
a real crash), ``raise`` raises RuntimeError (a failed task or call).
"""

from __future__ import annotations

import json
import os
import signal

ENV = "SQLSINK_FAULTS_FILE"
POINTS = ("after_prepare", "before_decision", "after_decision", "mid_commit", "after_commit")


def crash_point(
    point: str, batch_id: int, partition_id: int | None = None, attempt: int | None = None
) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as f:
            faults = json.load(f)
    except (OSError, ValueError):
        return
    for fault in faults:
        if fault.get("point") != point or fault.get("batch", batch_id) != batch_id:
            continue
        if fault.get("partition", partition_id) != partition_id:
            continue
        if fault.get("attempt", attempt) != attempt:
            continue
        if fault.get("action") == "kill":
            os.killpg(os.getpgrp(), signal.SIGKILL)
        raise RuntimeError(f"injected fault at {point} (batch {batch_id})")
