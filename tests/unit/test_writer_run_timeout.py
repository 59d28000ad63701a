"""The foreachBatch writer refuses a runTimeout its heartbeat cannot keep a run live
within (docs/DESIGN.md invariant 10): a run that is working must never look dead."""

from __future__ import annotations

import pytest

import sqlsink
from sqlsink.errors import ConfigError
from sqlsink.spark import heartbeat

URL = "postgresql://u@h/db"


@pytest.mark.parametrize("timeout", ["1s", "2500ms"])
def test_a_run_timeout_below_the_heartbeats_floor_is_refused(timeout: str) -> None:
    """Before: runTimeout=1s was taken; the heartbeat beats every 1.1 s at the shortest, so
    recover rolled back an open two-part batch (heartbeat 1.101 s old, timeout 1.0 s)."""
    with pytest.raises(ConfigError) as refused:
        sqlsink.ForeachBatchWriter(url=URL, sink_id="a", runTimeout=timeout)
    shown = {"1s": "1s", "2500ms": "2.5s"}[timeout]
    assert str(refused.value) == (
        f"ForeachBatchWriter: runTimeout {shown} is shorter than the writer can keep a run "
        "heard from while a batch is open: its heartbeat registers the run every 1.1 s at "
        "the shortest, and a registration records a beat at most once a second, so a live "
        "run would look dead to sqlsink recover and its batch be rolled back. Fix: "
        "runTimeout of at least 3s (the default, 5min, suits most queries)"
    )


def test_a_run_timeout_at_the_floor_is_taken() -> None:
    writer = sqlsink.ForeachBatchWriter(url=URL, sink_id="a", runTimeout="3s")
    assert writer.options["runTimeout"] == "3s"
    assert heartbeat.MIN_RUN_TIMEOUT_S == 3.0 >= 2 * heartbeat.MIN_INTERVAL_S
