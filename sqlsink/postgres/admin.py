"""The CLI's session with PostgreSQL (:class:`sqlsink.core.admin.AdminSession`): the
commit log's, the runs registry's and the server's reads of ``survey``, ``run_registry``,
``checkpoint_records``, ``views`` and ``retention`` on one connection, and the
translation of psycopg's errors into :class:`sqlsink.core.admin.DriverError`."""

from __future__ import annotations

import os
from collections.abc import Collection
from datetime import datetime
from types import TracebackType

import psycopg

from sqlsink.core.admin import (
    POSTGRES_TERMS,
    AdminSession,
    BatchSummary,
    CheckContext,
    CheckpointCheckRow,
    ConsistentView,
    DecisionRow,
    DriverError,
    DriverFault,
    Finding,
    Forgotten,
    HiddenBatch,
    RoleInfo,
    RunEnd,
    RunInfo,
    ServerTerms,
    Session,
    SinkRow,
)
from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.model import Binding, PreparedTransaction
from sqlsink.credentials import PasswordSource
from sqlsink.postgres import (
    appnames,
    checkpoint_records,
    commit_log,
    locks,
    retention,
    run_registry,
    views,
)
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.connection import Connection, connect
from sqlsink.postgres.schema import sql_dir
from sqlsink.postgres.survey import decisions, prepared, roles, server_checks, sessions


class PostgresAdmin(AdminSession):
    """One command's session (``application_name`` the CLI's, see ``appnames.cli``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @classmethod
    def open(cls, url: str, command: str, password_command: str | None) -> PostgresAdmin:
        """With ``password_command`` the password is that command's output."""
        os.environ.setdefault("PGCONNECT_TIMEOUT", "10")
        password = PasswordSource.from_command(password_command) if password_command else None
        return cls(connect(url, password, application_name=appnames.cli(command)))

    def role_info(self) -> RoleInfo:
        return roles.role_info(self.conn)

    def database(self) -> str:
        return str(self.conn.info.dbname)

    def terms(self) -> ServerTerms:
        return POSTGRES_TERMS

    def schema_version(self) -> int:
        return decisions.schema_version(self.conn)

    def checkpoint_checks_recorded(self) -> bool:
        return self.schema_version() >= 4

    def schema_fix(self) -> str:
        return schema_fix()

    def set_statement_timeout(self, seconds: float) -> None:
        ms = max(1, round(seconds * 1000))
        self.conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{ms}ms",))

    def server_now(self) -> datetime:
        return prepared.server_now(self.conn)

    def sinks(self) -> dict[str, SinkRow]:
        return decisions.sinks(self.conn)

    def sink_tables(self, sink_id: str) -> list[str]:
        return decisions.sink_tables(self.conn, sink_id)

    def batch_summary(self, sink_id: str) -> BatchSummary:
        return decisions.batch_summary(self.conn, sink_id)

    def recent_decisions(self, sink_id: str, limit: int) -> list[DecisionRow]:
        return decisions.recent_decisions(self.conn, sink_id, limit)

    def decisions_from(self, sink_id: str, first_batch: int) -> dict[int, DecisionRow]:
        return decisions.decisions_from(self.conn, sink_id, first_batch)

    def incomplete_decisions(self, sink_id: str | None = None) -> list[DecisionRow]:
        return decisions.incomplete_decisions(self.conn, sink_id)

    def binding(self, sink_id: str) -> Binding | None:
        return commit_log.binding(self.conn, sink_id)

    def all_prepared(self) -> list[PreparedTransaction]:
        return prepared.all_prepared(self.conn)

    def visible_markers(self, gids: Collection[str]) -> set[str]:
        return commit_log.visible_markers(self.conn, gids)

    def confirm_lost(self, candidates: Collection[str]) -> set[str]:
        return prepared.confirm_lost(self.conn, candidates)

    def sqlsink_sessions(self) -> list[Session]:
        return sessions.sqlsink_sessions(self.conn)

    def sink_sessions(self, found: Collection[Session], sink_id: str) -> list[Session]:
        return sessions.sink_sessions(found, sink_id)

    def lock_holders(self, sink_id: str) -> list[Session]:
        return sessions.lock_holders(self.conn, sink_id)

    def runs(self, sink_id: str | None) -> list[RunInfo]:
        return run_registry.runs(self.conn, sink_id)

    def run_ends(self, sink_id: str) -> dict[str, RunEnd]:
        return run_registry.run_ends(self.conn, sink_id)

    def checkpoint_checks(self, sink_id: str, limit: int = 5) -> list[CheckpointCheckRow]:
        return checkpoint_records.checkpoint_checks(self.conn, sink_id, limit)

    def consistent_views(self) -> list[ConsistentView]:
        return [
            ConsistentView(str(v.view), v.sink_id, v.table, v.owner, v.format)
            for v in views.find_views(self.conn)
        ]

    def hidden_batches(self, sink_id: str) -> list[HiddenBatch]:
        return views.hidden_batches(self.conn, sink_id)

    def forget_sink(self, sink_id: str, lock_timeout_s: float) -> Forgotten:
        with locks.sink_lock(self.conn, sink_id, lock_timeout_s):
            return retention.forget_sink(self.conn, sink_id)

    def run_checks(self, ctx: CheckContext) -> list[Finding]:
        return server_checks.run_checks(self.conn, ctx)

    def two_phase(self) -> TwoPhaseBackend:
        return PostgresBackend(self.conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PostgresAdmin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def schema_fix() -> str:
    """How to install the commit log's schema, for the error that says it is missing."""
    return (
        "the schema is created by the sink's first run (its role needs CREATE on the "
        f"database); or run the files of {sql_dir()} in order (001_commit_log.sql first) "
        "as the sink's role (setup_role.sql there sets up a least-privilege role). Check "
        "also that --url names the sink's database"
    )


def driver_error(exc: BaseException) -> DriverError | None:
    """psycopg's error as the CLI tells it apart; None for any other exception."""
    if not isinstance(exc, psycopg.Error):
        return None
    diag = (exc.diag.message_primary or str(exc)).strip()
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return DriverError(DriverFault.PRIVILEGE, diag)
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return DriverError(DriverFault.UNDEFINED_TABLE, diag)
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return DriverError(DriverFault.QUERY_CANCELED, diag)
    if isinstance(exc, psycopg.OperationalError):
        return DriverError(DriverFault.CONNECTION, diag)
    return DriverError(DriverFault.OTHER, diag)
