"""``sqlsink status``'s verdict on a sink's newest run (issue 30): STOPPED or FAILED as
its driver recorded it, LIVE, QUIET, STRANDED; and, for a run the registry still holds
live while nothing of it is connected and a batch of it is committed in part (a killed
driver says nothing), what is known and when it is declared dead.

The registry's judgement of liveness (``run_registry.RUNS_SQL``) is not changed here:
``live`` in the JSON stays the registry's, which ``recover`` acts on; ``state`` adds what
status concludes from the recorded end and the evidence."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlsink.cli.contract import InDoubtJson, PreparedJson, RunEndJson, SinkState
from sqlsink.cli.output import Notice, Output, format_age, format_time
from sqlsink.cli.runs import end_json, timeout_text
from sqlsink.core.admin import DecisionRow, RunEnd, RunInfo, ServerTerms

# a live run is QUIET when not heard from for longer than this many of its batch
# intervals (plus QUIET_SLACK_S); with no interval known yet, for a third of its timeout
QUIET_INTERVALS = 2.0
QUIET_SLACK_S = 5.0


@dataclass(frozen=True)
class Verdict:
    state: SinkState | None
    ended: RunEndJson | None
    in_doubt: InDoubtJson | None


def quiet_after(run: RunInfo) -> float:
    """How long a live run may be unheard from before status calls it QUIET."""
    if run.batch_interval_s is not None:
        return QUIET_INTERVALS * run.batch_interval_s + QUIET_SLACK_S
    return run.timeout_s / 3


def verdict(
    runs: list[RunInfo],
    ends: dict[str, RunEnd],
    prepared: list[PreparedJson],
    incomplete: list[DecisionRow],
    connected: int,
    now: datetime,
) -> Verdict:
    """``runs`` newest first (``run_registry.runs``); ``connected``: the sink's sessions,
    read after ``incomplete`` (a commit holds its session from before its decision until
    the batch is complete: a decision not complete with nothing of the sink connected
    after it was read is no commit in progress)."""
    newest = runs[0] if runs else None
    end = ends.get(newest.run_id) if newest is not None else None
    live = [r for r in runs if r.live]
    doubt = None
    mine = [d for d in incomplete if live and d.run_id == live[0].run_id]
    if mine and connected == 0:
        doubt = _in_doubt(live[0], mine, now)
    if end is not None:
        return Verdict("failed" if end.how == "failed" else "stopped", end_json(end), doubt)
    if live:
        run = live[0]
        quiet = doubt is not None or run.heartbeat_age_s > quiet_after(run)
        return Verdict("quiet" if quiet else "live", None, doubt)
    if any(p["stranded"] for p in prepared):
        return Verdict("stranded", None, None)
    return Verdict(None, None, None)


def _in_doubt(run: RunInfo, partial: list[DecisionRow], now: datetime) -> InDoubtJson:
    dead_at = run.heartbeat_at + timedelta(seconds=run.timeout_s)
    return {
        "run_id": run.run_id,
        "heard_at": run.heartbeat_at,
        "heard_age_seconds": round(run.heartbeat_age_s, 3),
        "sessions": 0,
        "partial_batches": sorted(d.batch_id for d in partial),
        "dead_at": dead_at,
        "dead_in_seconds": round(max(0.0, (dead_at - now).total_seconds()), 3),
    }


def end_word(end: RunEndJson) -> str:
    return "failed" if end["how"] == "failed" else "stopped"


def failed_notice(out: Output, sink_id: str, end: RunEndJson) -> Notice:
    """The warning for a sink whose newest run failed: its query is not running, so the
    report is not "all well" (exit 1) until it runs again or the sink is forgotten."""
    error = f": {end['error']}" if end["error"] else " (no error recorded)"
    message = (
        f"the newest run {end['run_id']} of sink {sink_id} failed at "
        f"{format_time(end['ended_at'])}{error}; nothing of the sink is written until its "
        "query runs again"
    )
    fix = (
        "fix what the error says and restart the query (its checkpoint resumes it exactly "
        f"once); a query retired for good: sqlsink forget --url {out.paste_url} --sink-id "
        f"{sink_id}{out.paste_note}"
    )
    return Notice("warning", message, fix, sink_id)


def in_doubt_notice(
    out: Output,
    sink_id: str,
    doubt: InDoubtJson,
    run: RunInfo,
    prepared: list[PreparedJson],
    ended: RunEndJson | None = None,
) -> Notice:
    """The warning for a run in doubt: never "all well" while a batch is committed in part
    and nothing of its run is connected (a run that recorded its end, too: the registry
    holds it live until its timeout, and recover waits for that)."""
    over = ended is not None and ended["run_id"] == doubt["run_id"]  # its query has ended
    batches = doubt["partial_batches"]
    waiting = {b: sum(1 for p in prepared if p["batch_id"] == b) for b in batches}
    named = ", ".join(f"batch {b} ({waiting[b]} partition(s) still prepared)" for b in batches)
    message = (
        f"{named} of sink {sink_id} decided, not complete (committed in part, or not yet at "
        f"all), and no session of the sink is connected: run {doubt['run_id']} was last heard from "
        f"{format_age(doubt['heard_age_seconds'])} ago ({format_time(doubt['heard_at'])}); "
        + (
            f"its driver recorded that its query {end_word(ended)} at "
            f"{format_time(ended['ended_at'])}, leaving the batch. Until the run is "
            if over and ended is not None
            else "its driver may be gone (killed: a killed driver records no end). Until it is "
        )
        + "declared dead at "
        f"{format_time(doubt['dead_at'])} (in {format_age(doubt['dead_in_seconds'])}; "
        f"timeout {timeout_text(run)}) nothing but "
        + ("the query's restart" if over else "its own next commit")
        + " finishes the batch"
    )
    url = out.paste_url
    fix = (
        ("the query is not running: " if over else "if the driver is gone: ")
        + f"sqlsink recover --url {url} --sink-id {sink_id} --force "
        f"--run-id {doubt['run_id']} (finishes it now); otherwise its restart or sqlsink "
        f"recover --url {url} --sink-id {sink_id} after {format_time(doubt['dead_at'])} "
        f"does{out.paste_note}"
    )
    return Notice("warning", message, fix, sink_id)


def leftover_notice(
    out: Output,
    sink_id: str,
    ended: RunEndJson,
    run: RunInfo | None,
    prepared: list[PreparedJson],
    now: datetime,
    terms: ServerTerms,
) -> Notice | None:
    """The warning for partitions a run left prepared, undecided, when its query stopped
    or failed: no batch of theirs was decided, so they are rolled back, not committed;
    until then they hold their locks and keep the server from cleaning up behind them,
    and nothing of the run is left to do it but the query's restart or ``recover``."""
    left = [
        p
        for p in prepared
        if p["run_id"] == ended["run_id"] and not p["decided"] and not p["stranded"]
    ]
    if not left:
        return None
    batches = sorted({p["batch_id"] for p in left})
    named = ", ".join(
        f"batch {b} ({sum(1 for p in left if p['batch_id'] == b)} partition(s))" for b in batches
    )
    if run is not None:
        dead_at = run.heartbeat_at + timedelta(seconds=run.timeout_s)
        wait = max(0.0, (dead_at - now).total_seconds())
        when = (
            f"sqlsink recover --url {out.paste_url} --sink-id {sink_id} after "
            f"{format_time(dead_at)} (in {format_age(wait)}: the run's timeout "
            f"{timeout_text(run)})"
        )
    else:
        when = f"sqlsink recover --url {out.paste_url} --sink-id {sink_id}"
    message = (
        f"run {ended['run_id']} of sink {sink_id} left {named} prepared and undecided: its "
        f"driver recorded that its query {end_word(ended)} at "
        f"{format_time(ended['ended_at'])} before deciding them. They are rolled back, not "
        "committed (their rows are written again by the query's restart); until then each "
        f"{terms.prepared_cost}"
    )
    fix = (
        f"restart the query (it rolls them back first); or {when}; or now: sqlsink recover "
        f"--url {out.paste_url} --sink-id {sink_id} --force --run-id {ended['run_id']}"
        f"{out.paste_note}"
    )
    return Notice("warning", message, fix, sink_id)
