"""The sink's PostgreSQL session, as the core sees it: a thin face over the commit log,
the sink lock and the server's prepared transactions."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager

import psycopg
from psycopg import sql

from sqlsink.core.checkpoint_check import LogCoverage, RunCheck, Verdict
from sqlsink.core.gid import Gid
from sqlsink.core.model import (
    COMMIT_PREPARED,
    ROLLBACK_PREPARED,
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
from sqlsink.postgres import (
    appnames,
    checkpoint_records,
    commit_log,
    locks,
    retention,
    run_registry,
    syncrep,
)
from sqlsink.postgres.commit_log import like_prefix
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.faults import terminator


class PostgresBackend:
    """Implements ``sqlsink.core.backend.TwoPhaseBackend`` on one autocommit connection."""

    def __init__(self, conn: Connection, lock_timeout_s: float = 60.0) -> None:
        """``lock_timeout_s`` bounds every lock wait of this session (the sink lock too)."""
        self.conn = conn
        self.lock_timeout_s = lock_timeout_s
        self.standby = syncrep.watch(conn, lock_timeout_s)  # bounds every write (syncrep)
        row = conn.execute(
            "SELECT current_database(), current_user, "
            "       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), "
            "       set_config('lock_timeout', %s, false)",
            (f"{max(int(lock_timeout_s * 1000), 1)}ms",),
        ).fetchone()
        assert row is not None
        self._database = str(row[0])
        self._role = None if row[2] else str(row[1])
        self._tokens: bool | None = None  # the log records driver tokens (version 7)

    @property
    def finisher_role(self) -> str | None:
        return self._role

    @property
    def commit_statement(self) -> str:
        return COMMIT_PREPARED

    @property
    def rollback_statement(self) -> str:
        return ROLLBACK_PREPARED

    @property
    def database(self) -> str:
        return self._database

    def cut_session(self, url: str) -> None:
        terminator(None if self.conn.closed else self.conn.info.backend_pid)(url)

    def sink_lock(self, sink_id: str | None) -> AbstractContextManager[None]:
        return locks.sink_lock(self.conn, sink_id, self.lock_timeout_s)

    def acquire_sink_lock(
        self,
        sink_id: str | None,
        timeout_s: float | None = None,
        waiting: Callable[[], None] | None = None,
        *,
        end_fenced: bool = True,
    ) -> LockTake:
        bound = self.lock_timeout_s if timeout_s is None else timeout_s
        return locks.acquire_sink_lock(self.conn, sink_id, bound, waiting, end_fenced=end_fenced)

    def try_sink_lock(self, sink_id: str | None) -> bool:
        return locks.try_sink_lock(self.conn, sink_id)

    def unlock_sink(self, sink_id: str | None) -> None:
        locks.unlock_sink(self.conn, sink_id)

    def fence_runs(self, sink_id: str, run_ids: Collection[str]) -> list[str]:
        with self.standby.bounded(f"fencing runs of sink {sink_id}", sink=sink_id):
            return run_registry.fence_runs(self.conn, sink_id, run_ids)

    def end_fenced_holders(self, sink_id: str | None) -> list[int]:
        return locks.end_fenced_holders(self.conn, sink_id)

    def prepared(self, sink_id: str | None) -> list[PreparedTransaction]:
        prefix = Gid.sink_prefix(sink_id) if sink_id else "sqlsink_"
        rows = self.conn.execute(
            "SELECT gid, database, owner, prepared FROM pg_prepared_xacts "
            "WHERE gid LIKE %s ORDER BY gid",
            (like_prefix(prefix),),
        ).fetchall()
        return [PreparedTransaction(g, d, o, p) for g, d, o, p in rows]

    def decisions(
        self, sink_id: str | None, batch_ids: Iterable[tuple[str, int]] = ()
    ) -> dict[tuple[str, int], Decision]:
        return commit_log.decisions(self.conn, sink_id, batch_ids)

    def binding(self, sink_id: str) -> Binding | None:
        return commit_log.binding(self.conn, sink_id)

    def bind(self, sink_id: str, writer: Binding) -> None:
        with self.standby.bounded(f"binding sink {sink_id}", sink=sink_id):
            commit_log.bind(self.conn, sink_id, writer)

    def highest_decided(self, sink_id: str) -> int | None:
        return commit_log.highest_decided(self.conn, sink_id)

    def task_state(self, sink_id: str, run_id: str, batch_id: int) -> TaskState:
        prefix = Gid.sink_prefix(sink_id)
        return commit_log.task_state(self.conn, sink_id, run_id, batch_id, prefix)

    def attempt_fate(self, sink_id: str, run_id: str, batch_id: int, gid: str) -> Fate:
        return commit_log.attempt_fate(self.conn, sink_id, run_id, batch_id, gid)

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
        if token is not None and self._tokens is None:
            self._tokens = run_registry.has_writer_tokens(self.conn)
        with self.standby.bounded(f"recording run {run_id} of sink {sink_id}", sink=sink_id):
            return run_registry.register_run(
                self.conn,
                sink_id,
                run_id,
                live_for_s,
                holds_lock=holds_lock,
                admit=admit,
                token=token if self._tokens else None,
            )

    def run_of_token(self, sink_id: str, token: str) -> str | None:
        return run_registry.run_of_token(self.conn, sink_id, token)

    def mark_aborted(self, sink_id: str, run_id: str, batch_id: int) -> None:
        with self.standby.bounded(f"recording that batch {batch_id} was aborted", batch=batch_id):
            run_registry.mark_aborted(self.conn, sink_id, run_id, batch_id)

    def live_runs(self, sink_id: str | None) -> dict[tuple[str, str], float]:
        return run_registry.live_runs(self.conn, sink_id)

    def await_batch_tasks(
        self, sink_id: str, batch_id: int, timeout_s: float
    ) -> tuple[list[int], list[int]]:
        # a task's session ends when its process does (its open transaction rolls back,
        # a prepared one stays): polled, as the server offers no wait on another session
        deadline = time.monotonic() + timeout_s
        prefix = like_prefix(appnames.batch_tasks(sink_id, batch_id))
        seen: list[int] | None = None
        while True:
            rows = self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND application_name LIKE %s ORDER BY pid",
                (prefix,),
            ).fetchall()
            pids = [int(r[0]) for r in rows]
            seen = pids if seen is None else seen
            if not pids or time.monotonic() >= deadline:
                return seen, pids
            time.sleep(0.05)

    def insert_decision(self, decision: NewDecision) -> bool:
        batch_id = decision.batch_id
        with self.standby.bounded(f"the decision of batch {batch_id}", batch=batch_id):
            return commit_log.insert_decision(self.conn, decision)

    def commit_prepared(self, gid: str) -> bool:
        return self._finish("COMMIT PREPARED {}", gid)

    def rollback_prepared(self, gid: str) -> bool:
        return self._finish("ROLLBACK PREPARED {}", gid)

    def _finish(self, statement: str, gid: str) -> bool:
        try:
            with self.standby.bounded(statement.format(gid), gid=gid):
                self.conn.execute(sql.SQL(statement).format(sql.Literal(gid)))
        except psycopg.errors.UndefinedObject:
            return False  # not prepared (any more)
        except psycopg.errors.ObjectNotInPrerequisiteState:  # "is busy": being finished
            self._await_finished(gid)  # by someone else: the caller verifies the outcome
            return False
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"cannot finish prepared transaction {gid}: {exc.diag.message_primary}. "
                "Only the role that prepared it (the sink's role) or a superuser may commit "
                "or roll it back: connect as that role",
                gid=gid,
            ) from None
        return True

    def _await_finished(self, gid: str) -> None:
        """Wait (bounded) until another session has finished ``gid``."""
        deadline = time.monotonic() + self.lock_timeout_s
        while time.monotonic() < deadline:
            row = self.conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = %s)", (gid,)
            ).fetchone()
            if not (row and row[0]):
                return
            time.sleep(0.05)
        raise TransientError(
            f"prepared transaction {gid} is being finished by another session, which has "
            f"not completed in {self.lock_timeout_s:.0f} s (a synchronous standby that does "
            "not answer?); run sqlsink status to see it, and check synchronous replication",
            gid=gid,
        )

    def visible_markers(self, gids: Collection[str]) -> set[str]:
        return commit_log.visible_markers(self.conn, gids)

    def record_metrics(
        self,
        sink_id: str,
        batch_id: int,
        commit_ms: float,
        orphans: int,
        *,
        figures: BatchFigures | None = None,
    ) -> None:
        with self.standby.bounded(f"recording the metrics of batch {batch_id}", batch=batch_id):
            commit_log.record_metrics(
                self.conn, sink_id, batch_id, commit_ms, orphans, figures=figures
            )

    def record_handover(self, sink_id: str, run_id: str, batch_id: int) -> None:
        commit_log.record_handover(self.conn, sink_id, run_id, batch_id)

    def handovers(self, sink_id: str) -> list[Handover]:
        return commit_log.handovers(self.conn, sink_id)

    def mark_complete(self, sink_id: str, batch_ids: Collection[int]) -> None:
        with self.standby.bounded(f"marking batches of sink {sink_id} complete", sink=sink_id):
            commit_log.mark_complete(self.conn, sink_id, batch_ids)

    def prune_decisions(self, sink_id: str, through: int) -> int:
        with self.standby.bounded(f"pruning the commit log of sink {sink_id}", sink=sink_id):
            return retention.prune_decisions(self.conn, sink_id, through)

    # -- the checkpoint against the log (core.checkpoint_check.CheckpointLedger) ----------

    def run_check(self, sink_id: str, run_id: str) -> RunCheck:
        return checkpoint_records.checkpoint_run_check(self.conn, sink_id, run_id)

    def coverage(self, sink_id: str, batch_ids: Collection[int]) -> LogCoverage:
        return checkpoint_records.checkpoint_coverage(self.conn, sink_id, batch_ids)

    def record_check(
        self, sink_id: str, run_id: str, batch_id: int, location: str | None, verdict: Verdict
    ) -> None:
        with self.standby.bounded(f"recording the checkpoint check of run {run_id}", sink=sink_id):
            checkpoint_records.record_checkpoint_check(
                self.conn, sink_id, run_id, batch_id, location, verdict
            )
