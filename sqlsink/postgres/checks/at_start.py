"""Entry points: ``check_server``, the driver's check when a query starts, and the
logging of findings once per verdict."""

from __future__ import annotations

import logging
from collections.abc import Iterable, MutableMapping, Sequence

from sqlsink.errors import ConfigError
from sqlsink.postgres.checks.model import DEFAULT_SAFETY_FACTOR, ERROR, OK, Finding
from sqlsink.postgres.checks.reading import read_settings
from sqlsink.postgres.checks.rules import _prepared_slots, analyse
from sqlsink.postgres.connection import Connection


def check_server(
    conn: Connection,
    *,
    trigger_interval_s: float | None = None,
    partitions: int | None = None,
    slowest_write_s: float | None = None,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
    exactly_once: bool = True,
) -> list[Finding]:
    """``read_settings`` then ``analyse``: the findings for this connection's role and database."""
    return analyse(
        read_settings(conn),
        trigger_interval_s=trigger_interval_s,
        partitions=partitions,
        slowest_write_s=slowest_write_s,
        safety_factor=safety_factor,
        exactly_once=exactly_once,
    )


def max_prepared_transactions(conn: Connection) -> int:
    row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    return int(row[0]) if row else 0


def require_prepared_transactions(conn: Connection, partitions: int | None = None) -> None:
    """Exactly-once needs PREPARE TRANSACTION: fail before any data is written if it is off
    (or, with ``partitions``, has fewer slots than a batch's partitions)."""
    settings = read_settings(conn)
    mpt = settings.settings["max_prepared_transactions"]
    finding = _prepared_slots(mpt, settings, partitions, exactly_once=True)
    if finding.level == ERROR:
        raise ConfigError(
            _as_error(finding, server_address(conn)), setting=finding.setting, value=finding.value
        )


def server_address(conn: Connection) -> str:
    """host:port of the server, as the connection reached it (never a secret)."""
    info = conn.info
    return f"{info.host}:{info.port}"


def _as_error(finding: Finding, server: str | None = None) -> str:
    """A finding as an error's text: the sentence first (naming the server when known),
    then the setting and its source, then the fix."""
    message = finding.message
    if server:
        message = message.replace("on this server", f"on this server ({server})", 1)
    text = f"{message} [{finding.setting} = {finding.value}, from {finding.source}]"
    return f"{text}; fix: {finding.fix}" if finding.fix else text


Verdict = frozenset[tuple[str, str, str, str]]
VerdictState = MutableMapping[str, Verdict]
_VERDICTS: dict[str, Verdict] = {}  # the default state: this Python process's


def verdict(findings: Iterable[Finding]) -> Verdict:
    """What is wrong, as a comparable value: (level, setting, value, source) of each
    warning and error ("ok" findings do not count)."""
    return frozenset((f.level, f.setting, f.value, f.source) for f in findings if f.level != OK)


def log_findings(
    findings: Sequence[Finding],
    key: str,
    logger: logging.Logger | None = None,
    state: VerdictState | None = None,
) -> bool:
    """Log the warnings and errors, unless the same verdict was logged last for ``key``.

    Intended use: the sink checks the server when a query starts and, cheaply, at later
    batches (with the slowest write measured so far); it calls this with the sink id (or
    query id) as ``key`` every time, and the log shows the problems once per query start
    and again only when they change, not once per batch. When the problems go away, one
    INFO line says so. ``state`` holds the last verdict per key: pass a dict the caller
    keeps for as long as the warnings should not repeat (the driver's query object, say);
    by default it is this process's, and a fresh Python worker starts empty, which logs
    again, as a new query start should. Returns whether anything was logged.
    """
    log = logger or logging.getLogger("sqlsink")
    memory = _VERDICTS if state is None else state
    new = verdict(findings)
    old = memory.get(key)
    if old == new:
        return False
    memory[key] = new
    if not new:
        if old:
            log.info("sqlsink %s: the server settings reported before are now fine", key)
            return True
        return False
    for f in findings:
        if f.level == OK:
            continue
        log.log(
            logging.ERROR if f.level == ERROR else logging.WARNING,
            "sqlsink %s: %s = %s (%s): %s%s",
            key,
            f.setting,
            f.value,
            f.source,
            f.message,
            f"; fix: {f.fix}" if f.fix else "",
        )
    return True


def check_at_start(
    conn: Connection,
    *,
    key: str,
    trigger_interval_s: float | None = None,
    partitions: int | None = None,
    slowest_write_s: float | None = None,
    exactly_once: bool = True,
    logger: logging.Logger | None = None,
    state: VerdictState | None = None,
) -> list[Finding]:
    """The driver's check when a query starts (or later, with what it has measured): log the
    warnings through ``log_findings`` and raise ``ConfigError`` on an error, before any
    data is written."""
    findings = check_server(
        conn,
        trigger_interval_s=trigger_interval_s,
        partitions=partitions,
        slowest_write_s=slowest_write_s,
        exactly_once=exactly_once,
    )
    log_findings(findings, key, logger, state)
    errors = [f for f in findings if f.level == ERROR]
    if errors:
        server = server_address(conn)
        raise ConfigError(
            " | ".join(_as_error(f, server) for f in errors),
            setting=errors[0].setting,
            value=errors[0].value,
        )
    return findings
