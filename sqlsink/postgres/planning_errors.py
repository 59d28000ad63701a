"""The server's refusals met at planning, in the sink's words: the raw driver error of a
read-only server, a missing schema, a missing privilege becomes a ConfigError that says
what is wrong and the statement or setting that fixes it (the planner raises it before
anything is written)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from psycopg import errors, sql

from sqlsink.conninfo import shown
from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection
from sqlsink.tablename import TableName


def _quoted(conn: Connection, *names: str) -> str:
    return sql.Identifier(*names).as_string(conn)


@contextmanager
def in_sinks_words(conn: Connection, url: str, table: TableName, create: bool) -> Iterator[None]:
    """Planning of ``table`` on ``conn`` (``create``: with the option createTable)."""
    try:
        yield
    except errors.ReadOnlySqlTransaction as exc:
        raise ConfigError(
            f"the server at {shown(url)} is read-only (a standby, or "
            "default_transaction_read_only is on for this database or role): the sink writes "
            f"its commit log and table {table} there, and nothing was written. Fix: give the "
            "primary's URL (with several hosts in the URL, add "
            "target_session_attrs=read-write), or turn default_transaction_read_only off "
            "for the sink's role"
        ) from exc
    except errors.InvalidSchemaName as exc:
        raise ConfigError(
            f"schema {table.schema} of table {table} does not exist"
            + (" (option createTable creates the table, not its schema)" if create else "")
            + f"; nothing was written. Fix: CREATE SCHEMA {_quoted(conn, table.schema)} "
            f"(as a role allowed to), or name an existing schema in the option table"
        ) from exc
    except errors.InsufficientPrivilege as exc:
        role = conn.info.user
        what = f"create table {table}" if create else f"plan its write into table {table}"
        grant = (
            f"GRANT CREATE ON SCHEMA {_quoted(conn, table.schema)} TO {_quoted(conn, role)}"
            if create
            else f"GRANT INSERT ON {_quoted(conn, table.schema, table.name)} TO "
            f"{_quoted(conn, role)}"
        )
        reason = exc.diag.message_primary or str(exc).splitlines()[0]
        raise ConfigError(
            f"role {role} may not {what} ({reason}); nothing was written. Fix: {grant}"
            + (", or create the table beforehand and drop createTable" if create else "")
            + " (sqlsink check --url URL lists what the sink's role needs)"
        ) from exc
