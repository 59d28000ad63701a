"""Connections: conninfo from the options, application names, and secret redaction."""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from sqlsink.conninfo import (
    params_of,
    redact,
    scheme_problem,
    secrets_of,
    shown,
    wrong_backend,
)
from sqlsink.credentials import PasswordSource
from sqlsink.errors import ConfigError, TransientError

Connection = psycopg.Connection[tuple[Any, ...]]
# a password as given: none (the URL, PGPASSWORD, .pgpass), fixed, or asked for at connect
Password = str | PasswordSource | None


# Every wait on the network ends (docs/DESIGN.md invariant 11): a dead host fails the
# connect, and a half-open connection (a peer paused or gone without a FIN) is found
# by TCP keepalives within about a minute instead of the kernel's two hours, so its
# session, its locks and its advisory locks do not outlive it on the server either.
BOUNDED_WAITS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",  # ms: unacknowledged data for a minute ends the connection
}


def conninfo(url: str, password: str | None = None) -> str:
    """A libpq conninfo from a URI or key=value string (a 'jdbc:' prefix is accepted)."""
    params = params_of(url)
    if password is not None:
        params["password"] = password
    for name, value in BOUNDED_WAITS.items():  # unless the URL says otherwise
        params.setdefault(name, value)
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


def scrub(text: str, url: str, password: Password = None) -> str:
    """Remove every secret of the connection from a message."""
    for secret in secrets_of(url, password):
        if len(secret) >= 1:
            text = text.replace(secret, "***")
    return redact(text)


def connect(url: str, password: Password = None, *, application_name: str) -> Connection:
    """An autocommit connection; failures become errors without secrets.

    Every connection is checked for a pooler between it and PostgreSQL (one round trip
    when there is none), and one in transaction or statement pooling mode is refused
    with a ConfigError (``sqlsink.postgres.pooler``: the sink's advisory locks and its
    runs' identity need one server session per connection). A session pool is probed
    once per process every few minutes (a second client login and three round trips).
    psycopg's automatic server-side prepared statements are off on every connection,
    not only behind a pooler: no statement of the sink runs the 5 times it takes on
    one connection, so they would cost nothing to lose even where they are safe.

    A ``PasswordSource`` password is asked for here (cached per process); when the
    server refuses it (28P01: rotated since it was cached), a fresh one is asked for
    and the connect is tried once more.
    """
    from sqlsink.postgres import pooler

    wrong_database = scheme_problem(url) or wrong_backend(url)
    if wrong_database is not None:  # before libpq reads it as a malformed postgresql URI
        raise ConfigError(wrong_database)
    source = password if isinstance(password, PasswordSource) else None
    fixed = None if isinstance(password, PasswordSource) else password
    for attempt in (1, 2):
        info = conninfo(url, source.get(fresh=attempt > 1) if source else fixed)
        try:
            conn = psycopg.connect(
                info,
                autocommit=True,
                application_name=application_name[:63],
                **pooler.pooled_kwargs(),
            )
            break
        except psycopg.OperationalError as exc:
            refused = auth_failed(str(exc), exc.sqlstate)
            if source is not None and refused and attempt == 1:
                continue  # rotated since it was cached: ask again, bypassing the cache
            hint = ""
            if source is not None and refused:
                source.forget()
                hint = (
                    f" (the password from {source.describe()} was refused, a freshly "
                    "fetched one too: check that it returns the current password of the "
                    "URL's user)"
                )
            raise TransientError(
                f"cannot connect to PostgreSQL at {shown(url)}: "
                f"{why_not_connected(url, str(exc), exc.sqlstate)} "
                f"[{' '.join(scrub(str(exc), url, password).split())}]{hint}",
            ) from None
    try:
        pooler.check(conn, info, shown_url=shown(url))
    except psycopg.OperationalError as exc:
        conn.close()
        raise TransientError(
            f"lost the connection to PostgreSQL at {shown(url)} while checking for a "
            f"pooler: {scrub(str(exc), url, password)}",
        ) from None
    except BaseException:
        conn.close()
        raise
    return conn


def auth_failed(message: str, sqlstate: str | None = None) -> bool:
    """Whether a failed connect was the server refusing the password (28P01). libpq
    reports a failed login as text only, so the server's message is read too."""
    text = message.lower()
    return sqlstate == "28P01" or "password authentication failed" in text or "28p01" in text


def why_not_connected(url: str, text: str, sqlstate: str | None) -> str:
    """The cause of a failed connect in one sentence naming host:port, with its fix (the
    first thing a user reads of the error; libpq's own text follows it). No secret: only
    the host, port, user and database are named."""
    try:
        params = params_of(url)
    except ConfigError:
        params = {}
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    where = f"{host}:{params.get('port') or os.environ.get('PGPORT') or 5432}"
    user = params.get("user") or os.environ.get("PGUSER") or "(libpq's default user)"
    lowered = text.lower()
    if auth_failed(text, sqlstate):
        return (
            f"the server at {where} refused the login of user {user} (wrong password, or "
            "pg_hba.conf does not let this client in); fix: give the user's current password "
            "(option password, PGPASSWORD or ~/.pgpass), or allow the client in pg_hba.conf"
        )
    if "connection refused" in lowered or "no such file or directory" in lowered:
        return (
            f"nothing accepts connections at {where} (connection refused); fix: start "
            "PostgreSQL there, or correct the host and port in the url option (the "
            "server's listen_addresses and port settings say where it listens)"
        )
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        return f"the host name {host} is not known; fix: correct the host in the url option"
    if "timeout expired" in lowered or "timed out" in lowered:
        return (
            f"no answer from {where} within connect_timeout; fix: check the host and port "
            "in the url option, and that no firewall drops the connection"
        )
    if sqlstate == "3D000":
        return (
            f"the database {params.get('dbname') or '(default)'} does not exist at {where}; "
            "fix: create it, or correct the database in the url option"
        )
    return f"the server at {where} did not accept the connection; fix: see libpq's reason"
