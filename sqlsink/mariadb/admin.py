"""The CLI's session with MariaDB or MySQL (:class:`sqlsink.core.admin.AdminSession`):
the reads of ``survey`` over the commit log (database ``sqlsink`` on the same server),
``forget`` under the sink lock (``locks``, ``retention``), the sink's own two-phase
backend (``MariaDBBackend``) for ``recover``, and PyMySQL's errors as
:class:`sqlsink.core.admin.DriverError`.

The session's database, as the commands name it and sort prepared branches by, is the
commit log's: an XA branch belongs to no database (XA RECOVER is server-wide), and the
backend reports the sink's branches there. MariaDB has no consistent view: none is
listed and no batch is hidden. ``sqlsink check`` is not built on MariaDB yet."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from types import TracebackType

from sqlsink.core.admin import (
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
from sqlsink.mariadb import commit_log, locks, retention, survey
from sqlsink.mariadb.backend import COMMIT_STATEMENT, MariaDBBackend
from sqlsink.mariadb.connection import LOG_DATABASE, Connection, connect, errno, execute

# the backend's bound on a branch still attached to its session and on row locks;
# ``recover --lock-timeout`` bounds the sink lock itself
BACKEND_LOCK_TIMEOUT_S = 60.0

MARIADB_TERMS = ServerTerms(
    "holds its row locks",
    "KILL CONNECTION id",
    "XA ROLLBACK X'<gtrid>',X'<bqual>',<formatID> (XA RECOVER FORMAT='SQL' lists them)",
    "any user",
    COMMIT_STATEMENT,
)


def program_name(command: str) -> str:
    """The session's connection attribute ``program_name`` (performance_schema's
    session_connect_attrs shows it when that schema is on)."""
    return f"sqlsink {command} (cli)"


class MariaDBAdmin(AdminSession):
    """One command's session (autocommit, UTC, READ COMMITTED: ``connection.connect``)."""

    def __init__(self, conn: Connection, log_database: str = LOG_DATABASE) -> None:
        self.conn = conn
        self.db = log_database
        self._backend: MariaDBBackend | None = None

    @classmethod
    def open(cls, url: str, command: str, password_command: str | None) -> MariaDBAdmin:
        """With ``password_command`` the password is that command's output."""
        password = PasswordSource.from_command(password_command).get() if password_command else None
        # doing="": a failed connect in the sink's words, which the CLI prefixes with the
        # command's name (a TransientError: never "lost the connection")
        conn = connect(url, password=password, program_name=program_name(command), doing="")
        return cls(conn)

    def role_info(self) -> RoleInfo:
        return survey.role_info(self.conn, self.db)

    def database(self) -> str:
        return self.db

    def terms(self) -> ServerTerms:
        return MARIADB_TERMS

    def schema_version(self) -> int:
        return survey.schema_version(self.conn, self.db)

    def checkpoint_checks_recorded(self) -> bool:
        return True  # the commit log's first schema has the runs' checkpoint columns

    def schema_fix(self) -> str:
        return schema_fix()

    def set_statement_timeout(self, seconds: float) -> None:
        """MariaDB's max_statement_time (seconds, any statement); MySQL's
        max_execution_time (milliseconds, SELECTs)."""
        if survey.is_mariadb(self.conn):
            execute(self.conn, "SET SESSION max_statement_time = %s", (max(0.001, seconds),))
        else:
            execute(
                self.conn, "SET SESSION max_execution_time = %s", (max(1, round(seconds * 1000)),)
            )

    def server_now(self) -> datetime:
        return survey.server_now(self.conn)

    def sinks(self) -> dict[str, SinkRow]:
        return survey.sinks(self.conn, self.db)

    def sink_tables(self, sink_id: str) -> list[str]:
        return survey.sink_tables(self.conn, self.db, sink_id)

    def batch_summary(self, sink_id: str) -> BatchSummary:
        return survey.batch_summary(self.conn, self.db, sink_id)

    def recent_decisions(self, sink_id: str, limit: int) -> list[DecisionRow]:
        return survey.recent_decisions(self.conn, self.db, sink_id, limit)

    def decisions_from(self, sink_id: str, first_batch: int) -> dict[int, DecisionRow]:
        return survey.decisions_from(self.conn, self.db, sink_id, first_batch)

    def incomplete_decisions(self, sink_id: str | None = None) -> list[DecisionRow]:
        return survey.incomplete_decisions(self.conn, self.db, sink_id)

    def binding(self, sink_id: str) -> Binding | None:
        return commit_log.binding(self.conn, self.db, sink_id)

    def all_prepared(self) -> list[PreparedTransaction]:
        return survey.all_prepared(self.conn, self.db, self._owner())

    def _owner(self) -> str:
        """Who the backend reports as every branch's owner: this session's user."""
        return self._two_phase().user

    def visible_markers(self, gids: Collection[str]) -> set[str]:
        return commit_log.visible_markers(self.conn, self.db, gids)

    def confirm_lost(self, candidates: Collection[str]) -> set[str]:
        return survey.confirm_lost(self.conn, self.db, candidates)

    def sqlsink_sessions(self) -> list[Session]:
        return survey.sqlsink_sessions(self.conn, self.db)

    def sink_sessions(self, sessions: Collection[Session], sink_id: str) -> list[Session]:
        return survey.sink_sessions(sessions, sink_id)

    def lock_holders(self, sink_id: str) -> list[Session]:
        return survey.lock_holders(self.conn, self.db, sink_id)

    def runs(self, sink_id: str | None) -> list[RunInfo]:
        return survey.runs(self.conn, self.db, sink_id)

    def run_ends(self, sink_id: str) -> dict[str, RunEnd]:
        return survey.run_ends(self.conn, self.db, sink_id)

    def checkpoint_checks(self, sink_id: str, limit: int = 5) -> list[CheckpointCheckRow]:
        return survey.checkpoint_checks(self.conn, self.db, sink_id, limit)

    def consistent_views(self) -> list[ConsistentView]:
        return []  # no consistent view on MariaDB (Capability.CONSISTENT_VIEW is absent)

    def hidden_batches(self, sink_id: str) -> list[HiddenBatch]:
        return []  # what hides batches is a consistent view: none here

    def forget_sink(self, sink_id: str, lock_timeout_s: float) -> Forgotten:
        """Under the sink lock: refused (ConfigError) while the sink has a prepared branch,
        an incomplete decision or a live run (``retention.forget_sink``)."""
        with locks.sink_lock(self.conn, self.db, sink_id, lock_timeout_s):
            count, first, last, writer, known, others = survey.forget_figures(
                self.conn, self.db, sink_id
            )
            prepared = [t.gid for t in self._two_phase().prepared(sink_id)]
            if not known and not prepared:
                return Forgotten(0, None, None, known=False, others=tuple(others))
            retention.forget_sink(self.conn, self.db, sink_id, prepared)
            return Forgotten(count, first, last, None if writer is None else str(writer))

    def run_checks(self, ctx: CheckContext) -> list[Finding]:
        from sqlsink.mariadb import checks

        return checks.run_checks(self.conn, ctx)

    def _two_phase(self) -> MariaDBBackend:
        if self._backend is None:
            self._backend = MariaDBBackend(self.conn, BACKEND_LOCK_TIMEOUT_S, self.db)
        return self._backend

    def two_phase(self) -> TwoPhaseBackend:
        return self._two_phase()

    def close(self) -> None:
        if self.conn.open:
            self.conn.close()

    def __enter__(self) -> MariaDBAdmin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def schema_fix() -> str:
    return (
        f"run the sink once (its planning creates database `{LOG_DATABASE}` and its tables), "
        "as a user that may create databases; or grant the sink's user ALL on "
        f"`{LOG_DATABASE}`.*. Check also that --url names the sink's server"
    )


_PRIVILEGE = {1142, 1143, 1044, 1045, 1227, 1370}
_UNDEFINED_TABLE = {1146, 1049}
_CANCELED = {1969, 3024, 1317}
_CONNECTION = {2002, 2003, 2005, 2006, 2013, 2055, 1040, 1053, 1927}


def driver_error(exc: BaseException) -> DriverError | None:
    """PyMySQL's error as the CLI tells it apart; None for any other exception."""
    import pymysql

    if not isinstance(exc, pymysql.err.MySQLError):
        return None
    args: tuple[object, ...] = tuple(getattr(exc, "args", ()))
    diag = str(args[1] if len(args) > 1 else exc).strip() or type(exc).__name__
    code = errno(exc)
    if code in _PRIVILEGE:
        return DriverError(DriverFault.PRIVILEGE, diag)
    if code in _UNDEFINED_TABLE:
        return DriverError(DriverFault.UNDEFINED_TABLE, diag)
    if code in _CANCELED:
        return DriverError(DriverFault.QUERY_CANCELED, diag)
    if code in _CONNECTION or isinstance(exc, pymysql.err.InterfaceError):
        return DriverError(DriverFault.CONNECTION, diag)
    return DriverError(DriverFault.OTHER, diag)
