"""Entry points: ``check_server``, the driver's check when a query starts, and the
logging of findings once per verdict."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass

from sqlsink.core.admin import Finding
from sqlsink.errors import ConfigError
from sqlsink.postgres.checks.model import DEFAULT_SAFETY_FACTOR, ERROR, OK
from sqlsink.postgres.checks.reading import read_settings
from sqlsink.postgres.checks.rules import analyse, prepared_slots
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
    finding = prepared_slots(mpt, settings, partitions, exactly_once=True)
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


@dataclass
class Measured:
    """What this process has measured of a sink's batches: the most partitions a batch had
    and the slowest partition write (BEGIN to PREPARE), in seconds."""

    partitions: int | None = None
    slowest_write_s: float | None = None
    rechecked_at: float | None = None  # time.monotonic() of the last check_after_commit read


# the re-check after a commit reads the server at least this often (seconds) even when
# nothing measured grew: the free connections and prepared-transaction slots it judges
# against a batch's partitions change with other users of the server
RECHECK_INTERVAL_S = 30.0
_MEASURED: dict[str, Measured] = {}  # key (as log_findings's) -> this process's measures


def measured(key: str) -> Measured:
    """What this process has measured for ``key`` so far (nothing yet: both None)."""
    return _MEASURED.get(key, Measured())


def _record_measures(key: str, partitions: int | None, slowest_write_s: float | None) -> bool:
    """Add a batch's measures to ``key``'s; whether either grew (a verdict on them may change:
    a longer write needs longer timeouts, more partitions more slots and connections)."""
    known = _MEASURED.setdefault(key, Measured())
    grew = False
    if partitions is not None and (known.partitions is None or partitions > known.partitions):
        known.partitions = partitions
        grew = True
    if slowest_write_s is not None and (
        known.slowest_write_s is None or slowest_write_s > known.slowest_write_s
    ):
        known.slowest_write_s = slowest_write_s
        grew = True
    return grew


def check_after_commit(
    conn: Connection,
    *,
    key: str,
    partitions: int,
    slowest_write_s: float | None,
    partition_cap: int | None,
    exactly_once: bool,
    interval_s: float = RECHECK_INTERVAL_S,
) -> list[Finding] | None:
    """The re-check after a batch's commit, with the batch's measures: when they grew past
    what this process measured before for ``key``, or ``interval_s`` after this process's
    last re-check of ``key``. Otherwise the check before the batch (``check_at_start``,
    at planning) judged the same settings with the same measures when it ran in this
    process, or, in a planning process of its own, it judged its own measures and logs
    through its own memory; so a steady stream reads the settings once per batch, not
    twice. Returns the findings, or None when nothing was read. ``partition_cap`` (option
    maxPartitions), when set, is the count judged, as before the batch."""
    grew = _record_measures(key, partitions, slowest_write_s)
    known = _MEASURED[key]
    now = time.monotonic()
    if not grew and known.rechecked_at is not None and now - known.rechecked_at < interval_s:
        return None
    known.rechecked_at = now
    findings = check_server(
        conn,
        partitions=partition_cap if partition_cap is not None else known.partitions,
        slowest_write_s=known.slowest_write_s,
        exactly_once=exactly_once,
    )
    log_findings(findings, key)
    return findings


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
    """The check before a batch's data (the planning of each batch): log the warnings
    through ``log_findings`` and raise ``ConfigError`` on an error, before any data is
    written. Judged with what this process has measured for ``key`` (``measured``) where
    the caller gives less, so that this check and ``check_after_commit`` reach the same
    verdict on the same settings: sharing ``log_findings``'s memory, two different
    verdicts would each be logged again at every batch."""
    known = measured(key)
    if partitions is None:
        partitions = known.partitions
    if known.slowest_write_s is not None:
        slowest_write_s = max(slowest_write_s or 0.0, known.slowest_write_s)
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
