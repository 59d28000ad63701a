"""``sqlsink recover``'s human report: each sink in a line, what was (or would be) done,
what was left and why, the losses, the checkpoint, and the last line with the exit code."""

from __future__ import annotations

from sqlsink.cli.contract import ActionJson, CheckpointJson
from sqlsink.cli.loss import print_losses
from sqlsink.cli.output import Output, format_age, table
from sqlsink.cli.recover_checkpoint import print_checkpoint
from sqlsink.cli.recover_report import SinkRecovery
from sqlsink.cli.runs import describe


def print_recover(
    out: Output,
    sinks: list[SinkRecovery],
    actions: list[ActionJson],
    lost: list[tuple[str, int, str]],
    checkpoint: CheckpointJson | None,
    dry_run: bool,
) -> None:
    """Each sink in a line, what was (or would be) done, what was left, the losses, the
    checkpoint."""
    if out.json_mode:
        return
    if not sinks:
        out.line("no sink has prepared transactions or unfinished decisions in this database")
    for sink in sinks:
        bound = f"bound to query {sink.bound_query}" if sink.bound_query else "not bound to a query"
        live = (
            "live " + ", ".join(describe(r) for r in sink.treated_live)
            if sink.live
            else "no live run"
        )
        out.line(f"sink {sink.sink_id}: {bound}; {live}; {sink.status}")
        if sink.fenced:
            out.line(f"  declared dead (fenced) now: run {', run '.join(sink.fenced)}")
    refused = {s.sink_id for s in sinks if s.status in ("refused", "failed")}
    out.line()
    _print_acted([a for a in actions if a["action"] != "leave"], refused, dry_run, out)
    _print_left([a for a in actions if a["action"] == "leave"], out)
    print_losses(
        out,
        "DATA LOSS: decided transactions that are neither prepared nor committed "
        "(rolled back by someone): their rows are missing",
        lost,
    )
    if checkpoint is not None:
        print_checkpoint(out, checkpoint)


def _print_acted(acted: list[ActionJson], refused: set[str], dry_run: bool, out: Output) -> None:
    if not acted:
        out.line("nothing to commit or roll back")
        return
    rows = [
        [
            j["gid"], j["sink_id"], j["batch_id"], j["partition_id"],
            format_age(j["age_seconds"]), j["owner"], j["action"],
            f"would {j['action']}" if dry_run
            else j["result"] or ("refused" if j["sink_id"] in refused else "not done"),
            j["reason"],
        ]
        for j in acted
    ]  # fmt: skip
    head = ["GID", "SINK", "BATCH", "PART", "AGE", "OWNER", "ACTION", "DONE", "REASON"]
    for text in table(head, rows, right={2, 3, 4}):
        out.line(text)


def _print_left(left: list[ActionJson], out: Output) -> None:
    if not left:
        return
    out.line()
    out.line(
        "left untouched (a live run's, which its own commit finishes; a batch whose "
        "decision was lost, for --commit-lost; a batch Spark may have committed, when no "
        "checkpoint was read; not provably the recovered sinks'; or in another database):"
    )
    rows = [
        [j["gid"], j["database"], j["owner"], format_age(j["age_seconds"]), j["reason"]]
        for j in left
    ]
    for text in table(["GID", "DATABASE", "OWNER", "AGE", "REASON"], rows, right={3}):
        out.line(text)


def print_result(
    out: Output, sinks: list[SinkRecovery], actions: list[ActionJson], dry_run: bool, code: int
) -> None:
    """The last line: the counts, and what the exit code means."""
    results = [a["result"] for a in actions]  # what was done, even when a sink then failed
    committed, rolled = results.count("committed"), results.count("rolled back")
    already = sum(len(s.report.already_committed) for s in sinks if s.report)
    completed = [
        f"{s.sink_id}: {', '.join(map(str, sorted(s.report.completed_batches)))}"
        for s in sinks
        if s.report and s.report.completed_batches
    ]
    out.line()
    kinds = [a["action"] for a in actions]
    text = f"result: {committed} committed, {rolled} rolled back"
    if dry_run:
        text = (
            f"plan: {kinds.count('commit')} to commit, {kinds.count('rollback')} to roll back, "
            f"{kinds.count('leave')} left untouched"
        )
    if already:
        text += f", {already} found already committed"
    if completed:
        text += f"; batches completed: {'; '.join(completed)}"
    meaning = {
        0: "all resolved",
        1: "something is left to do (see above)",
        2: "errors (see above)",
        3: "DATA LOSS",
    }
    out.line(f"{text}. exit {code}: {meaning[code]}")
