"""Where a value comes from, and the statement that changes it there."""

from __future__ import annotations

import os

from sqlsink.postgres.checks.idents import database_sql, role_sql
from sqlsink.postgres.checks.model import ServerSettings, Setting


def describe_source(setting: Setting, settings: ServerSettings) -> str:
    """Where the effective value comes from, in words naming the role and database."""
    role, db = settings.role, settings.database
    source = setting.source
    if source == "default":
        return "default"
    if source == "configuration file":
        name = os.path.basename(setting.sourcefile) if setting.sourcefile else "configuration file"
        return f"server ({name})"
    if source == "command line":
        return "server (command line)"
    if source == "environment variable":
        return "server (environment variable)"
    if source == "global":
        return "all roles (ALTER ROLE ALL)"
    if source == "database":
        return f"database {db}"
    if source == "user":
        return f"role {role}"
    if source == "database user":
        return f"role {role} in database {db}"
    if source == "client":
        return "connection options (PGOPTIONS or options= in the URL)"
    if source == "session":
        return "session"
    return f"server ({source})"


def role_fix(name: str, value: str, settings: ServerSettings) -> str:
    return f"ALTER ROLE {role_sql(settings)} SET {name} = {value}"


def fix_statement(setting: Setting, value: str, settings: ServerSettings) -> str:
    """The statement that sets ``value`` (already SQL: '15min') where the current one comes
    from, so that it wins as the current one did."""
    role, db, name = role_sql(settings), database_sql(settings), setting.name
    source = setting.source
    if source == "database user":
        return f"ALTER ROLE {role} IN DATABASE {db} SET {name} = {value}"
    if source == "user":
        return f"ALTER ROLE {role} SET {name} = {value}"
    if source == "database":
        return f"ALTER DATABASE {db} SET {name} = {value}"
    if source == "global":
        return f"ALTER ROLE ALL SET {name} = {value}"
    if source == "client":
        return (
            f"remove -c {name}=... from the connection's options (the URL's options= "
            f"parameter or PGOPTIONS), or set -c {name}={value.strip(chr(39))} there"
        )
    if source == "session":
        return f"SET {name} = {value}"
    if source in ("default", "configuration file", "environment variable"):
        return f"ALTER SYSTEM SET {name} = {value}; SELECT pg_reload_conf();"
    # the command line (and anything more exotic) outranks ALTER SYSTEM: override per role
    return role_fix(name, value, settings)


def role_alternative(setting: Setting, value: str, settings: ServerSettings) -> str:
    """For a value set for everybody: how to change it for the sink's role only."""
    if setting.source in ("database user", "user", "session", "client"):
        return ""
    if setting.source == "command line":
        return (
            " (it is set on the server's command line, which ALTER SYSTEM does not override: "
            "the fix overrides it for the sink's role)"
        )
    return f"; to change it for the sink's role only: {role_fix(setting.name, value, settings)}"
