"""The commands' session: connecting, saying who we are, requiring the commit log.

The session is the database's (``sqlsink.core.admin.AdminSession``), opened through the
one entry ``sqlsink.backends.open_database`` for the URL's scheme."""

from __future__ import annotations

from sqlsink.backends import open_database
from sqlsink.cli.contract import Envelope
from sqlsink.cli.output import CliError
from sqlsink.core.admin import AdminSession, RoleInfo


def open_connection(url: str, command: str, password_command: str | None = None) -> AdminSession:
    """The command's session; with ``password_command`` (--password-command or
    $SQLSINK_PASSWORD_COMMAND) the password is that command's output."""
    return open_database(url).open_admin(url, command, password_command)


def identify(conn: AdminSession, doc: Envelope) -> RoleInfo:
    """The role and database of the session, recorded in the document."""
    me = conn.role_info()
    doc["database"] = me.database
    doc["role"] = me.role
    doc["superuser"] = me.superuser
    return me


def require_schema(conn: AdminSession, me: RoleInfo) -> None:
    if conn.schema_version() == 0:
        raise CliError(
            f"the sqlsink schema (the commit log) is not installed in database {me.database}",
            conn.schema_fix(),
        )


def checks_recorded(conn: AdminSession) -> bool:
    """Whether the commit log keeps the checkpoint check's verdicts (each database's
    schema numbering is its own)."""
    return conn.checkpoint_checks_recorded()
