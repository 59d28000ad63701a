"""Connection strings as the sink's entries take them (the option ``url``, the CLI's
``--url``): for PostgreSQL a URI or a ``key=value`` string in libpq's syntax, read by
libpq's own parser (``psycopg.conninfo``: no server, no connection); for MariaDB and
MySQL a ``mariadb://`` or ``mysql://`` URI (user, password, host, port, database; a
``user``/``password`` query parameter as JDBC writes them), read by ``urllib.parse``.
A ``jdbc:`` prefix is accepted for each.
What the options need of a connection string, without a backend: its parameters, the
string with parameters set, and the string as it may be shown (never a password)."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from sqlsink.credentials import PasswordSource, known_passwords
from sqlsink.errors import ConfigError
from sqlsink.urlparts import (
    MARIADB_SCHEMES,
    drop_password,
    is_mariadb,
    mariadb_params,
    redact,
    scheme_of,
    userinfo_problem,
)

__all__ = [
    "MARIADB_SCHEMES",
    "default_schema",
    "is_mariadb",
    "mariadb_params",
    "params_of",
    "redact",
    "scheme_of",
    "scheme_problem",
    "secrets_of",
    "shown",
    "with_params",
    "without_password",
    "wrong_backend",
]

# the schemes of a URL that names a PostgreSQL server (libpq's; jdbc:postgresql: as Spark's
# JDBC options write it); a key=value string has none
POSTGRES_SCHEMES = ("postgresql", "postgres")
ACCEPTED = (
    "postgresql://, postgres://, jdbc:postgresql://, a libpq key=value string "
    "('host=... dbname=...'), mariadb://, mysql://, jdbc:mariadb:// or jdbc:mysql://"
)


def scheme_problem(url: str) -> str | None:
    """Why the sink cannot write to the database ``url`` names, by its scheme alone (no
    server, no parse of the rest), or why its user info cannot be read as written (an
    unencoded '/', '?' or '#': urlparts.userinfo_problem); None for a PostgreSQL, MariaDB
    or MySQL URL or a key=value string."""
    scheme = scheme_of(url)
    if scheme is None or scheme in POSTGRES_SCHEMES or scheme in MARIADB_SCHEMES:
        return userinfo_problem(url)
    return f"url {shown(url)!r}: {scheme}:// is not a database sqlsink writes to; give {ACCEPTED}"


def wrong_backend(url: str) -> str | None:
    """Why PostgreSQL's connection cannot take ``url``: it names a MariaDB or MySQL server
    (whose backend is sqlsink.mariadb); None otherwise."""
    scheme = scheme_of(url)
    if scheme not in MARIADB_SCHEMES:
        return None
    return (
        f"url {shown(url)!r} names a {MARIADB_SCHEMES[scheme]} server, which PostgreSQL's "
        "connection cannot open (sqlsink's MariaDB backend does)"
    )


def default_schema(url: str) -> str:
    """Where an unqualified table name is: PostgreSQL's ``public``; on MariaDB and MySQL
    (whose schemas are databases) the URL's database ("" when it names none)."""
    if is_mariadb(url):
        return str(mariadb_params(url)["dbname"] or "")
    return "public"


def params_of(url: str) -> dict[str, Any]:
    """The connection string's parameters; a ConfigError (quoting no secret) if unreadable."""
    if is_mariadb(url):
        return mariadb_params(url)
    url = url.removeprefix("jdbc:")
    if problem := userinfo_problem(url):
        raise ConfigError(problem)
    import psycopg  # libpq's parser: PostgreSQL's URLs only (the MariaDB backend lacks it)

    try:
        return psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # libpq's message quotes the part it could not read, which may be the password,
        # and a string that cannot be parsed cannot be scrubbed reliably: say nothing of it
        raise ConfigError(
            f"invalid url {shown(url)!r}: it is neither a postgresql:// URI nor a key=value "
            "connection string that libpq can read. In a URI, percent-encode special "
            "characters of the user and password ('%' as %25, '@' as %40, ':' as %3A, "
            "'/' as %2F, '?' as %3F, '#' as %23); in key=value form, quote values with "
            "spaces ('...'); or pass the "
            "password with the password option (or PGPASSWORD / .pgpass)"
        ) from None


def with_params(url: str, params: Mapping[str, str]) -> str:
    """The connection string with libpq parameters set (e.g. the TLS options: sslmode,
    sslrootcert, ...), overriding the URL's; unchanged when there are none."""
    if not params:
        return url
    if is_mariadb(url):
        raise ConfigError(
            f"the TLS options ({', '.join(sorted(params))}) are libpq's: sqlsink's MariaDB "
            "backend does not take them yet; leave them out for a mariadb:// or mysql:// url"
        )
    from psycopg.conninfo import make_conninfo

    merged = params_of(url) | dict(params)
    return make_conninfo(**{k: v for k, v in merged.items() if v is not None})


def shown(url: str) -> str:
    """The connection string as it may be shown: without any password, even unparsable."""
    url = url.removeprefix("jdbc:")
    if is_mariadb(url):
        return redact(url)
    import psycopg

    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        if "://" not in url:
            return "(a key=value connection string that cannot be parsed, not shown)"
        scheme, rest = url.split("://", 1)
        if "@" in rest:  # the user info may hold the password: keep only what follows it
            rest = "***@" + rest.rsplit("@", 1)[1]
        return redact(f"{scheme}://{rest}")
    return redact(url)


def without_password(url: str) -> tuple[str, bool]:
    """The connection string with any password left out (not masked: a fix line must be
    pasteable, the password then comes from PGPASSWORD or ~/.pgpass); whether one was."""
    if "://" in url:
        bare = drop_password(url)  # even one whose '/', '#', '?' or '@' is not encoded
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
    if is_mariadb(url):
        try:
            given = mariadb_params(url)["password"]
        except ConfigError:
            return found
        if given:  # as given and as it is written in the URL
            found += [str(given), urllib.parse.quote(str(given), safe="")]
        return found
    import psycopg

    try:
        params: Mapping[str, object] = psycopg.conninfo.conninfo_to_dict(url.removeprefix("jdbc:"))
    except psycopg.ProgrammingError:
        return found
    if value := params.get("password"):
        found.append(str(value))
    return found
