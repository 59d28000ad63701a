"""The commands' session: connecting, saying who we are, requiring the commit log."""

from __future__ import annotations

import os

from sqlsink.cli.contract import Envelope
from sqlsink.cli.output import CliError
from sqlsink.credentials import PasswordSource
from sqlsink.postgres import appnames
from sqlsink.postgres.connection import Connection, connect
from sqlsink.postgres.schema import sql_dir
from sqlsink.postgres.survey import decisions as pg_decisions
from sqlsink.postgres.survey import roles as pg_roles

SCHEMA_FIX = (
    "the schema is created by the sink's first run (its role needs CREATE on the "
    f"database); or run the files of {sql_dir()} in order (001_commit_log.sql first) as "
    "the sink's role (setup_role.sql there sets up a least-privilege role). Check also "
    "that --url names the sink's database"
)


def open_connection(url: str, command: str, password_command: str | None = None) -> Connection:
    """The command's session; with ``password_command`` (--password-command or
    $SQLSINK_PASSWORD_COMMAND) the password is that command's output."""
    os.environ.setdefault("PGCONNECT_TIMEOUT", "10")
    password = PasswordSource.from_command(password_command) if password_command else None
    return connect(url, password, application_name=appnames.cli(command))


def identify(conn: Connection, doc: Envelope) -> pg_roles.RoleInfo:
    """The role and database of the session, recorded in the document."""
    me = pg_roles.role_info(conn)
    doc["database"] = me.database
    doc["role"] = me.role
    doc["superuser"] = me.superuser
    return me


def require_schema(conn: Connection, me: pg_roles.RoleInfo) -> None:
    if pg_decisions.schema_version(conn) == 0:
        raise CliError(
            f"the sqlsink schema (the commit log) is not installed in database {me.database}",
            SCHEMA_FIX,
        )
