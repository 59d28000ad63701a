"""What the commands print: the human report, the JSON document, one-line errors.

Every byte goes through ``Output``, which replaces any password (of ``--url`` or
``PGPASSWORD``, in any of its spellings) by ``***``. Human output goes to stdout;
progress, notes and errors go to stderr.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import quote

from sqlsink.cli.contract import (
    JSON_VERSION,
    CommandName,
    Document,
    Envelope,
    NoticeJson,
    NoticeLevel,
    SessionJson,
)
from sqlsink.conninfo import is_mariadb, redact, secrets_of, shown, without_password
from sqlsink.core.admin import RoleInfo, Session
from sqlsink.credentials import known_passwords

EXIT_OK, EXIT_WARN, EXIT_ERROR, EXIT_LOSS = 0, 1, 2, 3


class CliError(Exception):
    """A failure reported as one line with its fix."""

    def __init__(self, message: str, fix: str | None = None, exit_code: int = EXIT_ERROR):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code


@dataclass
class Notice:
    level: NoticeLevel
    message: str
    fix: str | None = None
    sink_id: str | None = None

    def as_json(self) -> NoticeJson:
        return {
            "level": self.level,
            "sink_id": self.sink_id,
            "message": self.message,
            "fix": self.fix,
        }


class Output:
    """All output goes through here: no password ever leaves, whatever the text."""

    def __init__(self, json_mode: bool, url: str | None, stdout: TextIO, stderr: TextIO) -> None:
        self.json_mode = json_mode
        self.stdout = stdout
        self.stderr = stderr
        self.url = url or ""
        secrets = secrets_of(self.url, os.environ.get("PGPASSWORD"))
        variants: set[str] = set()
        for secret in secrets:
            variants |= {secret, quote(secret, safe=""), json.dumps(secret)[1:-1]}
        self.secrets = sorted((v for v in variants if v), key=len, reverse=True)

    def clean(self, text: str) -> str:
        for secret in sorted(known_passwords(), key=len, reverse=True):  # --password-command's
            for variant in (secret, quote(secret, safe=""), json.dumps(secret)[1:-1]):
                text = text.replace(variant, "***") if variant else text
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return redact(text)

    def line(self, text: str = "") -> None:
        """A line of the human report (nothing in JSON mode)."""
        if not self.json_mode:
            self.stdout.write(self.clean(text) + "\n")
            self.stdout.flush()

    def note(self, text: str) -> None:
        """Progress and notes on stderr (human mode only)."""
        if not self.json_mode:
            self.stderr.write(self.clean(text) + "\n")
            self.stderr.flush()

    def error(self, text: str) -> None:
        self.stderr.write(self.clean(text) + "\n")
        self.stderr.flush()

    def emit_json(self, doc: Document) -> None:
        # clean each string value, then dump: cleaning the dumped text could break its syntax
        text = json.dumps(self._clean_values(doc), indent=2, default=json_default)
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def _clean_values(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.clean(value)
        if isinstance(value, dict):
            return {k: self._clean_values(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._clean_values(v) for v in value]
        return value

    @property
    def shown_url(self) -> str:
        return self.clean(shown(self.url))

    @property
    def paste_url(self) -> str:
        """The URL for a command to paste, quoted for a shell: the password left out,
        not masked (a masked one cannot be pasted)."""
        bare, _ = without_password(self.url.removeprefix("jdbc:"))
        return "'" + self.clean(shown(bare)).replace("'", "'\\''") + "'"

    @property
    def session_word(self) -> str:
        """What the database calls a session's number: MariaDB/MySQL a connection id
        (``KILL CONNECTION``), PostgreSQL a pid."""
        return "connection" if is_mariadb(self.url) else "pid"

    @property
    def paste_note(self) -> str:
        """After a pasteable command: where its password comes from, if one was left out."""
        _, had = without_password(self.url.removeprefix("jdbc:"))
        if not had:
            return ""
        if is_mariadb(self.url):  # no password file or variable of its own: only these
            return "  (password: add it to --url, or pass --password-command)"
        return "  (password: from PGPASSWORD or ~/.pgpass)"


def json_default(value: object) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def new_envelope(command: CommandName, url: str | None) -> Envelope:
    return {
        "version": JSON_VERSION,
        "command": command,
        "url": url,
        "database": None,
        "role": None,
        "superuser": None,
        "warnings": [],
        "error": None,
        "exit_code": EXIT_OK,
    }


def session_json(s: Session) -> SessionJson:
    return {
        "pid": s.pid,
        "application_name": s.application_name,
        "user": s.user,
        "client": s.client,
        "state": s.state,
        "backend_start": s.backend_start,
    }


def fail(out: Output, doc: Envelope, message: str, fix: str | None, code: int = EXIT_ERROR) -> int:
    """Record the error in the document and say it on stderr, in one line."""
    doc["error"] = {"message": message, "fix": fix}
    text = f"sqlsink {doc['command']}: error: {message.rstrip('. ')}"
    if fix:
        text += f". Fix: {fix}"
    out.error(" ".join(text.split()))  # one line, whatever the server's message holds
    return code


def exit_code(warnings: Sequence[Notice], lost: bool = False, failed: bool = False) -> int:
    if lost:
        return EXIT_LOSS
    if failed:
        return EXIT_ERROR
    if any(w.level in ("warning", "error") for w in warnings):
        return EXIT_WARN
    return EXIT_OK


# -- the human report ---------------------------------------------------------------------


def lock_still_held(timeout_s: float, evidence: str, nothing: str) -> str:
    """recover's and forget's refusal when the sink's lock is still held after their
    --lock-timeout: the wait as given ('0.5s'), who holds it, what was not done."""
    return f"the sink's lock is still held after {timeout_s:g}s ({evidence}); {nothing}"


def lock_held_fix(command: str, end_session: str, declare: str = "") -> str:
    """The fix of ``lock_still_held``: run ``command`` again (its own --lock-timeout, not
    the sink's lockTimeout option); a holder stuck for longer: ``declare`` (recover's
    --force), or end its session (``ServerTerms.end_session``)."""
    return (
        f"a committer holds the lock while it commits (seconds), a recover while it works: "
        f"run {command} again, or with a longer --lock-timeout. A holder stuck for longer "
        f"is a paused or cut-off driver: {declare}end the session: {end_session}"
    )


def end_holders(end_session: str, holders: Sequence[int]) -> str:
    """``ServerTerms.end_session`` for these holders: its placeholder (MariaDB's connection
    ``id``, PostgreSQL's ``pid``) replaced by each holder's number; as it is without one."""
    for placeholder in ("pid", "id"):
        head, found, tail = end_session.rpartition(placeholder)
        if found and holders:
            return "; ".join(f"{head}{n}{tail}" for n in holders)
    return end_session


def header(out: Output, command: str, me: RoleInfo, extra: str = "") -> None:
    who = "superuser" if me.superuser else "not superuser"
    out.line(
        f"sqlsink {command} on {out.shown_url}: database {me.database}, role {me.role} "
        f"({who}){extra}"
    )


def print_warnings(out: Output, warnings: Sequence[Notice]) -> None:
    """Warnings and errors first, then the notes."""
    notes = [w for w in warnings if w.level == "info"]
    ordered = [w for w in warnings if w.level != "info"] + notes
    if not ordered:
        return
    out.line()
    for w in ordered:
        who = f"sink {w.sink_id}: " if w.sink_id else ""
        out.line(f"{w.level.upper()}: {who}{w.message}")
        if w.fix:
            out.line(f"    fix: {w.fix}")


def table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], right: Collection[int] = ()
) -> list[str]:
    """An aligned text table; the last column is left unpadded."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))

    def fmt(row: Sequence[str]) -> str:
        parts = []
        for i, c in enumerate(row):
            if i == len(row) - 1:
                parts.append(c)
            elif i in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    return [fmt(list(headers)), *(fmt(r) for r in cells)]


def format_age(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(sep=" ", timespec="seconds")
