"""A run's end in the commit log when its query stops (issue 30): Spark's
``StreamingQueryListener`` on the driver.

A streaming query that stops (``query.stop()``, the end of an ``availableNow`` trigger)
or fails tells the driver's listeners at once (``onQueryTerminated``, with the error for
a failure). The listener installed here records it on the run (``sqlsink.runs``,
schema version 10: ``run_registry.record_end``): when, how ('stopped' or 'failed'),
and the error's first line, bounded and with the connection's secrets scrubbed, so that
``sqlsink status`` says STOPPED or FAILED at once instead of LIVE until runTimeout. A
driver killed outright says nothing; ``status`` judges its run by its heartbeat.

One listener per query manager (a SparkSession's ``streams``), installed once
(``install``, idempotent): by ``sqlsink.register`` for ``format("sqlsink")`` and by the
foreachBatch writer at a batch's hand-over (``watch``). Which sinks a query writes:

- the foreachBatch writer says so (``watch``: its sink id and options, for the query);
- ``format("sqlsink")``: the options live in Spark's plan, not in the driver's Python,
  so the listener reads them from the query's analyzed plan through the JVM when the
  query ends (``WriteToMicroBatchDataSource.writeOptions``; not a public API: guarded,
  nothing is recorded where it is absent).

The run is Spark's run id (``event.runId``), which the data source's tasks and the
classic foreachBatch writer register with. What each Spark allows (docs/cli-json.md):
classic PySpark 3.5 and 4.x call a Python listener on the driver; Spark Connect 3.5
runs a listener on the server (pickled, no access to the client's state), 4.0 and later
on the client, where no plan is readable and the foreachBatch writer's run id is made by
its process, not Spark's: on Connect nothing is installed, and a run's end is judged by
its heartbeat as before.

The record never masks the query's own error: it is bounded (``connect_timeout``,
``run_registry.END_TIMEOUT``) and a failure to record is a logged warning.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.listener import StreamingQueryListener

if TYPE_CHECKING:
    from sqlsink.options import SinkOptions

log = logging.getLogger("sqlsink")

_lock = threading.Lock()
_installed: dict[int, SinkListener] = {}  # the JVM query manager's identity -> its listener


class SinkListener(StreamingQueryListener):
    """Records the end of the runs of sqlsink's sinks as their queries terminate."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._lock = threading.Lock()
        # (query id, run id) -> sink id -> options: by run, for a query restarted in this
        # process watches its new run before its old run's end comes off the listener bus
        self._watched: dict[tuple[str, str], dict[str, SinkOptions]] = {}
        self._queries: dict[tuple[str, str], Any] = {}  # its StreamingQuery, while it runs

    def watch(self, query_id: str, run_id: str, sink_id: str, options: SinkOptions) -> None:
        """The foreachBatch writer writes ``sink_id`` in this run of the query."""
        with self._lock:
            self._watched.setdefault((query_id, run_id), {})[sink_id] = options

    def onQueryStarted(self, event: Any) -> None:
        # kept to read a format("sqlsink") query's options at its end (the manager drops
        # a query before it reports the end); the plan is not analyzed yet here
        try:
            query = self._session.streams.get(str(event.id))
        except Exception as exc:  # never fail Spark's listener bus
            log.debug("sqlsink: query %s not readable at its start: %s", event.id, exc)
            return
        if query is not None:
            with self._lock:
                self._queries[(str(event.id), str(event.runId))] = query

    def onQueryProgress(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        query_id, run_id = str(event.id), str(event.runId)
        with self._lock:
            sinks = dict(self._watched.pop((query_id, run_id), {}))
            query = self._queries.pop((query_id, run_id), None)
        if query is not None:
            sinks.update(data_source_sink(query, query_id))
        error = getattr(event, "exception", None)
        for sink_id, options in sinks.items():
            record(options, sink_id, run_id, error)


def install(session: Any) -> SinkListener | None:
    """The session's listener, added to its query manager once; None on Spark Connect
    (module docstring) or where Spark has no Python listener."""
    from sqlsink.spark.support import is_connect

    if is_connect(session):
        return None
    try:
        key = int(session._jsparkSession.streams().hashCode())
    except Exception as exc:
        log.debug("sqlsink: no query manager to listen to: %s", exc)
        return None
    with _lock:
        listener = _installed.get(key)
        if listener is None:
            listener = _installed[key] = SinkListener(session)
            session.streams.addListener(listener)
    return listener


_watched_runs: set[tuple[str, str, str]] = set()  # (query, sink, run) the writer watches


def watch_writer(session: Any, query_id: str, run_id: str, writer: Any) -> None:
    """The foreachBatch writer's hand-over in a classic stream: the end of run ``run_id``
    of the query is recorded for ``sink_id``. Once per run; the listener goes on the
    query manager that runs the query (foreachBatch's DataFrame may have a session of its
    own). Never raises: the batch goes on without it."""
    sink_id = str(writer.sink_id)
    key = (query_id, sink_id, run_id)
    if key in _watched_runs:
        return
    from pyspark.sql import SparkSession

    try:
        for candidate in (session, SparkSession.getActiveSession()):
            if candidate is not None and candidate.streams.get(query_id) is not None:
                listener = install(candidate)
                if listener is not None:
                    # the connection's options: any table will do
                    listener.watch(query_id, run_id, sink_id, writer.sink_options("public.t"))
                break
    except Exception as exc:
        log.warning("sqlsink %s: its query's end will not be recorded: %s", sink_id, exc)
    _watched_runs.add(key)


def data_source_sink(query: Any, query_id: str) -> dict[str, SinkOptions]:
    """{sink id: options} of a ``format("sqlsink")`` query, read from its plan; {} for any
    other query, or where the plan is not readable."""
    from sqlsink.options import SinkOptions

    try:
        plan = query._jsq.streamingQuery().logicalPlan()
        if str(plan.table().name()) != "sqlsink":
            return {}
        given: dict[str, str] = {}
        entries = plan.writeOptions().iterator()
        while entries.hasNext():
            entry = entries.next()
            given[str(entry._1())] = str(entry._2())
        options = SinkOptions.parse(given)
    except Exception as exc:  # another sink, or an internal API this Spark lacks
        log.debug("sqlsink: the options of query %s are not readable: %s", query_id, exc)
        return {}
    return {options.sink_id or query_id: options}


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Warning): \S")
_WRAPPERS = ("org.apache.spark.", "py4j.", "java.", "pyspark.errors.", "Caused by:")


def first_line(error: str) -> str:
    """The error's own first line: Spark wraps a query's error in its own exceptions and
    a Python worker's traceback, so the line is the last ``Name: message`` line of
    Python's (the sink's error, or the one a task raised) when there is one, else the
    first line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    own = [line for line in lines if _ERROR_LINE.match(line) and not line.startswith(_WRAPPERS)]
    return (own[-1] if own else lines[0] if lines else "").strip()


def record(options: SinkOptions, sink_id: str, run_id: str, error: str | None) -> None:
    """One short statement from the driver; a failure is a warning, never raised."""
    from sqlsink.backends import open_database

    loading = open_database(options.url).loading()
    how = "stopped" if error is None else "failed"
    line = None if error is None else loading.scrub(first_line(error), options)
    try:
        recorded = loading.record_run_end(options, sink_id, run_id, how, line)
    except Exception as exc:
        log.warning(
            "sqlsink %s: could not record that run %s %s (%s); sqlsink status judges it by "
            "its heartbeat instead (dead after its runTimeout)",
            sink_id,
            run_id,
            how,
            loading.scrub(str(exc), options),
        )
        return
    log.info("sqlsink %s: run %s %s%s", sink_id, run_id, how, "" if recorded else " (not known)")
