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
    if problem := userinfo_problem(text):
        raise ConfigError(problem)
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:
        raise ConfigError(
            f"invalid url {redact(url.strip().removeprefix('jdbc:'))!r}: a MariaDB or MySQL URL is "
            "mariadb://user:password@host:port/database (percent-encode special characters "
            "of the user and password: '%' as %25, '@' as %40, ':' as %3A, '/' as %2F, "
            "'?' as %3F, '#' as %23)"
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


# a query parameter's value, '@'s in it included ('?application_name=me@there'): such an
# '@' ends no user info
_QUERY_VALUE = re.compile(r"[?&][A-Za-z_][A-Za-z0-9_.-]*=[^&#?]*$")
_SPACE_THEN_AT = re.compile(r"(\s+)(\S*@)")  # whitespace, then a token holding an '@'


def _passwords(text: str) -> list[tuple[int, int]]:
    """Where the passwords of the URLs in ``text`` are: (start, end) of each, ':' and '@'
    excluded. A URL is ``scheme://`` and the characters up to whitespace; its user info
    ends at its last '@' (as a human reads ``mariadb://u:pa/ss@host/db``, whose unencoded
    '/', '#', '?' or '@' a parser takes for the end of the user info), not counting an '@'
    in a query parameter's value; its password starts after the user info's first ':'.
    A URL with a ':' but no '@' before whitespace goes on across it while the next token
    holds an '@' (``postgresql://u:pw\n@h/db``: a password read from a file with its
    newline): a text is rather hidden too much than a password shown."""
    found: list[tuple[int, int]] = []
    for match in re.finditer(r"://(\S*)", text):
        start, rest = match.start(1), match.group(1)
        ats = [i for i, c in enumerate(rest) if c == "@" and not _QUERY_VALUE.search(rest[:i])]
        if not ats and ":" in rest:
            end = match.end(1)
            for _ in range(3):  # at most three whitespace runs
                more = _SPACE_THEN_AT.match(text, end)
                if more is None:
                    break
                rest, end = text[start : more.end(2)], more.end(2)
                ats = [len(rest) - 1]
                if "@" in more.group(2)[:-1] or not _SPACE_THEN_AT.match(text, end):
                    break
        if not ats or ":" not in rest[: ats[-1]]:
            continue
        found.append((start + rest.index(":") + 1, start + ats[-1]))
    return found


def _without(text: str, spans: list[tuple[int, int]], put: str) -> str:
    for start, end in reversed(spans):
        text = text[:start] + put + text[end:]
    return text


def userinfo_problem(url: str) -> str | None:
    """Why ``url``'s user info cannot be read as written: whitespace in the URL (a
    password read from a file with its newline), or a '/', '?' or '#' in the user info,
    not percent-encoded, which ends it for every parser (libpq reads
    ``postgresql://u:pa/ss@h/db`` as host u, port pa) while a human reads it to the last
    '@'. None when there is none: no authority, an '@' of its own in the authority (the
    parsers read that one), an authority that is a host and a port
    (``postgresql://h:5432/db@x``: database ``db@x``), or no ':' (no password to
    mistake)."""
    text = url.strip().removeprefix("jdbc:")
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", text)
    if scheme is None:
        return None
    if re.search(r"\s", text):
        return (
            f"url '{scheme.group(1)}://…' holds whitespace (a space, tab or newline), which "
            "a URL cannot carry (not shown: it may be in the password): remove it (a "
            "password read from a file keeps its newline) or percent-encode it (%20 for a "
            "space, %0A for a newline)"
        )
    rest = text[scheme.end() :]
    cut = re.search(r"[/?#]", rest)
    if cut is None or cut.start() == 0 or "@" in rest[: cut.start()]:
        return None
    authority = rest[: cut.start()]
    if ":" not in authority or authority.rpartition(":")[2].isdigit():
        return None
    ats = [i for i, c in enumerate(rest) if c == "@" and not _QUERY_VALUE.search(rest[:i])]
    if not ats or ats[-1] < cut.start():
        return None
    return (
        f"url {redact(text)!r}: its user or password holds a {cut.group()!r} that is not "
        "percent-encoded, which ends the user and password for the URL's parser; "
        "percent-encode special characters of the user and password: '%' as %25, "
        "'@' as %40, ':' as %3A, '/' as %2F, '?' as %3F, '#' as %23"
    )


def drop_password(url: str) -> str:
    """The URL (or text) with each URL's password and its ':' left out, however unencoded."""
    return _without(url, [(start - 1, end) for start, end in _passwords(url)], "")


def redact(url: str) -> str:
    """The connection string (or any text quoting one) with any password replaced by
    '***', even one whose '/', '#', '?' or '@' is not percent-encoded."""
    url = _without(url, _passwords(url), "***")
    url = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url, flags=re.IGNORECASE)
    return re.sub(r"([?&]password=)[^&#\s]*", r"\1***", url, flags=re.IGNORECASE)
