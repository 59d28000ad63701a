"""Connection strings as the sink's entries take them (the option ``url``, the CLI's
``--url``): a URI or a ``key=value`` string in libpq's syntax, a ``jdbc:`` prefix
accepted, read by libpq's own parser (``psycopg.conninfo``: no server, no connection).
What the options need of a connection string, without a backend: its parameters, the
string with parameters set, and the string as it may be shown (never a password)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sqlsink.credentials import PasswordSource, known_passwords
from sqlsink.errors import ConfigError

# the schemes of a URL that names a PostgreSQL server (libpq's; jdbc:postgresql: as Spark's
# JDBC options write it); a key=value string has none
POSTGRES_SCHEMES = ("postgresql", "postgres")
# databases the sink's protocol is planned for but not built: refused by name
NOT_YET = {"mysql": "MySQL", "mariadb": "MariaDB"}


def scheme_problem(url: str) -> str | None:
    """Why the sink cannot write to the database ``url`` names, by its scheme alone (no
    server, no parse of the rest): None for a PostgreSQL URL or a key=value string."""
    match = re.match(r"\s*(?:jdbc:)?([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if match is None or match.group(1).lower() in POSTGRES_SCHEMES:
        return None
    scheme = match.group(1).lower()
    accepted = (
        "postgresql://, postgres://, jdbc:postgresql:// or a libpq key=value string "
        "('host=... dbname=...')"
    )
    if scheme in NOT_YET:
        return (
            f"url {shown(url)!r} names a {NOT_YET[scheme]} server: sqlsink writes to "
            f"PostgreSQL only (its XA backend for MariaDB and MySQL is not built yet); give "
            f"a PostgreSQL server's URL: {accepted}"
        )
    return f"url {shown(url)!r}: {scheme}:// is not a database sqlsink writes to; give {accepted}"


def params_of(url: str) -> dict[str, Any]:
    """The connection string's parameters; a ConfigError (quoting no secret) if unreadable."""
    url = url.removeprefix("jdbc:")
    try:
        return conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # libpq's message quotes the part it could not read, which may be the password,
        # and a string that cannot be parsed cannot be scrubbed reliably: say nothing of it
        raise ConfigError(
            f"invalid url {shown(url)!r}: it is neither a postgresql:// URI nor a key=value "
            "connection string that libpq can read. In a URI, percent-encode special "
            "characters of the user and password ('%' as %25, '@' as %40, ':' as %3A, "
            "'/' as %2F); in key=value form, quote values with spaces ('...'); or pass the "
            "password with the password option (or PGPASSWORD / .pgpass)"
        ) from None


def with_params(url: str, params: Mapping[str, str]) -> str:
    """The connection string with libpq parameters set (e.g. the TLS options: sslmode,
    sslrootcert, ...), overriding the URL's; unchanged when there are none."""
    if not params:
        return url
    merged = params_of(url) | dict(params)
    return make_conninfo(**{k: v for k, v in merged.items() if v is not None})


def shown(url: str) -> str:
    """The connection string as it may be shown: without any password, even unparsable."""
    url = url.removeprefix("jdbc:")
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        if "://" not in url:
            return "(a key=value connection string that cannot be parsed, not shown)"
        scheme, rest = url.split("://", 1)
        if "@" in rest:  # the user info may hold the password: keep only what follows it
            rest = "***@" + rest.rsplit("@", 1)[1]
        return redact(f"{scheme}://{rest}")
    return redact(url)


def redact(url: str) -> str:
    """The connection string with any password replaced by '***'."""
    url = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", url)
    url = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url, flags=re.IGNORECASE)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def without_password(url: str) -> tuple[str, bool]:
    """The connection string with any password left out (not masked: a fix line must be
    pasteable, the password then comes from PGPASSWORD or ~/.pgpass); whether one was."""
    if "://" in url:
        bare = re.sub(r"(://[^:/@?#]*):[^@/?#]*@", r"\1@", url)
        bare = re.sub(r"([?&])password=[^&#]*&?", r"\1", bare, flags=re.IGNORECASE)
        bare = re.sub(r"[?&]$", "", bare)
    else:
        pattern = r"\s*\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)"
        bare = re.sub(pattern, "", url, flags=re.IGNORECASE).strip()
    return bare, bare != url


def secrets_of(url: str, password: str | PasswordSource | None = None) -> list[str]:
    """The connection's secrets: its passwords, and every password a password command or
    provider returned in this process."""
    found = [password] if isinstance(password, str) and password else []
    found += sorted(known_passwords(), key=len, reverse=True)
    try:
        params: Mapping[str, object] = conninfo_to_dict(url.removeprefix("jdbc:"))
    except psycopg.ProgrammingError:
        return found
    if value := params.get("password"):
        found.append(str(value))
    return found
