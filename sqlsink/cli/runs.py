"""The runs of a sink as ``recover`` and ``status`` show them (docs/DESIGN.md invariant 10).

Liveness is the runs registry's (``sqlsink.runs``, judged by ``run_registry.runs``): a run
is live while it is not fenced, no batch of it was aborted, and a task or commit of it
was heard from within its timeout. Connected sessions are shown as evidence only: every
batch has moments with its transactions prepared and nothing of it connected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from sqlsink.cli.contract import RunEndJson, RunJson, RunState
from sqlsink.cli.output import Output, format_age, format_time, table
from sqlsink.core.admin import RunEnd, RunInfo
from sqlsink.core.gid import Gid

NEWEST_SHOWN = 3  # status shows a sink's newest runs besides its live ones and those with gids


def run_state(run: RunInfo) -> RunState:
    state = run.state
    return "fenced" if state == "fenced" else "live" if state == "live" else "dead"


def end_json(end: RunEnd) -> RunEndJson:
    return {
        "run_id": end.run_id,
        "ended_at": end.ended_at,
        "how": "failed" if end.how == "failed" else "stopped",
        "error": end.error,
    }


def run_json(run: RunInfo, prepared: int, ended: RunEndJson | None) -> RunJson:
    return {
        "run_id": run.run_id,
        "state": run_state(run),
        "first_seen": run.first_seen,
        "heartbeat_at": run.heartbeat_at,
        "heartbeat_age_seconds": round(run.heartbeat_age_s, 3),
        "timeout_seconds": round(run.timeout_s, 3),
        "run_timeout_seconds": round(run.run_timeout_s, 3),
        "batch_interval_seconds": (
            None if run.batch_interval_s is None else round(run.batch_interval_s, 3)
        ),
        "superseded_at": run.superseded_at,
        "superseded_by": run.superseded_by,
        "aborted_batch": run.aborted_batch,
        "prepared": prepared,
        "ended": ended,
    }


def timeout_text(run: RunInfo) -> str:
    """The run's timeout and where it comes from."""
    text = format_age(run.timeout_s)
    if run.batch_interval_s is not None and 3 * run.batch_interval_s > run.run_timeout_s:
        return f"{text}: 3 x its batch interval {format_age(run.batch_interval_s)}"
    return f"{text}: its runTimeout"


def describe(run: RunInfo) -> str:
    """One phrase: the run, its state and why."""
    heard = f"heard from {format_age(run.heartbeat_age_s)} ago"
    if run.superseded_at is not None:
        by = "an operator" if run.superseded_by == "operator" else f"run {run.superseded_by}"
        return f"run {run.run_id} (fenced by {by}; {heard})"
    if run.aborted_batch is not None:
        return f"run {run.run_id} (over: Spark aborted its batch {run.aborted_batch}; {heard})"
    timeout = timeout_text(run)
    if run.live:
        return f"run {run.run_id} (live: {heard}, timeout {timeout})"
    return f"run {run.run_id} (dead: {heard}, timeout {timeout})"


def prepared_by_run(gids: Iterable[Gid]) -> Counter[str]:
    return Counter(g.run_id for g in gids)


def shown_runs(runs: list[RunInfo], prepared: Mapping[str, int], newest: int) -> list[RunInfo]:
    """The runs worth showing: live ones, those with prepared transactions, the newest few
    (``runs`` comes newest first)."""
    return [r for i, r in enumerate(runs) if r.live or prepared.get(r.run_id, 0) > 0 or i < newest]


def stranded_reason(gid: Gid, runs: Mapping[str, RunInfo]) -> str | None:
    """Why nobody but ``sqlsink recover`` (or a new run of the query) will finish this
    prepared transaction; None while its run is live."""
    run = runs.get(gid.run_id)
    if run is None:
        return f"run {gid.run_id} is unknown to the commit log"
    if run.live:
        return None
    return describe(run)


def print_runs(out: Output, runs: list[RunJson], indent: str = "    ") -> None:
    rows = [
        [
            r["run_id"],
            _state(r),
            format_age(r["heartbeat_age_seconds"]),
            format_age(r["timeout_seconds"]),
            r["prepared"],
            _note(r),
        ]
        for r in runs
    ]
    head = ["RUN", "STATE", "HEARD", "TIMEOUT", "PREPARED", "NOTE"]
    for text in table(head, rows, right={2, 3, 4}):
        out.line(indent + text)


def _state(r: RunJson) -> str:
    """The registry's state, but a query its driver recorded as ended is not shown LIVE
    (the registry holds it live until its timeout, for recover's sake: the note says)."""
    if r["ended"] is not None and r["state"] == "live":
        return "stopped" if r["ended"]["how"] == "stopped" else "failed"
    return r["state"].upper() if r["state"] == "live" else r["state"]


def _note(r: RunJson) -> str:
    if r["ended"] is not None and r["state"] == "live":
        when = format_time(r["ended"]["ended_at"])
        return f"{r['ended']['how']} at {when}; live to recover until its timeout"
    if r["superseded_by"] is not None:
        by = "an operator" if r["superseded_by"] == "operator" else f"run {r['superseded_by']}"
        return f"fenced by {by}"
    if r["aborted_batch"] is not None:
        return f"batch {r['aborted_batch']} aborted"
    interval = r["batch_interval_seconds"]
    if interval is not None and 3 * interval > r["run_timeout_seconds"]:
        return f"timeout = 3 x batch interval {format_age(interval)}"
    return ""
