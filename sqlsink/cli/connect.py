"""The commands' session: connecting, saying who we are, requiring the commit log."""

from __future__ import annotations

import os

from sqlsink.cli.contract import Envelope
from sqlsink.cli.output import CliError
from sqlsink.postgres import appnames
from sqlsink.postgres import status as st
from sqlsink.postgres.connection import Connection, connect
from sqlsink.postgres.schema import sql_dir

SCHEMA_FIX = (
    "the schema is created by the sink's first run (its role needs CREATE on the "
    f"database); or run the files of {sql_dir()} in order (001_commit_log.sql first) as "
    "the sink's role (setup_role.sql there sets up a least-privilege role). Check also "
    "that --url names the sink's database"
)


def open_connection(url: str, command: str) -> Connection:
    os.environ.setdefault("PGCONNECT_TIMEOUT", "10")
    return connect(url, application_name=appnames.cli(command))


def identify(conn: Connection, doc: Envelope) -> st.RoleInfo:
    """The role and database of the session, recorded in the document."""
    me = st.role_info(conn)
    doc["database"] = me.database
    doc["role"] = me.role
    doc["superuser"] = me.superuser
    return me


def require_schema(conn: Connection, me: st.RoleInfo) -> None:
    if st.schema_version(conn) == 0:
        raise CliError(
            f"the sqlsink schema (the commit log) is not installed in database {me.database}",
            SCHEMA_FIX,
        )
