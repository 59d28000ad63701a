"""Connections: conninfo from the options, application names, and secret redaction."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sqlsink.errors import ConfigError, TransientError

Connection = psycopg.Connection[tuple[Any, ...]]


def conninfo(url: str, password: str | None = None) -> str:
    """A libpq conninfo from a URI or key=value string (a 'jdbc:' prefix is accepted)."""
    if url.startswith("jdbc:"):
        url = url[len("jdbc:") :]
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"invalid url {redact(url)!r}: {scrub(str(exc), url)}") from None
    if password is not None:
        params["password"] = password
    params.setdefault("connect_timeout", "10")  # a dead host must not hang a task forever
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})  # type: ignore[arg-type]


def redact(url: str) -> str:
    """The connection string with any password replaced by '***'."""
    url = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", url)
    url = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url, flags=re.IGNORECASE)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def secrets_of(url: str, password: str | None = None) -> list[str]:
    found = [password] if password else []
    try:
        params: Mapping[str, object] = conninfo_to_dict(url.removeprefix("jdbc:"))
    except psycopg.ProgrammingError:
        return found
    if value := params.get("password"):
        found.append(str(value))
    return found


def scrub(text: str, url: str, password: str | None = None) -> str:
    """Remove every secret of the connection from a message."""
    for secret in secrets_of(url, password):
        if len(secret) >= 1:
            text = text.replace(secret, "***")
    return redact(text)


def connect(url: str, password: str | None = None, *, application_name: str) -> Connection:
    """An autocommit connection; failures become errors without secrets."""
    try:
        return psycopg.connect(
            conninfo(url, password), autocommit=True, application_name=application_name[:63]
        )
    except psycopg.OperationalError as exc:
        raise TransientError(
            f"cannot connect to PostgreSQL at {redact(url)}: {scrub(str(exc), url, password)}",
        ) from None
