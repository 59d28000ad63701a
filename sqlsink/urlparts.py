"""The parts of a URL that names a MariaDB or MySQL server (``mariadb://``, ``mysql://``,
a ``jdbc:`` prefix accepted), read by ``urllib.parse`` (no server, no connection), and the
masking of any URL's password. Neutral: no database driver, so both the options
(``sqlsink.conninfo``) and the MariaDB backend read URLs through it."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from sqlsink.errors import ConfigError

# the schemes of a URL that names a MariaDB or MySQL server (the XA backend,
# sqlsink.mariadb), with the server's name in messages
MARIADB_SCHEMES = {"mariadb": "MariaDB", "mysql": "MySQL"}


def scheme_of(url: str) -> str | None:
    """The URL's scheme, lower case, without ``jdbc:``; None for a key=value string."""
    match = re.match(r"\s*(?:jdbc:)?([A-Za-z][A-Za-z0-9+.-]*)://", url)
    return None if match is None else match.group(1).lower()


def is_mariadb(url: str) -> bool:
    """Whether ``url`` names a MariaDB or MySQL server (``mariadb://``, ``mysql://``)."""
    return scheme_of(url) in MARIADB_SCHEMES


def mariadb_params(url: str) -> dict[str, Any]:
    """A ``mariadb://`` or ``mysql://`` URL's parts: user, password, host, port, dbname
    (None when absent) and the other query parameters; a ConfigError quoting no secret
    when it cannot be read."""
    text = url.strip().removeprefix("jdbc:")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:
        raise ConfigError(
            f"invalid url {redact(url.strip().removeprefix('jdbc:'))!r}: a MariaDB or MySQL URL is "
            "mariadb://user:password@host:port/database (percent-encode special characters "
            "of the user and password: '%' as %25, '@' as %40, ':' as %3A, '/' as %2F)"
        ) from None
    query = dict(urllib.parse.parse_qsl(parts.query))
    user = query.pop("user", None) or (
        urllib.parse.unquote(parts.username) if parts.username else None
    )
    password = query.pop("password", None) or (
        urllib.parse.unquote(parts.password) if parts.password is not None else None
    )
    database = urllib.parse.unquote(parts.path.lstrip("/")) or None
    return {
        "user": user,
        "password": password,
        "host": parts.hostname,
        "port": port,
        "dbname": database,
        **query,
    }


def redact(url: str) -> str:
    """The connection string with any password replaced by '***'."""
    url = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", url)
    url = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url, flags=re.IGNORECASE)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)
