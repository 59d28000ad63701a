"""``sqlsink recover``: commit or roll back the prepared transactions a sink left behind.

It resolves them with the core's recovery (``sqlsink.core.recovery.Recovery`` on
``PostgresBackend``), the committer's own: the same rule, under the same lock. For each
sink it takes the sink's lock (waiting for a committer to finish) and plans; then it acts
on each sink it holds; the transactions of live runs (the runs registry: heard from
within their timeout, not fenced) are left for their own commit, everything else of the
sink is resolved. ``--force --run-id`` first declares named runs dead (fences them), so
that their transactions are resolved too and they can never commit again. The core's
records say what was done; ``recover_report`` turns them into the report.

A batch whose decision was lost (Spark went past it: its checkpoint, or the commit log's
own record, says so; ``recover_lost``) keeps its prepared transactions: they hold its
rows. ``--commit-lost K`` decides it first, naming them, so that the recovery commits
them; ``--mark-skipped N`` records a batch without rows. With ``--checkpoint``, Spark's
commit log is read before anything is resolved.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Collection
from dataclasses import dataclass, field

from sqlsink.checkpoint.parse import Checkpoint, read_checkpoint
from sqlsink.cli.connect import identify, open_connection, require_schema
from sqlsink.cli.contract import ActionResult, Envelope, RecoverDocument
from sqlsink.cli.loss import confirmed_losses, loss_json
from sqlsink.cli.output import (
    CliError,
    Notice,
    Output,
    header,
    lock_still_held,
    print_warnings,
)
from sqlsink.cli.recover_checkpoint import (
    check_checkpoint_binding,
    known_sinks,
    relate_checkpoint,
    sink_of_checkpoint,
)
from sqlsink.cli.recover_lost import (
    Decider,
    LockHeld,
    RecordedCheckpoint,
    recorded_checkpoint,
    requests,
)
from sqlsink.cli.recover_print import print_recover, print_result
from sqlsink.cli.recover_report import (
    SinkRecovery,
    all_actions,
    foreign_warnings,
    recover_exit_code,
    sink_json,
    sink_warnings,
    unknown_sink_warning,
)
from sqlsink.core.admin import AdminSession, RoleInfo, Session, SinkRow
from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.gid import Gid
from sqlsink.core.lost import Evidence, evidence, recover_scope
from sqlsink.core.recovery import Done, Fenced
from sqlsink.core.recovery import Recovery as SinkProcedure
from sqlsink.core.resolution import Action, Scope, Why

PROGRESS_EVERY = 100


RESULT: dict[Done, ActionResult] = {
    Done.COMMITTED: "committed",
    Done.ROLLED_BACK: "rolled back",
    Done.GONE: "already finished",
}


@dataclass
class Recovery:
    """One run of the command: its flags, its session, and each sink's recovery."""

    conn: AdminSession
    out: Output
    me: RoleInfo
    sink_id: str | None  # --sink-id, or the sink of the checkpoint's query; None: every sink
    dry_run: bool
    force: bool
    run_ids: list[str]  # --run-id: the runs --force declares dead (of sink_id)
    lock_timeout: float
    bound: dict[str, SinkRow]  # every sink of the database, with its query
    checkpoint: Checkpoint | None = None  # --checkpoint (of sink_id)
    decided: list[int] = field(default_factory=list)  # decided by --commit-lost/--mark-skipped
    rollback_undecided: list[int] = field(default_factory=list)  # --rollback-undecided
    ended: list[int] = field(default_factory=list)  # lock holders ended by decide's take
    fenced: list[str] = field(default_factory=list)  # --force's runs, fenced before decide
    recorded: dict[str, RecordedCheckpoint] = field(default_factory=dict)  # read once a sink
    # --commit-lost/--mark-skipped found the lock held past --lock-timeout: the sink refused
    undecided_held: bool = False
    asked: str = ""  # --commit-lost/--mark-skipped as given, for the refusal's fix
    decide_holders: list[Session] = field(default_factory=list)  # the lock's, when waited
    sinks: list[SinkRecovery] = field(default_factory=list)
    warnings: list[Notice] = field(default_factory=list)
    total: int = 0  # prepared transactions to finish, for the progress notes
    done: int = 0  # ... and those finished so far
    finished: dict[str, ActionResult] = field(default_factory=dict)  # what each action did
    backend: TwoPhaseBackend = field(init=False)

    def __post_init__(self) -> None:
        self.backend = self.conn.two_phase()

    def resolve(self) -> None:
        """Survey and plan each sink, then act on those whose lock this session holds."""
        targets = [self.sink_id] if self.sink_id else self._sinks_with_leftovers()
        bound = self.bound
        self.sinks = [SinkRecovery(s, bound[s].query_id if s in bound else None) for s in targets]
        for sink in self.sinks:
            sink.session_word = self.out.session_word
            if sink.sink_id == self.sink_id:
                sink.asked = self.asked
                sink.decided_batches = list(self.decided)
                sink.ended = list(self.ended)
                sink.fenced = list(self.fenced)
        try:
            for sink in self.sinks:
                self._prepare(sink)
            if not self.dry_run:
                self._act()
        finally:
            for sink in self.sinks:
                if sink.locked:
                    SinkProcedure(self.backend, sink.sink_id).release()
                    sink.locked = False

    def _sinks_with_leftovers(self) -> list[str]:
        """Every sink with a prepared gid in this database, or an incomplete decision."""
        found = {d.sink_id for d in self.conn.incomplete_decisions()}
        for txn in self.backend.prepared(None):
            gid = Gid.parse(txn.gid)
            if gid is not None and txn.database == self.backend.database:
                found.add(gid.sink_id)
        return sorted(found)

    # -- before acting: fencing, the lock, the runs, the plan --------------------------------

    def _prepare(self, sink: SinkRecovery) -> None:
        """Fence the named runs (--force), take the sink's lock, read its runs, plan."""
        sink.sessions = self.conn.sink_sessions(self.conn.sqlsink_sessions(), sink.sink_id)
        sink.named = list(self.run_ids) if sink.sink_id == self.sink_id else []
        recovery = SinkProcedure(self.backend, sink.sink_id)
        if self.undecided_held and sink.sink_id == self.sink_id:
            self._refuse_undecided(sink, recovery)
            return
        if self.dry_run:
            self._plan_only(sink, recovery)
            return
        if sink.named and not sink.fenced:  # not fenced already, before decide
            self._fence(sink, recovery)
        if self._take_lock(sink, recovery):
            self._warn_foreign_owners(sink)

    def decide(self, commit_lost: list[int], mark_skipped: list[int]) -> list[str]:
        """--commit-lost and --mark-skipped: the decisions, written (or, in a dry run, only
        checked) under the sink's lock, before anything is resolved."""
        assert self.sink_id is not None
        if self.run_ids and not self.dry_run:
            # --force first: the named runs' lock holders are then provably fenced, so
            # the decision's take of the lock ends them instead of waiting for them
            fenced = self._declare_dead(
                SinkProcedure(self.backend, self.sink_id), self.sink_id, self.run_ids
            )
            self.fenced = list(fenced.runs)
            self.ended += [pid for pid in fenced.ended if pid not in self.ended]
        row = self.bound.get(self.sink_id)
        query = row.query_id if row else None
        if query is None and self.checkpoint is not None:  # not bound yet (a load is refused)
            query = self.checkpoint.query_id
        decider = Decider(
            self.backend,
            self.sink_id,
            query,
            self.me,
            self._evidence(self.sink_id),
            terms=self.conn.terms(),
        )
        self.asked = "".join(f" --commit-lost {b}" for b in sorted(set(commit_lost)))
        self.asked += "".join(f" --mark-skipped {b}" for b in sorted(set(mark_skipped)))

        def waiting() -> None:
            self.decide_holders = self.conn.lock_holders(self.sink_id or "")
            self.out.note(
                f"sqlsink recover: sink {self.sink_id}: waiting up to {self.lock_timeout:g}s "
                "for the sink's lock, to decide the batches named"
            )

        try:
            done = decider.run(
                requests(commit_lost, mark_skipped),
                self.lock_timeout,
                dry_run=self.dry_run,
                waiting=waiting,
            )
        except LockHeld:  # refused as a held lock is (exit 1): resolve reports it
            self.undecided_held = True
            return []
        finally:
            self.ended += [pid for pid in decider.ended if pid not in self.ended]
        if not self.dry_run:
            self.decided = sorted(set(commit_lost) | set(mark_skipped))
        return done

    def _evidence(self, sink_id: str) -> Evidence:
        """What shows that Spark went past a batch of this sink (``recover_lost``): the
        checkpoint given, else the one the sink's query recorded when it is readable here."""
        if self.checkpoint is not None and sink_id == self.sink_id:
            return evidence(self.conn, sink_id, self.checkpoint)
        recorded = self._recorded(sink_id)
        return evidence(
            self.conn, sink_id, recorded.checkpoint, from_record=recorded.checkpoint is not None
        )

    def _recorded(self, sink_id: str) -> RecordedCheckpoint:
        if sink_id not in self.recorded:
            row = self.bound.get(sink_id)
            query = row.query_id if row else None
            self.recorded[sink_id] = recorded_checkpoint(self.conn, sink_id, query)
        return self.recorded[sink_id]

    def _scope(self, sink: SinkRecovery, live: frozenset[str] | None = None) -> Scope:
        """Everything but the live runs' transactions (None: the registry's now), those
        of batches whose decision was lost (read again under the lock before acting), and,
        when no checkpoint of a streaming sink's query was read, those of undecided batches
        above the highest decided one (Spark may have committed them), but the batches
        named by --rollback-undecided."""
        proof = self._evidence(sink.sink_id)
        sink.checkpoint_read = None if proof.checkpoint is None else str(proof.checkpoint.path)
        named = set(self.rollback_undecided) if sink.sink_id == self.sink_id else set()
        found = recover_scope(  # core/lost.py: the scope; what is printed stays here
            self.backend,
            sink.sink_id,
            proof,
            streaming=sink.bound_query is not None,
            live=live,
            aborted={r.run_id: r.aborted_batch for r in sink.runs},
            rollback_undecided=frozenset(named),
            forced=frozenset(sink.named),
        )
        sink.lost_decisions = found.lost
        if found.unsure_kept:
            sink.unread = self._recorded(sink.sink_id).why_unread()
        sink.scope = found.scope
        return sink.scope

    def check_rollback_undecided(self) -> None:
        """--rollback-undecided K: refused when anything read shows that Spark committed K
        (its transactions then hold the only copy of its rows)."""
        if not self.rollback_undecided:
            return
        assert self.sink_id is not None
        proof = self._evidence(self.sink_id)
        for batch in sorted(set(self.rollback_undecided)):
            why = proof.why(batch)
            if why is None:
                continue
            checkpoint = proof.checkpoint
            if checkpoint is not None:
                why = (
                    f"Spark's checkpoint {checkpoint.path} records batch {batch} as committed "
                    f"(commits/{batch})"
                )
            else:
                why = f"batch {batch} was committed by Spark: {why}"
            raise CliError(
                f"sink {self.sink_id}: {why}: its transactions hold the only copy of its "
                "rows; nothing was rolled back",
                f"commit them instead: sqlsink recover --sink-id {self.sink_id} --commit-lost "
                f"{batch}",
            )

    def _survey_runs(self, sink: SinkRecovery, treat_as_dead: Collection[str] = ()) -> None:
        """The sink's runs; those live (and not named dead) keep their gids."""
        sink.runs = self.conn.runs(sink.sink_id)
        sink.ends = self.conn.run_ends(sink.sink_id)
        sink.treated_live = [r for r in sink.runs if r.live and r.run_id not in treat_as_dead]

    def _fence(self, sink: SinkRecovery, recovery: SinkProcedure) -> None:
        """--force: declare the named runs dead in the commit log, then end the sessions
        provably theirs (those that hold the sink's lock, as the run recorded them)."""
        fenced = self._declare_dead(recovery, sink.sink_id, sink.named)
        sink.fenced = list(fenced.runs)
        sink.ended += [pid for pid in fenced.ended if pid not in sink.ended]

    def _declare_dead(self, recovery: SinkProcedure, sink_id: str, run_ids: list[str]) -> Fenced:
        """Fence the runs (durably), end their lock holders, and say so."""
        fenced = recovery.fence(run_ids)
        if fenced.runs:
            self.out.note(
                f"sqlsink recover: sink {sink_id}: declared run(s) "
                f"{', '.join(fenced.runs)} dead (fenced)"
            )
        return fenced

    def _plan_only(self, sink: SinkRecovery, recovery: SinkProcedure) -> None:
        """A dry run: the plan and the losses, without acting (the named runs as dead)."""

        def scope() -> Scope:
            self._survey_runs(sink, treat_as_dead=sink.named)
            return self._scope(sink, frozenset(r.run_id for r in sink.treated_live))

        sink.lock_busy = not recovery.lock_free()
        if sink.lock_busy:
            sink.holders = self.conn.lock_holders(sink.sink_id)
        sink.plan = recovery.plan(scope())
        sink.lost = confirmed_losses(self.conn, sink.plan)
        sink.status = "planned" if sink.to_do() else "nothing to do"
        if sink.lost:
            sink.status = "data loss"

    def _take_lock(self, sink: SinkRecovery, recovery: SinkProcedure) -> bool:
        """The sink's lock: free at once, or within --lock-timeout (a committer holds it
        while it commits); a holder provably of a fenced run is ended (``Recovery.lock``).
        Then the runs and the plan, under it; else a refusal (the plan read without it)."""

        def waiting() -> None:
            sink.lock_busy = True
            sink.holders = self.conn.lock_holders(sink.sink_id)
            self.out.note(
                f"sqlsink recover: sink {sink.sink_id}: waiting up to {self.lock_timeout:g}s "
                f"for the sink's lock ({sink.evidence()})"
            )

        take = recovery.lock(self.lock_timeout, waiting)
        sink.locked = take.held
        sink.ended += [pid for pid in take.ended if pid not in sink.ended]
        self._survey_runs(sink)
        sink.plan = recovery.plan(self._scope(sink))
        if sink.locked:
            return True
        sink.holders = self.conn.lock_holders(sink.sink_id) or sink.holders
        self._refuse(
            sink, lock_still_held(self.lock_timeout, sink.evidence(), "nothing was done for it")
        )
        return False

    def _refuse_undecided(self, sink: SinkRecovery, recovery: SinkProcedure) -> None:
        """--commit-lost/--mark-skipped found the sink's lock held past --lock-timeout:
        nothing decided, nothing done; refused as ``_take_lock`` refuses (the holder
        named, the plan read without the lock)."""
        sink.lock_busy = True
        sink.holders = self.conn.lock_holders(sink.sink_id) or self.decide_holders
        self._survey_runs(sink)
        sink.plan = recovery.plan(self._scope(sink))
        self._refuse(
            sink,
            lock_still_held(
                self.lock_timeout,
                sink.evidence(),
                "nothing was decided, and nothing was done for it",
            ),
        )

    def _warn_foreign_owners(self, sink: SinkRecovery) -> None:
        """Only a prepared transaction's owner (or a superuser) may finish it: the plan
        leaves those (docs/DESIGN.md, the resolution rule), and the rest is resolved."""
        if self.me.superuser or sink.plan is None:
            return
        owners = sorted(
            {
                a.prepared.owner
                for a in sink.plan.actions
                if a.action is Action.LEAVE and a.why is Why.OTHER_ROLE
            }
        )
        if owners:
            self.warnings.append(
                Notice(
                    "warning",
                    f"transactions of this sink were prepared by role(s) {', '.join(owners)}; "
                    "only that role or a superuser may COMMIT/ROLLBACK PREPARED them, and this "
                    f"is role {self.me.role}: they were left prepared, the rest was resolved",
                    f"run sqlsink recover connected as {owners[0]} or as a superuser",
                    sink.sink_id,
                )
            )

    def _refuse(self, sink: SinkRecovery, message: str, failed: bool = False) -> None:
        """Nothing is done for this sink; data loss is still looked for (read-only)."""
        sink.status = "failed" if failed else "refused"
        sink.message = message
        if sink.plan is not None:
            sink.lost = confirmed_losses(self.conn, sink.plan)

    # -- acting -----------------------------------------------------------------------------

    def _act(self) -> None:
        self.total = sum(len(s.to_do()) for s in self.sinks if s.locked)
        if self.total >= PROGRESS_EVERY:
            self.out.note(f"sqlsink recover: finishing {self.total} prepared transactions ...")
        for sink in self.sinks:
            if sink.locked:
                self._recover(sink)

    def _recover(self, sink: SinkRecovery) -> None:
        """The core's recovery under the lock ``_take_lock`` took (it lets it go), with the
        scope read again; its record says what was done."""
        scope = self._scope(sink)  # read again, under the lock
        sink.locked = False  # let go by finish, whatever happens
        done = SinkProcedure(self.backend, sink.sink_id).finish(scope, self._progress)
        sink.plan, sink.report = done.plan, done.report
        self.finished |= {gid: RESULT[what] for gid, what in done.finished.items()}
        if done.loss is not None:
            sink.status = "data loss"
            sink.lost = list(done.loss.context.get("lost", []))
            sink.message = done.loss.message
        elif done.failure is not None:
            sink.status = "failed"
            sink.message = done.failure.message
        else:
            sink.status = "recovered" if done.did else "nothing to do"

    def _progress(self) -> None:
        self.done += 1
        if self.done % PROGRESS_EVERY == 0:
            self.out.note(
                f"sqlsink recover: {self.done}/{self.total} prepared transactions finished"
            )


# -- the command --------------------------------------------------------------------------


def start(args: argparse.Namespace, envelope: Envelope) -> RecoverDocument:
    return {
        **envelope,
        "dry_run": args.dry_run,
        "forced": args.force,
        "run_ids": list(args.run_id or []),
        "sinks": [],
        "actions": [],
        "data_loss": [],
        "checkpoint": None,
        "commit_lost": sorted(set(args.commit_lost or [])),
        "mark_skipped": sorted(set(args.mark_skipped or [])),
        "rollback_undecided": sorted(set(args.rollback_undecided or [])),
    }


def run(args: argparse.Namespace, out: Output, doc: RecoverDocument) -> int:
    checkpoint = read_checkpoint(args.checkpoint) if args.checkpoint else None
    named = args.sink_id is not None or checkpoint is not None
    run_ids: list[str] = list(dict.fromkeys(args.run_id or []))
    if args.force and not named:
        raise CliError(
            "--force declares runs of one sink dead: name the sink",
            "add --sink-id ID (or --checkpoint DIR of its query)",
        )
    commit_lost, mark_skipped = list(args.commit_lost or []), list(args.mark_skipped or [])
    if (commit_lost or mark_skipped) and not named:
        raise CliError(
            "--commit-lost and --mark-skipped decide batches of one sink: name the sink",
            "add --sink-id ID (or --checkpoint DIR of its query)",
        )
    rollback_undecided = sorted(set(args.rollback_undecided or []))
    if rollback_undecided and not named:
        raise CliError(
            "--rollback-undecided names batches of one sink: name the sink",
            "add --sink-id ID (or --checkpoint DIR of its query)",
        )
    with open_connection(args.url, "recover", args.password_command) as conn:
        me = identify(conn, doc)
        require_schema(conn, me)
        bound = conn.sinks()
        sink_id: str | None = args.sink_id
        if sink_id is None and checkpoint is not None:
            sink_id = sink_of_checkpoint(conn, checkpoint, bound, me.database)
        if sink_id is not None and run_ids:
            _check_named_runs(conn, sink_id, run_ids)
        if sink_id is not None and (commit_lost or mark_skipped):
            _check_known_sink(conn, sink_id, bound, me.database)
        recovery = Recovery(
            conn,
            out,
            me,
            sink_id,
            args.dry_run,
            args.force,
            run_ids,
            args.lock_timeout,
            bound,
            checkpoint,
            rollback_undecided=rollback_undecided,
        )
        if checkpoint is not None and sink_id is not None:
            check_checkpoint_binding(conn, checkpoint, sink_id, recovery.bound, me)
        recovery.check_rollback_undecided()
        mode = " (dry run: nothing is changed)" if args.dry_run else ""
        header(out, "recover", me, mode)
        if commit_lost or mark_skipped:
            for said in recovery.decide(commit_lost, mark_skipped):
                recovery.warnings.append(Notice("info", said, None, sink_id))
        recovery.resolve()
        return _report(recovery, checkpoint, doc)


def _check_named_runs(conn: AdminSession, sink_id: str, run_ids: list[str]) -> None:
    """Every --run-id must be a run of the sink: a typo fences nothing, and says so."""
    known = conn.runs(sink_id)
    unknown = [r for r in run_ids if r not in {k.run_id for k in known}]
    if unknown:
        listed = ", ".join(f"{k.run_id} ({k.state})" for k in known[:10]) or "none"
        raise CliError(
            f"sink {sink_id} has no run {', '.join(unknown)} in its commit log (its runs, "
            f"newest first: {listed}); nothing was done",
            f"name a run that sqlsink status --sink-id {sink_id} lists",
        )


def _check_known_sink(
    conn: AdminSession, sink_id: str, bound: dict[str, SinkRow], database: str
) -> None:
    """A decision only for a sink the commit log knows (a row in sqlsink.sinks, or a
    prepared transaction here): a mistyped id would otherwise get decisions of its own."""
    if sink_id in bound or any(
        (gid := Gid.parse(txn.gid)) is not None
        and gid.sink_id == sink_id
        and txn.database == database
        for txn in conn.all_prepared()
    ):
        return
    by_case: dict[str, list[str]] = {}
    for known in bound:
        by_case.setdefault(known.lower(), []).append(known)
    close = [
        known
        for key in difflib.get_close_matches(sink_id.lower(), list(by_case), n=3, cutoff=0.75)
        for known in sorted(by_case[key])
    ]
    guess = (
        f"did you mean --sink-id {' or '.join(close)}? (sink ids are case-sensitive; "
        if close
        else "name a sink this database knows (the sinkId option, else the query id; "
    )
    raise CliError(
        f"sink {sink_id} is unknown in database {database}: no commit log rows and no "
        "prepared transactions, so it has no batch to decide; nothing was decided",
        f"{guess}the sinks this database knows: {known_sinks(conn, bound)}); check that "
        "--url names the sink's database",
    )


def _report(recovery: Recovery, checkpoint: Checkpoint | None, doc: RecoverDocument) -> int:
    """The warnings, the human report and the document; the exit code."""
    conn, out, sink_id, sinks = recovery.conn, recovery.out, recovery.sink_id, recovery.sinks
    database = recovery.me.database
    now = conn.server_now()
    finished = recovery.finished
    actions = all_actions(conn, sinks, finished, recovery.backend.database, sink_id, now)
    lost = [(sink.sink_id, batch, gid) for sink in sinks for batch, gid in sink.lost]
    warnings = recovery.warnings
    for sink in sinks:
        warnings += sink_warnings(sink, recovery.dry_run, out, conn.terms())
    if (
        sink_id is not None
        and sink_id not in recovery.bound
        and not any(a["sink_id"] == sink_id for a in actions)
    ):
        warnings.append(unknown_sink_warning(sink_id, database))
    warnings += foreign_warnings(actions, sink_id, database)
    checkpoint_doc = None
    if checkpoint is not None and sink_id is not None:
        checkpoint_doc = relate_checkpoint(conn, checkpoint, sink_id, recovery.bound, warnings)

    print_recover(out, sinks, actions, lost, checkpoint_doc, recovery.dry_run)
    print_warnings(out, warnings)
    doc["sinks"] = [sink_json(sink, actions) for sink in sinks]
    doc["actions"] = actions
    doc["data_loss"] = [loss_json(s, b, g) for s, b, g in lost]
    doc["checkpoint"] = checkpoint_doc
    doc["warnings"] = [w.as_json() for w in warnings]
    code = recover_exit_code(sinks, actions, warnings, lost)
    print_result(out, sinks, actions, recovery.dry_run, code)
    return code
