"""Fault injection for the crash tests: make a real crash happen at a protocol step.

Off unless ``SQLSINK_FAULTS_FILE`` names a file (set before Spark starts, so that
its Python workers inherit it). The file holds a JSON list of faults, e.g.
``[{"point": "after_decision", "batch": 2, "action": "kill"}]``; a fault may also
name a ``partition`` and an ``attempt`` (Spark's attemptNumber), and ``"once": true``
to fire only the first time it matches (the ``.fired`` log remembers). Actions:
``kill`` SIGKILLs every process of the session (the driver, its JVM and every
worker, which PySpark puts in process groups of their own: a real crash; run the
driver with ``start_new_session``), ``raise`` raises RuntimeError (a failed task),
``terminate`` ends the caller's own database session from a second connection to the
fault's ``url`` and returns, so that the code goes on and meets the cut connection
where it would in production (mid-COPY, mid-commit). The callers pass ``cut``, their
backend's way of doing that (PostgreSQL's: ``pg_terminate_backend`` of the session's
pid, ``sqlsink/postgres/faults.py``). ``sleep`` waits
``seconds`` and returns (a straggler, for speculative execution).

This module is test instrumentation; it knows no database.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable

ENV = "SQLSINK_FAULTS_FILE"
POINTS = (
    "mid_copy",
    "after_prepare",
    "before_decision",
    "in_decision",
    "after_decision",
    "mid_commit",
    "after_commit",
)


def crash_point(
    point: str,
    batch_id: int,
    partition_id: int | None = None,
    attempt: int | None = None,
    *,
    cut: Callable[[str], None] | None = None,
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
        if fault.get("once") and _has_fired(path, fault):
            continue
        with open(f"{path}.fired", "a", encoding="utf-8") as log:  # tests assert it fired
            log.write(json.dumps({**fault, "batch": batch_id, "partition": partition_id}) + "\n")
        if fault.get("action") == "kill":
            _kill_session()
        if fault.get("action") == "sleep":
            time.sleep(float(fault.get("seconds", 10)))
            return
        if fault.get("action") == "terminate":
            if cut is None:
                raise RuntimeError(f"a terminate fault at {point} needs the caller's cut")
            cut(str(fault["url"]))
            return
        raise RuntimeError(f"injected fault at {point} (batch {batch_id})")


def _has_fired(path: str, fault: dict[str, object]) -> bool:
    try:
        with open(f"{path}.fired", encoding="utf-8") as log:
            fired = [json.loads(line) for line in log]
    except (OSError, ValueError):
        return False
    return any(all(f.get(k) == v for k, v in fault.items() if k != "partition") for f in fired)


def _kill_session() -> None:
    """SIGKILL every process of this session, this one last (Linux /proc)."""
    session = os.getsid(0)
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:  # field 6 of stat: session id
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue
    os.kill(me, signal.SIGKILL)
