"""``sqlsink status``: the commit log, open prepared transactions, warnings. Read-only.

Every prepared transaction of the cluster is sorted into a sink's of this database, or
another's (not a sqlsink gid, another database, another sink than ``--sink-id``). Each
sink is then surveyed (``StatusScan.sink``); ``status_report`` prints the result.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from datetime import datetime

from sqlsink.cli.connect import checks_recorded, identify, open_connection, require_schema
from sqlsink.cli.contract import (
    CheckpointCheckJson,
    Envelope,
    HiddenBatchJson,
    PreparedJson,
    StatusDocument,
    StatusSinkJson,
)
from sqlsink.cli.loss import LOSS_FIX, confirmed_losses, loss_json, loss_message, print_losses
from sqlsink.cli.output import (
    Notice,
    Output,
    exit_code,
    format_age,
    format_time,
    header,
    print_warnings,
    session_json,
)
from sqlsink.cli.runs import (
    NEWEST_SHOWN,
    describe,
    end_json,
    prepared_by_run,
    run_json,
    shown_runs,
    stranded_reason,
)
from sqlsink.cli.status_json import (
    last_batch_json,
    old_others_warning,
    others_json,
    recent_json,
    sink_names,
    sort_prepared,
    view_json,
)
from sqlsink.cli.status_report import SinkStatus, print_others, print_status
from sqlsink.cli.status_state import failed_notice, in_doubt_notice, leftover_notice, verdict
from sqlsink.core.admin import AdminSession, ConsistentView, DecisionRow, Session, SinkRow
from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.committer import Committer
from sqlsink.core.gid import Gid
from sqlsink.core.model import PreparedTransaction
from sqlsink.core.resolution import Scope


@dataclass
class StatusScan:
    """What every sink's survey needs; the warnings found so far."""

    conn: AdminSession
    backend: TwoPhaseBackend
    out: Output
    now: datetime
    max_age: float
    batches: int  # how many recent batches per sink
    sessions: list[Session]  # every sqlsink session of the database
    warnings: list[Notice] = field(default_factory=list)
    views: list[ConsistentView] = field(default_factory=list)  # every consistent view

    def sink(
        self,
        sink_id: str,
        row: SinkRow | None,
        prepared: list[tuple[PreparedTransaction, Gid]],
    ) -> SinkStatus:
        """One sink: its commit log, its runs, its open gids, data loss; warnings."""
        conn = self.conn
        summary = conn.batch_summary(sink_id)
        recent = conn.recent_decisions(sink_id, self.batches)  # --batches >= 1
        incomplete = conn.incomplete_decisions(sink_id)
        live_sessions = conn.sink_sessions(self.sessions, sink_id)
        holders = conn.lock_holders(sink_id)
        runs = conn.runs(sink_id)
        # data loss: the core's own list of decided gids to verify, read-only, confirmed twice
        lost = confirmed_losses(conn, Committer(self.backend, sink_id).plan(Scope.everything()))
        by_run = {r.run_id: r for r in runs}
        stranded = {txn.gid: why for txn, gid in prepared if (why := stranded_reason(gid, by_run))}
        prepared_docs = self._prepared_json(sink_id, prepared, stranded)
        self._warn(sink_id, prepared_docs, incomplete, lost)
        self._warn_stranded(sink_id, prepared_docs, stranded)
        check = self._checkpoint_check(sink_id)
        views = [v for v in self.views if v.sink_id == sink_id]
        hidden = self._hidden(sink_id, prepared, bool(views))
        counts = prepared_by_run(gid for _, gid in prepared)
        live_runs = [r for r in runs if r.live]
        ends = conn.run_ends(sink_id)
        connected = len(live_sessions) + len(holders)
        if incomplete and connected:  # self.sessions predates the decisions: read again
            fresh = conn.sink_sessions(conn.sqlsink_sessions(), sink_id)
            connected = len(fresh) + len(holders)
        found = verdict(runs, ends, prepared_docs, incomplete, connected, self.now)
        if found.in_doubt is not None:  # the sessions again, read after the decisions
            again = conn.incomplete_decisions(sink_id)
            now_connected = conn.sink_sessions(conn.sqlsink_sessions(), sink_id)
            found = verdict(runs, ends, prepared_docs, again, len(now_connected), self.now)
        if found.in_doubt is not None:
            run = by_run[found.in_doubt["run_id"]]
            self.warnings.append(
                in_doubt_notice(self.out, sink_id, found.in_doubt, run, prepared_docs, found.ended)
            )
        if found.state == "failed" and found.ended is not None:  # not all well
            self.warnings.append(failed_notice(self.out, sink_id, found.ended))
        if found.ended is not None and (
            left := leftover_notice(
                self.out,
                sink_id,
                found.ended,
                by_run.get(found.ended["run_id"]),
                prepared_docs,
                self.now,
                self.conn.terms(),
            )
        ):
            self.warnings.append(left)
        never_wrote = not (
            summary.decisions or incomplete or prepared or live_runs or live_sessions
        ) and not (holders or hidden or lost or check)
        doc: StatusSinkJson = {
            "sink_id": sink_id,
            "bound_query_id": row.query_id if row else None,
            "tables": self.conn.sink_tables(sink_id),
            "bound_at": row.bound_at if row else None,
            "decisions": summary.decisions,
            "last_decided_batch": summary.last_decided,
            "last_complete_batch": summary.last_complete,
            "incomplete_batches": [d.batch_id for d in incomplete],
            "recent_batches": [recent_json(d) for d in recent],
            "last_batch": last_batch_json(
                recent[0] if recent else None, self.conn.terms().commit_statement
            ),
            "prepared": prepared_docs,
            "live": bool(live_runs),
            "sessions": [session_json(s) for s in live_sessions],
            "lock_holders": [session_json(s) for s in holders],
            "runs": [
                run_json(
                    r, counts.get(r.run_id, 0), end_json(e) if (e := ends.get(r.run_id)) else None
                )
                for r in shown_runs(runs, counts, NEWEST_SHOWN)
            ],
            "checkpoint_check": check,
            "consistent_views": [view_json(v) for v in views],
            "hidden_batches": hidden,
            "never_wrote": never_wrote,
            "state": found.state,
            "ended": found.ended,
            "in_doubt": found.in_doubt,
        }
        evidence = [f"lock held by {s.describe()}" for s in holders]
        evidence += [s.describe() for s in live_sessions if s.pid not in {h.pid for h in holders}]
        return SinkStatus(doc, lost, [describe(r) for r in live_runs], evidence)

    def _checkpoint_check(self, sink_id: str) -> CheckpointCheckJson | None:
        """The newest run's checkpoint check (schema 4 on); a loss is an error, an
        unverified checkpoint a warning (docs/DESIGN.md invariant 9)."""
        if not checks_recorded(self.conn):
            return None
        checks = [c for c in self.conn.checkpoint_checks(sink_id, 1) if c.newest]
        if not checks:
            return None
        c = checks[0]
        where = f"checkpoint {c.location or '(none given)'}, checked by run {c.run_id}" + (
            f" at batch {c.batch_id}" if c.batch_id is not None else ""
        )
        if c.verdict == "loss":
            batches = ", ".join(str(b) for b in c.lost)
            self.warnings.append(
                Notice(
                    "error",
                    f"DATA LOSS: Spark's {where} records batch(es) {batches} as committed, "
                    "but this database has no decision for them (a failover or a restore "
                    f"set it back): their rows are not in the table. {c.detail}".strip(),
                    "re-deliver those batches (README, 'Data loss'), or accept the loss: "
                    f"sqlsink recover --sink-id {sink_id}, then sqlsink forget --sink-id "
                    f"{sink_id}",
                    sink_id,
                )
            )
        elif c.verdict == "unverified":
            self.warnings.append(
                Notice(
                    "warning",
                    f"the {where} could not be compared with the commit log: {c.detail}",
                    "make the checkpoint readable by the driver's Python (local, file:, or a "
                    "pyarrow.fs filesystem); checkpointCheck=require makes this an error",
                    sink_id,
                )
            )
        return {
            "run_id": c.run_id,
            "verdict": c.verdict,
            "detail": c.detail,
            "lost": list(c.lost),
            "location": c.location,
            "batch_id": c.batch_id,
            "checked_at": c.checked_at,
        }

    def _hidden(
        self, sink_id: str, prepared: list[tuple[PreparedTransaction, Gid]], has_view: bool
    ) -> list[HiddenBatchJson]:
        """The sink's batches committed in part (invariant 13): what its consistent views
        hide now, and what a reader of the bare table sees as part of a batch."""
        found = self.conn.hidden_batches(sink_id)
        if not found:
            return []
        pairs = [(sink_id, h.batch_id) for h in found]
        named = {b: d.gids for (_, b), d in self.backend.decisions(sink_id, pairs).items()}
        open_gids = {txn.gid for txn, _ in prepared}
        docs: list[HiddenBatchJson] = []
        for h in found:
            waiting = len(named.get(h.batch_id, frozenset()) & open_gids)
            if h.complete:
                reason = (
                    "the batch is complete, but its markers were kept (the sink's role may not "
                    "DELETE FROM sqlsink.markers): GRANT DELETE ON sqlsink.markers to it; its "
                    "next commit deletes them"
                )
                if has_view:
                    self.warnings.append(
                        Notice(
                            "warning",
                            f"the consistent view of sink {sink_id} hides batch {h.batch_id}, "
                            "which is complete: its markers were kept",
                            "GRANT DELETE ON sqlsink.markers TO the sink's role (the next "
                            "commit deletes them); or DELETE FROM sqlsink.markers WHERE "
                            f"sink_id = '{sink_id}' AND batch_id = {h.batch_id}",
                            sink_id,
                        )
                    )
            elif waiting:
                reason = (
                    f"{waiting} partition(s) still prepared: shown once they are committed "
                    "(by the query's commit, its next run, or sqlsink recover)"
                )
            else:
                reason = (
                    "its other partitions are neither prepared nor committed: its commit is "
                    "finishing right now, or they were rolled back (see data loss)"
                )
            docs.append(
                {
                    "batch_id": h.batch_id,
                    "partitions_hidden": h.partitions,
                    "rows_hidden": h.rows,
                    "partitions": h.of_partitions,
                    "prepared": waiting,
                    "reason": reason,
                }
            )
        return docs

    def _prepared_json(
        self,
        sink_id: str,
        prepared: list[tuple[PreparedTransaction, Gid]],
        stranded: dict[str, str],
    ) -> list[PreparedJson]:
        """The sink's open gids, by batch and partition; decided: its decision names it."""
        batches = {(sink_id, gid.batch_id) for _, gid in prepared}
        decisions = self.backend.decisions(sink_id, batches).values()
        decided_gids = {g for d in decisions for g in d.gids}
        ordered = sorted(prepared, key=lambda p: (p[1].batch_id, p[1].partition_id, p[0].gid))
        return [
            {
                "gid": txn.gid,
                "batch_id": gid.batch_id,
                "partition_id": gid.partition_id,
                "run_id": gid.run_id,
                "database": txn.database,
                "owner": txn.owner,
                "prepared_at": txn.prepared_at,
                "age_seconds": round((self.now - txn.prepared_at).total_seconds(), 3),
                "decided": txn.gid in decided_gids,
                "stranded": txn.gid in stranded,
            }
            for txn, gid in ordered
        ]

    def _warn(
        self,
        sink_id: str,
        prepared: list[PreparedJson],
        incomplete: list[DecisionRow],
        lost: list[tuple[int, str]],
    ) -> None:
        """Old prepared gids, decisions left incomplete, data loss."""
        fix_cmd = (
            f"sqlsink recover --url {self.out.paste_url} --sink-id {sink_id}{self.out.paste_note}"
        )
        age = format_age(self.max_age)
        # the stranded ones have a warning of their own (_warn_stranded)
        old = [p for p in prepared if p["age_seconds"] > self.max_age and not p["stranded"]]
        if old:
            oldest = max(old, key=lambda p: p["age_seconds"])
            message = (
                f"{len(old)} prepared transaction(s) older than {age} "
                f"(oldest: {oldest['gid']}, batch {oldest['batch_id']}, "
                f"{format_age(oldest['age_seconds'])}): "
                f"a prepared transaction {self.conn.terms().prepared_cost} until it is finished"
            )
            fix = (
                f"{fix_cmd}  (a running query resolves them at its next batch; if it is stopped "
                "or stuck, recover does)"
            )
            self.warnings.append(Notice("warning", message, fix, sink_id))
        lost_batches = {b for b, _ in lost}
        stale = [
            d
            for d in incomplete
            if (self.now - d.decided_at).total_seconds() > self.max_age
            and d.batch_id not in lost_batches
        ]
        if stale:
            batches = ", ".join(str(d.batch_id) for d in stale[:10])
            message = (
                f"{len(stale)} decided batch(es) not complete after {age} (batch {batches}): "
                "some of their transactions are still prepared, or unverified"
            )
            self.warnings.append(Notice("warning", message, fix_cmd, sink_id))
        if lost:
            self.warnings.append(Notice("error", loss_message(lost), LOSS_FIX, sink_id))

    def _warn_stranded(
        self, sink_id: str, prepared: list[PreparedJson], stranded: dict[str, str]
    ) -> None:
        """Issue 12 item 16: prepared transactions whose run is not live (dead, fenced,
        over, unknown) are finished by nobody until the query runs again, and a retired
        query never does: say so, whatever their age, with the command."""
        mine = [p for p in prepared if p["stranded"]]
        if not mine:
            return
        url = self.out.paste_url
        reasons = sorted({stranded[p["gid"]] for p in mine})
        oldest = max(mine, key=lambda p: p["age_seconds"])
        more = f" and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        shown = "; ".join(reasons[:3]) + more
        if one_off_load(sink_id, [p["run_id"] for p in mine]):
            message = (
                f"{len(mine)} prepared transaction(s) of a one-off batch load (a load without "
                f"sinkId, sink id {sink_id}), whose driver stopped before its commit or abort "
                f"({shown}; oldest: {oldest['gid']}, {format_age(oldest['age_seconds'])}): no "
                "later run of this sink id will ever exist, so nothing but sqlsink recover "
                f"finishes them, and meanwhile each {self.conn.terms().prepared_cost}"
            )
            fix = (
                f"sqlsink recover --url {url} --sink-id {sink_id}  (commits them if the load's "
                "batch was decided, else rolls them back: then run the load again)"
                f"{self.out.paste_note}"
            )
            self.warnings.append(Notice("warning", message, fix, sink_id))
            return
        message = (
            f"{len(mine)} prepared transaction(s) have no live run to finish them ({shown}; "
            f"oldest: {oldest['gid']}, batch {oldest['batch_id']}, "
            f"{format_age(oldest['age_seconds'])}): nothing resolves them until the query "
            "runs again (a retired query never does), and meanwhile each "
            f"{self.conn.terms().prepared_cost}"
        )
        fix = (
            f"sqlsink recover --url {url} --sink-id {sink_id}  (a query retired for good: "
            f"then sqlsink forget --url {url} --sink-id {sink_id}){self.out.paste_note}"
        )
        self.warnings.append(Notice("warning", message, fix, sink_id))


def one_off_load(sink_id: str, run_ids: list[str]) -> bool:
    """Whether the sink is a one-off batch load's: format('sqlsink') without sinkId names
    it ``load-`` and the first 16 characters of its run id (spark/datasource.py)."""
    suffix = sink_id.removeprefix("load-")
    return len(suffix) == 16 and suffix != sink_id and any(r[:16] == suffix for r in run_ids)


# -- the command --------------------------------------------------------------------------


def start(args: argparse.Namespace, envelope: Envelope) -> StatusDocument:
    return {
        **envelope,
        "server_time": None,
        "max_age_seconds": args.max_age,
        "sinks": [],
        "other_prepared": [],
        "data_loss": [],
    }


def run(args: argparse.Namespace, out: Output, doc: StatusDocument) -> int:
    with open_connection(args.url, "status", args.password_command) as conn:
        me = identify(conn, doc)
        require_schema(conn, me)
        backend = conn.two_phase()
        now = conn.server_now()
        doc["server_time"] = now
        rows = conn.sinks()
        prepared = conn.all_prepared()
        incomplete = conn.incomplete_decisions(args.sink_id)
        ours, others = sort_prepared(prepared, me.database, args.sink_id)
        names = sink_names(rows, ours, incomplete, args.sink_id, me.database)
        sessions = conn.sqlsink_sessions()
        scan = StatusScan(conn, backend, out, now, args.max_age, args.batches, sessions)
        scan.views = conn.consistent_views()
        header(out, "status", me, f", server time {format_time(now)}")
        sinks = [scan.sink(name, rows.get(name), ours.get(name, [])) for name in sorted(names)]
        print_status(
            out,
            sinks,
            detailed=args.sink_id is not None,
            commit_statement=conn.terms().commit_statement,
        )
        other_docs = others_json(others, now)
        old = old_others_warning(other_docs, args.max_age, me.database, conn.terms())
        if old is not None and args.sink_id is None:
            scan.warnings.append(old)
        print_others(out, other_docs)
        lost = [(s.doc["sink_id"], b, g) for s in sinks for b, g in s.lost]
        heading = "DATA LOSS: decided transactions that are neither prepared nor committed:"
        print_losses(out, heading, lost)
        print_warnings(out, scan.warnings)
        doc["sinks"] = [sink.doc for sink in sinks]
        doc["other_prepared"] = other_docs
        doc["data_loss"] = [loss_json(s, b, g) for s, b, g in lost]
        doc["warnings"] = [w.as_json() for w in scan.warnings]
        checkpoint_loss = any(
            (c := s.doc["checkpoint_check"]) is not None and c["verdict"] == "loss" for s in sinks
        )
        code = exit_code(scan.warnings, lost=bool(lost) or checkpoint_loss)
        if not out.json_mode:
            out.line()
            meaning = {0: "all well", 1: "warnings (see above)", 3: "DATA LOSS"}
            out.line(f"exit {code}: {meaning.get(code, '')}")
        return code
