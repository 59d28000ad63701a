"""The sink's log lines in the Spark driver's log, with no set-up by the user.

A batch's commit runs on the driver: with ``format("sqlsink")`` in a Python worker that
Spark starts (its logging never configured, so Python drops INFO), with the foreachBatch
writer in the user's own driver process (INFO dropped too unless the user set Python
logging up). Both write their standard error to the driver's: a local worker's is
copied into the JVM's, which is the driver's log on the console (and in a cluster's
driver log).

So, at each commit, when nothing in the process handles the ``sqlsink`` logger (no
handler on it or on the root logger, no level set on it), ``install`` gives it a handler
of its own: INFO and above to the process's standard error, in the layout of Spark's
log4j lines. It never touches the root logger nor any logger but ``sqlsink``, and it
steps aside by itself once the user configures logging (a handler on the root logger or
on ``sqlsink``, or a level on ``sqlsink``): from then on their configuration decides.
To keep the sink quiet, set a level on the logger (``logging.getLogger("sqlsink")
.setLevel(logging.WARNING)``) before the query starts. Spark's log4j is not used: a
Python worker has no gateway to the JVM.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TextIO

LOGGER = "sqlsink"
# as Spark's default log4j layout: "26/11/26 21:12:50 INFO sqlsink: ..."
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_DATE = "%y/%m/%d %H:%M:%S"
_lock = threading.Lock()


class _SparkLayout(logging.Formatter):
    """Spark's log4j layout, its level names too: WARN, not Python's WARNING."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno != logging.WARNING:
            return super().format(record)
        saved = record.levelname
        record.levelname = "WARN"
        try:
            return super().format(record)
        finally:
            record.levelname = saved


class _DriverLog(logging.StreamHandler):  # type: ignore[type-arg]
    """The sink's handler while nothing else is set up."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.setFormatter(_SparkLayout(_FORMAT, _DATE))
        self.setLevel(logging.INFO)


def _step_aside(record: logging.LogRecord) -> bool:
    """The logger's filter while the handler is in place: once the user has set logging
    up, remove the handler and let their levels judge this record and every later one."""
    handler = installed()
    if handler is None or not _configured(ignoring=handler):
        return True
    uninstall()
    return record.levelno >= logging.getLogger().getEffectiveLevel()


def _configured(ignoring: logging.Handler | None = None) -> bool:
    """Whether the user (or a framework) handles the sink's records: a handler on the
    ``sqlsink`` logger or on the root logger, or a level set on ``sqlsink``."""
    logger = logging.getLogger(LOGGER)
    own = [h for h in logger.handlers if h is not ignoring]
    if own or logging.getLogger().handlers:
        return True
    return ignoring is None and logger.level != logging.NOTSET


def installed() -> _DriverLog | None:
    return next((h for h in logging.getLogger(LOGGER).handlers if isinstance(h, _DriverLog)), None)


def install() -> bool:
    """Give the ``sqlsink`` logger its handler (INFO, standard error) unless something
    handles it already. True when the handler is in place after the call."""
    with _lock:
        if installed() is not None:
            return True
        if _configured():
            return False
        # the process's own standard error: a framework may swap sys.stderr for a while
        stream = sys.__stderr__ or sys.stderr
        handler = _DriverLog(stream)
        logger = logging.getLogger(LOGGER)
        logger.addHandler(handler)
        logger.addFilter(_step_aside)
        logger.setLevel(logging.INFO)
        return True


def uninstall() -> None:
    """Remove the handler and the level ``install`` set (nothing else)."""
    with _lock:
        handler = installed()
        if handler is None:
            return
        logger = logging.getLogger(LOGGER)
        logger.removeHandler(handler)
        logger.removeFilter(_step_aside)
        logger.setLevel(logging.NOTSET)
