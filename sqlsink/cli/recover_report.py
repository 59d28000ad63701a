"""What ``sqlsink recover`` found and did, per sink, and how it is reported.

``SinkRecovery`` is the record of one sink; the functions below turn the records into
the JSON document (``sqlsink.cli.contract``) and the warnings; ``recover_print`` prints
the human report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from sqlsink.cli.contract import (
    ActionJson,
    ActionResult,
    NoticeLevel,
    RecoverSinkJson,
    RecoverStatus,
)
from sqlsink.cli.loss import LOSS_FIX, loss_message
from sqlsink.cli.output import (
    EXIT_OK,
    EXIT_WARN,
    Notice,
    Output,
    end_holders,
    exit_code,
    format_age,
    lock_held_fix,
    session_json,
)
from sqlsink.cli.recover_lost import lost_notice
from sqlsink.cli.runs import describe, end_json, prepared_by_run, run_json, timeout_text
from sqlsink.core.admin import AdminSession, RunEnd, RunInfo, ServerTerms, Session
from sqlsink.core.lost import LostBatch
from sqlsink.core.model import ResolutionReport
from sqlsink.core.resolution import (
    Action,
    Plan,
    PlannedAction,
    Scope,
    Why,
    plan_resolution,
    sentence,
)


@dataclass
class SinkRecovery:
    """One sink of a ``recover`` run: its runs, its lock, its plan and what was done."""

    sink_id: str
    bound_query: str | None
    locked: bool = False  # this session holds the sink's lock now
    lock_busy: bool = False  # another session held it when we tried
    holders: list[Session] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)  # evidence only
    runs: list[RunInfo] = field(default_factory=list)  # the registry, newest first
    ends: dict[str, RunEnd] = field(default_factory=dict)  # runs' ends their drivers recorded
    treated_live: list[RunInfo] = field(default_factory=list)  # their gids are left
    fenced: list[str] = field(default_factory=list)  # declared dead by this command
    named: list[str] = field(default_factory=list)  # --run-id, for this sink
    ended: list[int] = field(default_factory=list)  # sessions of fenced runs ended
    status: RecoverStatus = "planned"
    message: str | None = None
    plan: Plan | None = None
    report: ResolutionReport | None = None
    lost: list[tuple[int, str]] = field(default_factory=list)
    # batches Spark went past without a decision: their transactions are left prepared
    lost_decisions: list[LostBatch] = field(default_factory=list)
    decided_batches: list[int] = field(default_factory=list)  # --commit-lost, --mark-skipped
    scope: Scope | None = None  # the scope of the last plan
    checkpoint_read: str | None = None  # the checkpoint read (given, or the one recorded)
    unread: str | None = None  # why no checkpoint of a streaming sink's query was read
    session_word: str = "pid"  # what the database calls a session's number (Output's)
    asked: str = ""  # --commit-lost/--mark-skipped as given: a refusal's fix repeats them

    def undecided_kept(self) -> dict[int, list[str]]:
        """Undecided gids left because no checkpoint was read (``Scope.unsure``), by batch."""
        kept: dict[int, list[str]] = {}
        if self.plan is None or self.scope is None:
            return kept
        for a in self.plan.actions:
            if a.why is Why.UNSURE and a.gid is not None:
                kept.setdefault(a.gid.batch_id, []).append(a.prepared.gid)
        return {b: sorted(g) for b, g in sorted(kept.items())}

    @property
    def live(self) -> bool:
        """A run of the sink is live (the runs registry; sessions are evidence only)."""
        return bool(self.treated_live)

    def evidence(self) -> str:
        parts = []
        if self.holders:
            parts.append("its lock is held by " + ", ".join(map(self._named, self.holders)))
        holders = {s.pid for s in self.holders}
        sessions = [s for s in self.sessions if s.pid not in holders]
        if sessions:
            parts.append("connected: " + ", ".join(map(self._named, sessions[:5])))
            if len(sessions) > 5:
                parts[-1] += f" and {len(sessions) - 5} more"
        return "; ".join(parts) or "its lock is held by another session"

    def _named(self, session: Session) -> str:
        """A session in its database's words: 'connection N' on MariaDB/MySQL."""
        said = session.describe()
        if self.session_word != "pid":
            said = f"{self.session_word} {said.removeprefix('pid ')}"
        return said

    def to_do(self) -> list[PlannedAction]:
        return [a for a in (self.plan.actions if self.plan else []) if a.action is not Action.LEAVE]

    def prepared(self) -> Counter[str]:
        """Prepared transactions of the sink in this database when recover looked, by run."""
        return prepared_by_run(
            a.gid
            for a in (self.plan.actions if self.plan else [])
            if a.gid is not None and a.gid.sink_id == self.sink_id and not _elsewhere(a)
        )

    def left_for(self, run: RunInfo) -> int:
        """How many of the run's undecided transactions were left because it is live."""
        return sum(
            1
            for a in (self.plan.actions if self.plan else [])
            if a.action is Action.LEAVE and a.gid is not None and a.gid.run_id == run.run_id
            and a.gid.sink_id == self.sink_id and not _elsewhere(a)
        )  # fmt: skip

    def shown_runs(self) -> list[RunInfo]:
        """Live runs, runs with prepared transactions, runs fenced now or named."""
        prepared = self.prepared()
        return [
            r
            for r in self.runs
            if r.live or prepared.get(r.run_id) or r.run_id in self.fenced or r.run_id in self.named
            or r in self.treated_live
        ]  # fmt: skip


def _elsewhere(action: PlannedAction) -> bool:
    return action.why is Why.OTHER_DATABASE


# -- the actions --------------------------------------------------------------------------


def all_actions(
    conn: AdminSession,
    sinks: list[SinkRecovery],
    finished: Mapping[str, ActionResult],
    database: str,
    sink_id: str | None,
    now: datetime,
) -> list[ActionJson]:
    """Every prepared transaction seen: the sinks' plans, then everybody else's (leave)."""
    seen: dict[str, PlannedAction] = {}
    for sink in sinks:
        for action in sink.plan.actions if sink.plan else []:
            if action.prepared.gid not in seen or action.action is not Action.LEAVE:
                seen[action.prepared.gid] = action
    rest = [t for t in conn.all_prepared() if t.gid not in seen]
    # the others: labelled by the same rule, which leaves whatever is not the sink's
    others = plan_resolution(rest, {}, database=database, sink_id=sink_id, scope=Scope.everything())
    for action in others.actions:
        if action.action is not Action.LEAVE:  # a sink's gid that appeared after the listing
            why, txn = Why.LATE, action.prepared
            reason = sentence(why, txn, action.gid, Scope.everything())
            action = PlannedAction(txn, action.gid, Action.LEAVE, why, reason)
        seen[action.prepared.gid] = action
    rows = [action_json(a, finished.get(a.prepared.gid), now) for a in seen.values()]
    rows.sort(
        key=lambda j: (
            j["action"] == "leave", j["sink_id"] or "", j["batch_id"] or 0,
            j["partition_id"] or 0, j["gid"],
        )
    )  # fmt: skip
    return rows


def action_json(action: PlannedAction, result: ActionResult | None, now: datetime) -> ActionJson:
    txn, gid = action.prepared, action.gid
    acts = action.action is not Action.LEAVE
    return {
        "gid": txn.gid,
        "sink_id": gid.sink_id if gid else None,
        "batch_id": gid.batch_id if gid else None,
        "partition_id": gid.partition_id if gid else None,
        "run_id": gid.run_id if gid else None,
        "database": txn.database,
        "owner": txn.owner,
        "prepared_at": txn.prepared_at,
        "age_seconds": round((now - txn.prepared_at).total_seconds(), 3),
        "action": action.action.value,
        "reason": action.reason,
        "why": action.why.value,
        "done": acts and result in ("committed", "rolled back"),
        "result": result if acts else None,
    }


# -- warnings and the document ------------------------------------------------------------


def sink_warnings(
    sink: SinkRecovery, dry_run: bool, out: Output, terms: ServerTerms
) -> list[Notice]:
    """A refusal, a failure, the live runs left alone, the runs fenced, what a dry run
    leaves to do, a data loss."""
    warnings: list[Notice] = []
    fix_cmd = f"sqlsink recover --url {out.paste_url} --sink-id {sink.sink_id}{out.paste_note}"
    if sink.status == "refused":
        runs = " ".join(f"--run-id {r.run_id}" for r in sink.treated_live) or "--run-id RUN"
        fix = lock_held_fix(
            "recover" + sink.asked,
            end_holders(terms.end_session, [s.pid for s in sink.holders]),
            f"if its run is dead, declare it so: {fix_cmd}{sink.asked} --force {runs} (this "
            "also ends its session when the run recorded it); or ",
        )
        warnings.append(Notice("warning", sink.message or "refused", fix, sink.sink_id))
    elif sink.status == "failed":
        warnings.append(Notice("error", sink.message or "failed", None, sink.sink_id))
    elif dry_run and sink.to_do() and not sink.lost:
        n = len(sink.to_do())
        message = f"{n} prepared transaction(s) to finish"
        warnings.append(Notice("info", message, f"run: {fix_cmd}", sink.sink_id))
    warnings += [lost_notice(sink.sink_id, lost, out, dry_run) for lost in sink.lost_decisions]
    warnings += [
        _undecided_notice(sink, batch, gids, dry_run)
        for batch, gids in sink.undecided_kept().items()
    ]
    if sink.status != "refused":
        warnings += [_live_run_notice(sink, run, dry_run, fix_cmd) for run in sink.treated_live]
    warnings += _fenced_notices(sink, dry_run)
    if sink.lost:  # the committer's own message when it raised the loss
        said = sink.message if sink.status == "data loss" else None
        warnings.append(Notice("error", said or loss_message(sink.lost), LOSS_FIX, sink.sink_id))
    return warnings


def _live_run_notice(sink: SinkRecovery, run: RunInfo, dry_run: bool, fix_cmd: str) -> Notice:
    """Which run was treated as live, and what to do about it."""
    left = sink.left_for(run)
    heard = f"heard from {format_age(run.heartbeat_age_s)} ago"
    live = f"run {run.run_id} is live ({heard}; live while heard from within {timeout_text(run)})"
    if not left:
        finished = [a for a in sink.to_do() if a.gid is not None and a.gid.run_id == run.run_id]
        if not finished:
            return Notice("info", f"{live}: nothing of it is prepared", None, sink.sink_id)
        done = {a.action for a in finished}
        what = (
            "committed"
            if done == {Action.COMMIT}
            else "rolled back"
            if done == {Action.ROLLBACK}
            else "committed or rolled back, as their batches' decisions say"
        )
        message = (
            f"{live}: its {len(finished)} prepared transaction(s) of decided batches "
            f"{'would be' if dry_run else 'were'} {what} by this recover; none is left for "
            "its own commit"
        )
        return Notice("info", message, None, sink.sink_id)
    verb = "would be" if dry_run else "were"
    message = (
        f"{live}: its {left} undecided prepared transaction(s) {verb} left for its own "
        "commit (recover never rolls back a live run's transactions)"
    )
    fix = (
        "nothing to do while the query runs: it finishes them at its next commit. If the "
        "query is stopped or its driver is gone: run recover again once the run's heartbeat "
        f"is older than {format_age(run.timeout_s)}, or declare the run dead now: {fix_cmd} "
        f"--force --run-id {run.run_id} (see sqlsink recover --help)"
    )
    return Notice("warning", message, fix, sink.sink_id)


def _fenced_notices(sink: SinkRecovery, dry_run: bool) -> list[Notice]:
    notices = []
    if dry_run and sink.named:
        notices.append(
            Notice(
                "info",
                f"--force would declare run(s) {', '.join(sink.named)} dead (fence them); "
                "the plan above treats them as dead",
                None,
                sink.sink_id,
            )
        )
    if sink.fenced:
        pids = ", ".join(map(str, sink.ended))
        ended = f"; ended their session(s) pid {pids}" if sink.ended else ""
        notices.append(
            Notice(
                "info",
                f"declared run(s) {', '.join(sink.fenced)} dead (fenced: superseded by "
                "'operator' in sqlsink.runs): they can never decide, commit or resolve again, "
                f"and a task of theirs that prepares later rolls itself back{ended}",
                "if that query still runs, it fails at its next batch (FencedError): restart "
                "it from its checkpoint (a new run; nothing decided is lost)",
                sink.sink_id,
            )
        )
    elif sink.ended:
        notices.append(
            Notice(
                "info",
                f"ended session(s) pid {', '.join(map(str, sink.ended))} of fenced runs that "
                "held the sink's lock (paused or cut-off drivers)",
                None,
                sink.sink_id,
            )
        )
    for run in sink.runs:
        if run.run_id in sink.named and run.run_id not in sink.fenced and not dry_run:
            notices.append(Notice("info", f"{describe(run)}: already fenced", None, sink.sink_id))
    return notices


def unknown_sink_warning(sink_id: str, database: str) -> Notice:
    return Notice(
        "warning",
        f"sink {sink_id} is unknown in database {database}: no commit log rows and "
        "no prepared transactions",
        "check --sink-id (the sinkId option, else the query id) and that --url names "
        "the sink's database",
        sink_id,
    )


def foreign_warnings(actions: list[ActionJson], sink_id: str | None, database: str) -> list[Notice]:
    """The sink's gids in other databases: said, because they need a recover there."""
    elsewhere: dict[str, int] = {}
    for a in actions:
        ours = a["sink_id"] is not None and (sink_id is None or a["sink_id"] == sink_id)
        if ours and a["database"] != database:
            elsewhere[a["database"]] = elsewhere.get(a["database"], 0) + 1
    level: NoticeLevel = "warning" if sink_id is not None else "info"
    who = f"sink {sink_id}" if sink_id else "sqlsink"
    return [
        Notice(
            level,
            f"{count} prepared transaction(s) of {who} are in database {other}, not in "
            f"{database}: left untouched (a prepared transaction can only be finished "
            "from its own database)",
            f"run recover with --url naming database {other}",
            sink_id,
        )
        for other, count in sorted(elsewhere.items())
    ]


def sink_json(sink: SinkRecovery, actions: list[ActionJson]) -> RecoverSinkJson:
    report = sink.report or ResolutionReport()
    results = [a["result"] for a in actions if a["sink_id"] == sink.sink_id]
    return {
        "sink_id": sink.sink_id,
        "bound_query_id": sink.bound_query,
        "live": sink.live,
        "lock": "held" if sink.lock_busy else "free",
        "lock_holders": [session_json(s) for s in sink.holders],
        "sessions": [session_json(s) for s in sink.sessions],
        "status": sink.status,
        "message": sink.message,
        "committed": results.count("committed"),
        "rolled_back": results.count("rolled back"),
        "already_committed": len(report.already_committed),
        "completed_batches": sorted(report.completed_batches),
        "runs": [
            run_json(
                r,
                sink.prepared().get(r.run_id, 0),
                end_json(e) if (e := sink.ends.get(r.run_id)) else None,
            )
            for r in sink.shown_runs()
        ],
        "live_runs": [r.run_id for r in sink.treated_live],
        "fenced_runs": list(sink.fenced),
        "ended_sessions": list(sink.ended),
        "decided_batches": list(sink.decided_batches),
        "lost_decision_batches": [b.batch_id for b in sink.lost_decisions],
        "checkpoint_read": sink.checkpoint_read,
        "undecided_kept_batches": list(sink.undecided_kept()),
    }


def _undecided_notice(sink: SinkRecovery, batch: int, gids: list[str], dry_run: bool) -> Notice:
    """Undecided leftovers above the highest decided batch, kept: no checkpoint was read."""
    scope, s = sink.scope, sink.sink_id
    highest = None if scope is None else scope.highest_decided
    verb = "would be" if dry_run else "were"
    return Notice(
        "warning",
        f"batch {batch} has no decision, but its {len(gids)} transaction(s) are still prepared "
        f"({', '.join(gids)}) above the highest decided batch "
        f"({'none' if highest is None else highest}): nothing read here shows whether Spark "
        f"committed it ({sink.unread}), so they may hold the only copy of its rows and {verb} "
        "left prepared",
        f"pass the query's checkpoint: sqlsink recover --sink-id {s} --checkpoint DIR; or "
        f"restart the query (its first task rolls them back if Spark runs batch {batch} "
        f"again, else its commit reports the loss); or, if Spark's checkpoint has no "
        f"commits/{batch}, roll "
        f"them back: sqlsink recover --sink-id {s} --rollback-undecided {batch}",
        s,
    )


def recover_exit_code(
    sinks: list[SinkRecovery],
    actions: list[ActionJson],
    warnings: list[Notice],
    lost: list[tuple[str, int, str]],
) -> int:
    """Loss 3, failure 2; 1 for warnings, a refusal, or an action not done."""
    failed = any(s.status == "failed" for s in sinks)
    code = exit_code(warnings, lost=bool(lost), failed=failed)
    if code == EXIT_OK and (
        any(s.status == "refused" for s in sinks)
        or any(a["action"] != "leave" and a["result"] is None for a in actions)
    ):
        code = EXIT_WARN
    return code
