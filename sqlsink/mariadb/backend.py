"""The sink's MariaDB session, as the core sees it (``core.backend.TwoPhaseBackend``):
a thin face over the commit log (database ``sqlsink`` on the same server), the sink
lock (a named lock) and the server's prepared XA branches.

Where MariaDB differs from PostgreSQL, and how it is modelled here:
- A prepared branch stays attached to the session that prepared it: another session's
  ``XA COMMIT`` gets XAER_NOTA (1397) until that session has ended, though XA RECOVER
  lists the branch all along (tests/mariadb/test_xa_facts.py). So a partition
  disconnects after XA PREPARE, and ``commit_prepared``/``rollback_prepared`` treat
  XAER_NOTA on a listed branch as "busy": retried until its session is gone, at most
  the session's lock bound (PostgreSQL's "is busy" case, where another session is
  finishing it). A branch not listed is gone: False.
- XA RECOVER gives no database, owner or time: every branch of the sink's formatID is
  reported in the commit log's database, owned by this session's user, prepared "now"
  (so no branch looks old, and none hears from its run). Any user may finish any
  branch, so ``finisher_role`` is None.
- Never ``XA COMMIT ... ONE PHASE``; an xid is never reused (the gid holds the run and
  the attempt); only branches of the sink's formatID whose xid decodes to a valid gid
  are listed or touched (sqlsink/mariadb/xid.py). MariaDB finishes a branch by gtrid
  and bqual alone, ignoring the statement's formatID, so each XA COMMIT/ROLLBACK is
  preceded by an XA RECOVER that must list the branch with the sink's formatID.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone

from sqlsink.core.checkpoint_check import LogCoverage, RunCheck, Verdict
from sqlsink.core.model import (
    BatchFigures,
    Binding,
    Decision,
    Fate,
    Handover,
    LockTake,
    NewDecision,
    PreparedTransaction,
    TaskState,
)
from sqlsink.errors import ConfigError, TransientError
from sqlsink.mariadb import commit_log, locks, retention, run_registry, xid
from sqlsink.mariadb.connection import LOG_DATABASE, Connection, connect, errno, execute, rows
from sqlsink.mariadb.errors import RETRIED, translated

COMMIT_STATEMENT = "XA COMMIT"  # what commits a prepared branch (TwoPhaseBackend.commit_statement)
ROLLBACK_STATEMENT = "XA ROLLBACK"  # and what rolls one back (TwoPhaseBackend.rollback_statement)

XAER_NOTA = 1397  # the xid is not known (not prepared, or still attached to its session)
XA_RBROLLBACK = 1402  # the branch was rolled back (by the server): gone


# what happens next, said by the step a lost session or a lock wait interrupted
_DECIDING = (
    "Whether the decision was written is known from the commit log: if it was, the retry "
    "or the next run's recovery commits the batch's branches; if not, they are rolled "
    "back and Spark retries the batch"
)
_REGISTERING = "Nothing of the batch is committed yet. " + RETRIED
_NOTHING = "Nothing was changed (the step is one transaction); run it again"


def _finishing(verb: str, gid: str) -> tuple[str, str | None, str]:
    found = xid.encode_text(gid)
    parsed = gid.split("_")
    sink = parsed[1] if found is not None and len(parsed) > 2 else None
    return (
        f"{verb} prepared branch {gid}",
        sink,
        "The branch stays prepared on the server (a prepared XA branch outlives its "
        "session and a restart): the batch's retry, the next run's recovery or sqlsink "
        "recover finishes it as its decision says",
    )


class MariaDBBackend:
    """Implements ``sqlsink.core.backend.TwoPhaseBackend`` on one autocommit session."""

    def __init__(
        self, conn: Connection, lock_timeout_s: float = 60.0, log_database: str = LOG_DATABASE
    ) -> None:
        """``lock_timeout_s`` bounds every lock wait of this session: the sink lock, and
        row locks (innodb_lock_wait_timeout, whole seconds, at least 1)."""
        self.conn = conn
        self.lock_timeout_s = lock_timeout_s
        self.db = log_database
        self.user = ""
        with self._doing("opening the sink's session"):
            execute(
                conn, "SET SESSION innodb_lock_wait_timeout = %s", (max(1, round(lock_timeout_s)),)
            )
            user = rows(conn, "SELECT CURRENT_USER()")[0][0]
        self.user = str(user).rsplit("@", 1)[0]

    @contextmanager
    def _doing(
        self, doing: str, sink_id: str | None = None, after: str = RETRIED
    ) -> Iterator[None]:
        """Every statement path of the backend: PyMySQL's connection losses, lock wait
        timeouts and deadlocks become TransientErrors saying ``doing`` (mariadb/errors.py)."""
        with translated(
            self.conn, doing, sink_id=sink_id, user=self.user, db=self.db,
            lock_timeout_s=self.lock_timeout_s, after=after,
        ):  # fmt: skip
            yield

    @property
    def database(self) -> str:
        return self.db

    @property
    def finisher_role(self) -> str | None:
        return None  # any user may finish any prepared branch on MariaDB

    @property
    def commit_statement(self) -> str:
        return COMMIT_STATEMENT

    @property
    def rollback_statement(self) -> str:
        return ROLLBACK_STATEMENT

    def cut_session(self, url: str) -> None:
        with self._doing("asking its session's id"):
            me = int(rows(self.conn, "SELECT CONNECTION_ID()")[0][0])
        other = connect(url)
        try:
            execute(other, f"KILL CONNECTION {me}")
        finally:
            other.close()

    # -- the sink lock ---------------------------------------------------------------------

    def sink_lock(self, sink_id: str | None) -> AbstractContextManager[None]:
        return locks.sink_lock(self.conn, self.db, sink_id, self.lock_timeout_s)

    def acquire_sink_lock(
        self,
        sink_id: str | None,
        timeout_s: float | None = None,
        waiting: Callable[[], None] | None = None,
        *,
        end_fenced: bool = True,
    ) -> LockTake:
        bound = self.lock_timeout_s if timeout_s is None else timeout_s
        with self._doing(f"taking the sink lock of sink {sink_id}", sink_id):
            return locks.acquire_sink_lock(
                self.conn, self.db, sink_id, bound, waiting, end_fenced=end_fenced
            )

    def try_sink_lock(self, sink_id: str | None) -> bool:
        with self._doing(f"trying the sink lock of sink {sink_id}", sink_id):
            return locks.try_sink_lock(self.conn, self.db, sink_id)

    def unlock_sink(self, sink_id: str | None) -> None:
        after = (
            "The server let the sink lock go with the session (named locks end with it); " + RETRIED
        )
        with self._doing(f"letting the sink lock of sink {sink_id} go", sink_id, after):
            locks.unlock_sink(self.conn, self.db, sink_id)

    def end_fenced_holders(self, sink_id: str | None) -> list[int]:
        with self._doing("ending a fenced run's holder of the sink lock", sink_id):
            return locks.end_fenced_holders(self.conn, self.db, sink_id)

    # -- prepared branches -----------------------------------------------------------------

    def _recovered(self) -> list[str]:
        with self._doing("listing the prepared XA branches (XA RECOVER)"):
            found = [xid.from_recover_row(r) for r in rows(self.conn, "XA RECOVER")]
        return sorted(str(g) for g in found if g is not None)

    def prepared(self, sink_id: str | None) -> list[PreparedTransaction]:
        now = datetime.now(timezone.utc)
        return [
            PreparedTransaction(g, self.db, self.user, now)
            for g in self._recovered()
            if sink_id is None or g.split("_")[1] == sink_id
        ]

    def commit_prepared(self, gid: str) -> bool:
        with self._doing(*_finishing("committing", gid)):
            return self._finish("COMMIT", gid)

    def rollback_prepared(self, gid: str) -> bool:
        with self._doing(*_finishing("rolling back", gid)):
            return self._finish("ROLLBACK", gid)

    def _listed(self, gid: str, branch: xid.Xid) -> bool:
        """Whether XA RECOVER lists this branch; a ConfigError when it lists a foreign
        branch (another formatID) with the same gtrid and bqual: MariaDB finishes a
        branch by gtrid and bqual alone, whatever formatID the statement names
        (tests/mariadb/test_xa_facts.py), so that one must never be finished from here."""
        data = branch.gtrid + branch.bqual
        formats = {
            int(r[0])
            for r in rows(self.conn, "XA RECOVER")
            if int(r[1]) == len(branch.gtrid) and bytes(r[3]) == data
        }
        if formats - {branch.format_id}:
            raise ConfigError(
                f"a prepared XA branch of formatID {sorted(formats)[0]} (not sqlsink's) has "
                f"the gtrid and bqual of {gid}; "
                "MariaDB would finish it by those alone, so sqlsink leaves it: whoever "
                "prepared it must finish it (XA RECOVER FORMAT='SQL' shows it)"
            )
        return bool(formats)

    def _finish(self, verb: str, gid: str) -> bool:
        """XA COMMIT / XA ROLLBACK of exactly this gid's xid (never ONE PHASE); False when
        it is not prepared (any more). Looked up first: only a branch XA RECOVER lists
        with the sink's formatID is finished. A branch still attached to its session
        (XAER_NOTA while listed) is waited for, at most the lock bound."""
        branch = xid.encode_text(gid)
        if branch is None:
            return False  # not one of ours: never touched
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            if not self._listed(gid, branch):
                return False
            try:
                execute(self.conn, f"XA {verb} {branch.sql()}")
                return True
            except Exception as exc:
                code = errno(exc)
                if verb == "ROLLBACK" and code == XA_RBROLLBACK:
                    return True  # rolled back all the same
                if code != XAER_NOTA:
                    raise
            if time.monotonic() >= deadline:
                raise TransientError(
                    f"prepared branch {gid} is still attached to the session that prepared "
                    f"it after {self.lock_timeout_s:.0f} s (MariaDB lets another session "
                    "finish a branch only once that session has ended): a partition task "
                    "that did not disconnect after XA PREPARE? End it (SHOW PROCESSLIST, "
                    "KILL CONNECTION id), then run sqlsink recover",
                    gid=gid,
                )
            time.sleep(0.02)

    # -- the commit log --------------------------------------------------------------------

    def decisions(
        self, sink_id: str | None, batch_ids: Iterable[tuple[str, int]] = ()
    ) -> dict[tuple[str, int], Decision]:
        with self._doing(f"reading the decisions of sink {sink_id}", sink_id):
            return commit_log.decisions(self.conn, self.db, sink_id, batch_ids)

    def binding(self, sink_id: str) -> Binding | None:
        with self._doing(f"reading the binding of sink {sink_id}", sink_id):
            return commit_log.binding(self.conn, self.db, sink_id)

    def bind(self, sink_id: str, writer: Binding) -> None:
        with self._doing(f"binding sink {sink_id} to its writer", sink_id):
            commit_log.bind(self.conn, self.db, sink_id, writer)

    def highest_decided(self, sink_id: str) -> int | None:
        with self._doing(f"reading the highest decided batch of sink {sink_id}", sink_id):
            return commit_log.highest_decided(self.conn, self.db, sink_id)

    def task_state(self, sink_id: str, run_id: str, batch_id: int) -> TaskState:
        mine = [t.gid for t in self.prepared(sink_id)]
        with self._doing(f"reading the state of batch {batch_id} of run {run_id}", sink_id):
            return commit_log.task_state(self.conn, self.db, sink_id, run_id, batch_id, mine)

    def attempt_fate(self, sink_id: str, run_id: str, batch_id: int, gid: str) -> Fate:
        with self._doing(f"asking the fate of {gid}", sink_id):
            return commit_log.attempt_fate(self.conn, self.db, sink_id, run_id, batch_id, gid)

    def insert_decision(self, decision: NewDecision) -> bool:
        doing = f"writing the decision of batch {decision.batch_id}"
        with self._doing(doing, decision.sink_id, _DECIDING):
            return commit_log.insert_decision(self.conn, self.db, decision, self.cut_session)

    def record_metrics(
        self,
        sink_id: str,
        batch_id: int,
        commit_ms: float,
        orphans: int,
        *,
        figures: BatchFigures | None = None,
    ) -> None:
        after = (
            f"Batch {batch_id} is committed already (its branches are); only its figures "
            "are not recorded. " + RETRIED
        )
        with self._doing(f"recording the figures of batch {batch_id}", sink_id, after):
            commit_log.record_metrics(
                self.conn, self.db, sink_id, batch_id, commit_ms, orphans, figures=figures
            )

    def visible_markers(self, gids: Collection[str]) -> set[str]:
        with self._doing("reading the committed branches' markers"):
            return commit_log.visible_markers(self.conn, self.db, gids)

    def record_handover(self, sink_id: str, run_id: str, batch_id: int) -> None:
        with self._doing(f"recording the hand-over of batch {batch_id} of run {run_id}", sink_id):
            commit_log.record_handover(self.conn, self.db, sink_id, run_id, batch_id)

    def handovers(self, sink_id: str) -> list[Handover]:
        with self._doing(f"reading the hand-overs of sink {sink_id}", sink_id):
            return commit_log.handovers(self.conn, self.db, sink_id)

    def mark_complete(self, sink_id: str, batch_ids: Collection[int]) -> None:
        with self._doing(
            f"marking batch(es) {sorted(batch_ids)} of sink {sink_id} complete", sink_id
        ):
            commit_log.mark_complete(self.conn, self.db, sink_id, batch_ids)

    def prune_decisions(self, sink_id: str, through: int) -> int:
        with self._doing(
            f"pruning the decisions of sink {sink_id} through batch {through}", sink_id
        ):
            return retention.prune_decisions(self.conn, self.db, sink_id, through)

    def forget_sink(self, sink_id: str) -> int:
        """``sqlsink forget``'s removal (the caller holds the sink lock)."""
        mine = [t.gid for t in self.prepared(sink_id)]
        with self._doing(f"forgetting sink {sink_id}", sink_id, _NOTHING):
            return retention.forget_sink(self.conn, self.db, sink_id, mine)

    # -- runs ------------------------------------------------------------------------------

    def fence_runs(self, sink_id: str, run_ids: Collection[str]) -> list[str]:
        with self._doing(f"fencing run(s) {sorted(run_ids)} of sink {sink_id}", sink_id, _NOTHING):
            return run_registry.fence_runs(self.conn, self.db, sink_id, run_ids)

    def register_run(
        self,
        sink_id: str,
        run_id: str,
        live_for_s: float,
        *,
        holds_lock: bool,
        admit: Callable[[Binding | None, int | None], None] | None = None,
        token: str | None = None,
    ) -> str | None:
        with self._doing(f"registering run {run_id}", sink_id, _REGISTERING):
            return run_registry.register_run(
                self.conn, self.db, sink_id, run_id, live_for_s,
                holds_lock=holds_lock, admit=admit, token=token,
            )  # fmt: skip

    def run_of_token(self, sink_id: str, token: str) -> str | None:
        with self._doing(f"finding the run of a driver token of sink {sink_id}", sink_id):
            return run_registry.run_of_token(self.conn, self.db, sink_id, token)

    def mark_aborted(self, sink_id: str, run_id: str, batch_id: int) -> None:
        with self._doing(f"marking batch {batch_id} of run {run_id} aborted", sink_id):
            run_registry.mark_aborted(self.conn, self.db, sink_id, run_id, batch_id)

    def live_runs(self, sink_id: str | None) -> dict[tuple[str, str], float]:
        with self._doing(f"reading the live runs of sink {sink_id}", sink_id):
            return run_registry.live_runs(self.conn, self.db, sink_id)

    def await_batch_tasks(
        self, sink_id: str, batch_id: int, timeout_s: float
    ) -> tuple[list[int], list[int]]:
        """The batch's task sessions (``enter_task_session``) still in the process list,
        polled until none is or ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        seen: list[int] | None = None
        while True:
            with self._doing(f"waiting for the task sessions of batch {batch_id}", sink_id):
                found = rows(
                    self.conn,
                    f"SELECT t.conn_id FROM `{self.db}`.task_sessions t "
                    "JOIN information_schema.PROCESSLIST p ON p.ID = t.conn_id "
                    "WHERE t.sink_id = %s AND t.batch_id = %s AND t.conn_id <> CONNECTION_ID() "
                    "ORDER BY 1",
                    (sink_id, batch_id),
                )
            ids = [int(r[0]) for r in found]
            seen = ids if seen is None else seen
            if not ids or time.monotonic() >= deadline:
                return seen, ids
            time.sleep(0.05)

    # -- the checkpoint against the log (core.checkpoint_check.CheckpointLedger) -----------

    def run_check(self, sink_id: str, run_id: str) -> RunCheck:
        with self._doing(f"reading the checkpoint check of run {run_id}", sink_id):
            return retention.run_check(self.conn, self.db, sink_id, run_id)

    def coverage(self, sink_id: str, batch_ids: Collection[int]) -> LogCoverage:
        with self._doing(f"reading which batches the commit log of sink {sink_id} covers", sink_id):
            return retention.coverage(self.conn, self.db, sink_id, batch_ids)

    def record_check(
        self, sink_id: str, run_id: str, batch_id: int, location: str | None, verdict: Verdict
    ) -> None:
        with self._doing(f"recording the checkpoint check of run {run_id}", sink_id):
            retention.record_check(self.conn, self.db, sink_id, run_id, batch_id, location, verdict)


def statement_logging(value: str) -> str:
    """Why binlog_format = ``value`` (STATEMENT) refuses the sink, and the fix: the
    planner's refusal and the partition's error alike."""
    return (
        f"the server's binary log is on with binlog_format = {value}: the sink's sessions "
        "run at READ COMMITTED, whose InnoDB writes can be logged by rows only (ROW or "
        "MIXED binary logging), so the server refuses every write of the sink (error "
        "1665), its loads and its commit log's. Fix: SET GLOBAL binlog_format = 'ROW' "
        "(MIXED serves too), and binlog_format=ROW under [mariadbd] in the server's "
        "configuration; sqlsink check shows the setting"
    )


def enter_task_session(
    conn: Connection, sink_id: str, batch_id: int, partition_id: int, db: str = LOG_DATABASE
) -> None:
    """A partition task's session says whose it is (``await_batch_tasks`` finds it while
    it is connected): MariaDB has no application name to carry it. The task's first
    write: binlog_format = STATEMENT set after planning is refused here (1665), in the
    sink's words."""
    try:
        execute(
            conn,
            f"REPLACE INTO `{db}`.task_sessions (conn_id, sink_id, batch_id, partition_id) "
            "VALUES (CONNECTION_ID(), %s, %s, %s)",
            (sink_id, batch_id, partition_id),
        )
    except Exception as exc:
        if errno(exc) != 1665:
            raise
        from sqlsink.errors import WriteError

        value = str(rows(conn, "SELECT @@SESSION.binlog_format")[0][0])
        raise WriteError(
            f"sink {sink_id!r}, batch {batch_id}, partition {partition_id}: "
            f"{statement_logging(value)}. Nothing of batch {batch_id} was written, nothing "
            "is left prepared; restart the query once the setting is fixed",
            batch=batch_id,
            partition=partition_id,
        ) from None
