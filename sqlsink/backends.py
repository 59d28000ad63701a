"""The one entry from a URL to the database the sink writes to, chosen by its scheme
(``postgresql://``, ``postgres://``, ``jdbc:postgresql:``, a libpq ``key=value``
string: PostgreSQL; ``mariadb://``, ``mysql://``, ``jdbc:mariadb:``, ``jdbc:mysql:``:
MariaDB and MySQL, on XA). The Spark adapters and the CLI import no backend module but
this one."""

from __future__ import annotations

from sqlsink.conninfo import is_mariadb, scheme_problem
from sqlsink.core.database import Database
from sqlsink.errors import ConfigError


def open_database(url: str) -> Database:
    """The database ``url`` names, by its scheme alone (no server, no connection);
    a scheme the sink does not write to is a ConfigError naming the accepted ones."""
    problem = scheme_problem(url)
    if problem is not None:
        raise ConfigError(problem)
    if is_mariadb(url):
        from sqlsink.mariadb.entry import MARIADB

        return MARIADB
    from sqlsink.postgres.entry import POSTGRESQL

    return POSTGRESQL
