"""The human report of ``sqlsink status``: a table of the sinks, then their details."""

from __future__ import annotations

from dataclasses import dataclass

from sqlsink.cli.contract import OtherPreparedJson, PreparedJson, RecentBatchJson, StatusSinkJson
from sqlsink.cli.output import Output, format_age, format_time, table
from sqlsink.cli.runs import print_runs
from sqlsink.core.model import BatchFigures


@dataclass
class SinkStatus:
    doc: StatusSinkJson  # the JSON of the sink
    lost: list[tuple[int, str]]  # (batch, gid) of its confirmed data loss
    live: list[str]  # its live runs, described, for the human report
    connected: list[str]  # its sessions and lock holders: evidence only


NEVER_WROTE_SHOWN = 10  # the ids the line names; the count says how many more


def print_status(
    out: Output, sinks: list[SinkStatus], *, detailed: bool, commit_statement: str
) -> None:
    """A table of every sink, then the details of those with something to show.

    A sink with nothing but its registration (``never_wrote``: a one-off load that failed
    before its decision) is no row of the table but one line after it, with its id and
    the command that removes it; with --sink-id (``detailed``) it is shown as any sink."""
    if out.json_mode:
        return
    never = [] if detailed else [s.doc["sink_id"] for s in sinks if s.doc["never_wrote"]]
    sinks = [s for s in sinks if s.doc["sink_id"] not in never]
    if not sinks and not never:
        out.line("no sinks in this database")
        return
    if sinks:
        _print_table(out, sinks, detailed=detailed, commit_statement=commit_statement)
    if never:
        more = len(never) - NEVER_WROTE_SHOWN
        ids = ", ".join(never[:NEVER_WROTE_SHOWN]) + (f" and {more} more" if more > 0 else "")
        out.line()
        out.line(
            f"registered, never wrote: {len(never)} ({ids}): no decision, nothing prepared, "
            f"no run live; sqlsink forget --url {out.paste_url} --sink-id <id> removes them"
            f"{out.paste_note}"
        )


def _print_table(
    out: Output, sinks: list[SinkStatus], *, detailed: bool, commit_statement: str
) -> None:
    out.line()
    head = [
        "SINK",
        "TABLES",
        "QUERY",
        "LAST_DECIDED",
        "LAST_COMPLETE",
        "INCOMPLETE",
        "PREPARED",
        "OLDEST",
    ]
    rows = []
    for sink in sinks:
        d = sink.doc
        oldest = max((p["age_seconds"] for p in d["prepared"]), default=None)
        rows.append(
            [
                d["sink_id"],
                ", ".join(d["tables"]) or None,
                d["bound_query_id"],
                d["last_decided_batch"],
                d["last_complete_batch"],
                len(d["incomplete_batches"]),
                len(d["prepared"]),
                None if oldest is None else format_age(oldest),
                " ".join(
                    ([d["state"].upper()] if d["state"] else [])
                    + (["STRANDED"] if _stranded(d) and d["state"] != "stranded" else [])
                    + (["DATA LOSS"] if sink.lost or _checkpoint_loss(d) else [])
                ),
            ]
        )
    for text in table([*head, "STATE"], rows, right={3, 4, 5, 6, 7}):
        out.line(text)
    for sink in sinks:
        d = sink.doc
        shown = bool(d["prepared"] or d["incomplete_batches"] or d["live"] or sink.lost)
        shown = shown or bool(d["hidden_batches"]) or d["state"] in ("failed", "quiet")
        if detailed or shown or _checkpoint_loss(d):
            _print_sink_status(out, sink, commit_statement)


def _stranded(doc: StatusSinkJson) -> bool:
    return any(p["stranded"] for p in doc["prepared"])


def _state_line(doc: StatusSinkJson) -> str | None:
    """The newest run's end as its driver recorded it, or the run in doubt."""
    end, doubt = doc["ended"], doc["in_doubt"]
    if end is not None:
        error = f": {end['error']}" if end["error"] else ""
        return (
            f"  state: {end['how'].upper()} at {format_time(end['ended_at'])} "
            f"(run {end['run_id']}){error}"
        )
    if doubt is not None:
        return (
            f"  state: QUIET, in doubt: run {doubt['run_id']} last heard from "
            f"{format_age(doubt['heard_age_seconds'])} ago, no session of the sink connected, "
            f"batch(es) {', '.join(map(str, doubt['partial_batches']))} decided, not complete; "
            f"declared dead at {format_time(doubt['dead_at'])}"
        )
    if doc["state"] == "quiet":
        return "  state: QUIET (not heard from for longer than its batches suggest)"
    return None


def _checkpoint_loss(doc: StatusSinkJson) -> bool:
    check = doc["checkpoint_check"]
    return check is not None and check["verdict"] == "loss"


def _print_sink_status(out: Output, sink: SinkStatus, commit_statement: str) -> None:
    doc = sink.doc
    out.line()
    bound = doc["bound_query_id"]
    out.line(f"sink {doc['sink_id']}  ({f'query {bound}' if bound else 'not bound to a query'})")
    if doc["tables"]:
        out.line(f"  writes: {', '.join(doc['tables'])}")
    if (state := _state_line(doc)) is not None:
        out.line(state)
    if sink.live:
        out.line(f"  live: {'; '.join(sink.live)}")
    else:
        out.line("  live: no run (none heard from within its timeout)")
    if sink.connected:
        out.line(f"  connected: {'; '.join(sink.connected[:6])}")
    if doc["runs"]:
        out.line("  runs:")
        print_runs(out, doc["runs"])
    check = doc["checkpoint_check"]
    if check is None:
        out.line("  checkpoint: not checked yet (a run checks at its first commit)")
    else:
        lost = f", lost batches {', '.join(map(str, check['lost']))}" if check["lost"] else ""
        out.line(
            f"  checkpoint: {check['verdict']}{lost} ({check['location'] or 'no location'}; "
            f"run {check['run_id']}, batch {check['batch_id']}, "
            f"{format_time(check['checked_at'])})"
        )
    _print_views(out, doc)
    last = doc["last_batch"]
    if last is not None:
        figures = BatchFigures.from_json(last["figures"])
        said = "no figures recorded" if figures is None else figures.summary(commit_statement)
        out.line(f"  last batch {last['batch_id']}: {said}")
    if doc["recent_batches"]:
        out.line("  recent batches:")
        _print_recent(out, doc["recent_batches"])
    if doc["prepared"]:
        out.line(f"  open prepared transactions: {len(doc['prepared'])}")
        _print_prepared(out, doc["prepared"])
    else:
        out.line("  open prepared transactions: none")


def _print_views(out: Output, doc: StatusSinkJson) -> None:
    """The sink's consistent views, and the batches committed in part: hidden by them,
    part-visible in the bare table (docs/DESIGN.md invariant 13)."""
    hidden = doc["hidden_batches"]
    for view in doc["consistent_views"]:
        what = f"hides {len(hidden)} batch(es)" if hidden else "hides nothing now"
        out.line(
            f"  consistent view: {view['view']} of table {view['table']} "
            f"(owner {view['owner']}): {what}"
        )
    if not hidden:
        return
    if doc["consistent_views"]:
        out.line("  hidden by the view (committed in part; the bare table shows these):")
    else:
        out.line("  committed in part (the table shows part of these batches):")
    for h in hidden:
        of = "?" if h["partitions"] is None else str(h["partitions"])
        out.line(
            f"    batch {h['batch_id']}: {h['partitions_hidden']} of {of} partitions, "
            f"{h['rows_hidden']:,} rows: {h['reason']}"
        )


def _print_recent(out: Output, recent: list[RecentBatchJson]) -> None:
    rows = [
        [
            d["batch_id"],
            d["rows"],
            d["gids"],
            format_time(d["decided_at"]),
            format_time(d["completed_at"]) if d["completed_at"] else "NOT COMPLETE",
            "-" if d["rows_per_second"] is None else f"{d['rows_per_second']:,.0f}",
            "-" if d["lag_seconds"] is None else f"{d['lag_seconds']:.2f}s",
        ]
        for d in recent
    ]
    headers = ["BATCH", "ROWS", "GIDS", "DECIDED_AT", "COMPLETED_AT", "ROWS/S", "LAG"]
    right = {0, 1, 2, 5, 6}
    dead = [None if d["figures"] is None else d["figures"]["dead_letters"] for d in recent]
    if any(dead):  # rows sent to the dead-letter table (deadLetterTable): a column of its own
        headers.append("DEAD_LETTERS")
        right.add(len(headers) - 1)
        for row, n in zip(rows, dead, strict=True):
            row.append("-" if n is None else n)
    for text in table(headers, rows, right=right):
        out.line("    " + text)


def _print_prepared(out: Output, prepared: list[PreparedJson]) -> None:
    rows = [
        [
            p["gid"],
            p["batch_id"],
            p["partition_id"],
            format_age(p["age_seconds"]),
            p["owner"],
            "yes" if p["decided"] else "no",
            "STRANDED" if p["stranded"] else "",
        ]
        for p in prepared
    ]
    head = ["GID", "BATCH", "PART", "AGE", "OWNER", "DECIDED", "NOTE"]
    for text in table(head, rows, right={1, 2, 3}):
        out.line("    " + text)


def print_others(out: Output, others: list[OtherPreparedJson]) -> None:
    """The prepared transactions that are not this tool's to resolve (here)."""
    if not others or out.json_mode:
        return
    out.line()
    out.line("prepared transactions that are not this tool's to resolve:")
    rows = [
        [o["gid"], o["database"], o["owner"], format_age(o["age_seconds"]), o["reason"]]
        for o in others
    ]
    for text in table(["GID", "DATABASE", "OWNER", "AGE", "REASON"], rows, right={3}):
        out.line("  " + text)
