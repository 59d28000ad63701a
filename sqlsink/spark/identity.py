"""Who writes a batch of the foreachBatch writer: the streaming query, its run and its
checkpoint (``Identity``), read from Spark's local properties on the driver thread that
runs the foreachBatch function, else from the query's checkpoint or the writer's
``query_id=`` with a run id this process makes (``PROCESS_RUNS``); whether a call runs
inside the stream (``in_stream``). Refuses rather than guesses (docs/DESIGN.md 1.5)."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from sqlsink.errors import ConfigError
from sqlsink.options import checkpoint_query_id

log = logging.getLogger("sqlsink")

_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"
_RUN_ID = "spark.jobGroup.id"  # a streaming query's run id, set on its micro-batch thread


class ProcessRuns:
    """The run id this process makes where Spark's is not readable (Spark Connect, a
    writer outside the stream): one per (sink, query) in the process, shared by every
    writer object of that sink and query, so that two writer objects of one sink in one
    foreachBatch function are one run (a second hand-over of a batch is refused, a batch
    skipped between their hand-overs is filled), never two. A new process (a restart of
    a Connect server's foreachBatch worker, an operator's script) makes a new one; so
    does an abort (``renew``): a retry of the batch in this process is a new run.
    Thread-safe (queries of one driver run their functions on their own threads)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def get(self, sink_id: str, query_id: str) -> str:
        with self._lock:
            return self._ids.setdefault((sink_id, query_id), uuid.uuid4().hex)

    def renew(self, sink_id: str, query_id: str, old: str) -> None:
        """The run ``old`` aborted a batch: the next hand-over is a new run (unless
        another thread renewed it already)."""
        with self._lock:
            if self._ids.get((sink_id, query_id)) == old:
                self._ids[(sink_id, query_id)] = uuid.uuid4().hex

    def clear(self) -> None:
        """Forget every run id (what a new process starts with)."""
        with self._lock:
            self._ids.clear()


PROCESS_RUNS = ProcessRuns()


@dataclass(frozen=True)
class Identity:
    """Who writes a batch: the streaming query, its run, and where its checkpoint is."""

    query_id: str
    run_id: str
    checkpoint: str | None
    from_spark: bool  # query and run ids read from Spark (else given and process-made)


def identify(
    session: Any,
    batch_id: int,
    *,
    sink_id: str,
    query_id: str | None,
    checkpoint_location: str | None,
) -> Identity:
    """The query, run and checkpoint of this batch for a writer of ``sink_id`` (its
    ``query_id=`` and ``checkpoint_location=`` arguments); refuses rather than guesses."""
    props = _local_properties(session)
    query, run, batch = props.get(_QUERY_ID), props.get(_RUN_ID), props.get(_BATCH_ID)
    if batch is not None and batch.isdigit() and int(batch) != batch_id:
        raise ConfigError(
            f"sink {sink_id!r}: called with batch id {batch_id}, but Spark is running "
            f"batch {batch} of its query: pass foreachBatch's own batch id"
        )
    if query:
        if query_id is not None and query_id != query:
            raise ConfigError(
                f"sink {sink_id!r}: query_id={query_id!r} was given, but this "
                f"foreachBatch runs in streaming query {query}: drop the argument"
            )
        checkpoint = checkpoint_location or _running_checkpoint(session, query)
        if run:
            check_job_group(sink_id, batch_id, run, _running_run_id(session, query))
            return Identity(query, run, checkpoint, from_spark=True)
        return Identity(query, PROCESS_RUNS.get(sink_id, query), checkpoint, from_spark=False)
    from_checkpoint = checkpoint_query_id(checkpoint_location)
    if query_id is not None and from_checkpoint not in (None, query_id):
        raise ConfigError(
            f"sink {sink_id!r}: query_id={query_id!r} was given, but the "
            f"checkpoint {checkpoint_location} belongs to query {from_checkpoint}: "
            "drop query_id"
        )
    given = query_id or from_checkpoint
    if given is None:
        raise ConfigError(
            f"sink {sink_id!r}: no streaming query id: Spark's local property "
            f"{_QUERY_ID} is not readable here (Spark Connect runs foreachBatch in a "
            "session that hides it, or this is not inside foreachBatch of a streaming "
            "query)"
            + (
                f", and the checkpoint {checkpoint_location} has no readable metadata file here"
                if checkpoint_location
                else ""
            )
            + ". sqlsink does not guess a writer identity: pass the query's checkpoint, "
            "ForeachBatchWriter(..., checkpoint_location=<the checkpointLocation of the "
            "query>) (its query id is read from it), or query_id=<the query's id>"
        )
    _refuse_off_thread(sink_id, session, given, batch_id)
    return Identity(given, PROCESS_RUNS.get(sink_id, given), checkpoint_location, False)


def _refuse_off_thread(sink_id: str, session: Any, query_id: str, batch_id: int) -> None:
    """Classic Spark, no local properties on this thread, yet the writer's query runs
    in this Spark session: the function handed the batch over on a thread of its own
    (a thread pool), which Spark's thread-local properties do not reach. Refused: the
    process-made run id there is not the query's run (the same at a restart in this
    process), and the call would pass for an operator's from outside the stream."""
    from sqlsink.spark.support import is_connect

    if session is not None and is_connect(session):
        return
    if not _query_active(session, query_id):
        return
    raise ConfigError(
        f"sink {sink_id!r}: the writer was called for batch {batch_id} on thread "
        f"{threading.current_thread().name!r}, which does not carry Spark's thread-local "
        f"properties ({_QUERY_ID}, {_RUN_ID}, {_BATCH_ID}), while its streaming query "
        f"{query_id} is running in this Spark session: a thread started inside the "
        "foreachBatch function (a concurrent.futures.ThreadPoolExecutor, a "
        "threading.Thread) does not inherit them, so the writer cannot tell the query's "
        "run (it would take the call for an operator's from outside the stream). Nothing "
        f"was written for batch {batch_id}. Fix: call the writer on foreachBatch's own "
        "thread, or run the thread's target through pyspark.inheritable_thread_target "
        "(pool.submit(inheritable_thread_target(target), ...)) or a "
        "pyspark.InheritableThread; an operator's writer.skip outside the stream waits "
        "until the query is stopped",
        sink_id=sink_id,
        batch=batch_id,
        query_id=query_id,
    )


def in_stream(session: Any, batch_id: int) -> bool:
    """Whether this runs inside foreachBatch for ``batch_id``: Spark's batch property on
    this driver thread says so. On Spark Connect it is not readable: inside only in the
    Connect server's foreachBatch worker (the process that runs the function); a Connect
    client's session (an operator's notebook, its ``writer.skip``) is outside."""
    from sqlsink.spark.support import is_connect

    if session is not None and is_connect(session):
        return in_connect_worker()
    return spark_batch_id(session) == batch_id


# the module Spark Connect's server runs (``python -m``) to call a foreachBatch function
CONNECT_WORKER = "pyspark.sql.connect.streaming.worker.foreach_batch_worker"


def in_connect_worker() -> bool:
    """Whether this process is a Spark Connect server's foreachBatch worker (its main
    module is PySpark's ``foreach_batch_worker``): the only Connect process inside a
    stream; a Connect client (a notebook, an operator's script) is not."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) == CONNECT_WORKER:
        return True
    path = str(getattr(main, "__file__", None) or "")
    return path.endswith(os.path.join("connect", "streaming", "worker", "foreach_batch_worker.py"))


def spark_batch_id(session: Any) -> int | None:
    """The batch Spark runs on this driver thread (inside foreachBatch), else None."""
    batch = _local_properties(session).get(_BATCH_ID) if session is not None else None
    return int(batch) if batch is not None and batch.isdigit() else None


def _local_properties(session: Any) -> dict[str, str]:
    """Spark's local properties of this driver thread; empty where they are not readable
    (Spark Connect has no SparkContext on the client)."""
    try:
        context = session.sparkContext
        values = {name: context.getLocalProperty(name) for name in (_QUERY_ID, _RUN_ID, _BATCH_ID)}
    except Exception:  # no SparkContext here (Spark Connect): nothing to read
        return {}
    return {k: v for k, v in values.items() if v}


def _running_query(session: Any, query_id: str) -> Any:
    """The running query of this id, through this session or the driver's (the session
    of foreachBatch's DataFrame may be a clone with its own query manager); None."""
    from pyspark.sql import SparkSession

    for candidate in (session, SparkSession.getActiveSession(), SparkSession.builder.getOrCreate()):
        if candidate is None:
            continue
        query = candidate.streams.get(query_id)
        if query is not None:
            return query
    return None


def _query_active(session: Any, query_id: str) -> bool:
    """Whether the query of this id is active in this process's classic Spark (a
    SparkContext runs here); False where there is none, or it is not readable."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:  # no classic Spark in this process
        return False
    try:
        query = _running_query(session, query_id)
        return query is not None and bool(query.isActive)
    except Exception as exc:  # e.g. a query_id= that is not a UUID
        log.debug("sqlsink: whether query %s is active is not readable: %s", query_id, exc)
    return False


def _running_checkpoint(session: Any, query_id: str) -> str | None:
    """The resolved checkpoint of the running query, through the JVM (not a public API:
    guarded, None when this Spark does not offer it)."""
    try:
        query = _running_query(session, query_id)
        if query is not None:
            root = query._jsq.streamingQuery().resolvedCheckpointRoot()
            return str(root) if root else None
    except Exception as exc:  # an internal API: absent on other versions
        log.debug("sqlsink: the running query's checkpoint is not readable: %s", exc)
    return None


def _running_run_id(session: Any, query_id: str) -> str | None:
    """The running query's run id (``StreamingQuery.runId``), None where not readable."""
    try:
        query = _running_query(session, query_id)
        return None if query is None else str(query.runId)
    except Exception as exc:
        log.debug("sqlsink: the running query's run id is not readable: %s", exc)
    return None


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


def check_job_group(sink_id: str, batch_id: int, group: str, running: str | None) -> None:
    """Spark sets the job group of a query's micro-batch thread to the query's run id,
    which the writer takes for the run's identity; a user's ``setJobGroup`` on that
    thread replaces it (its string is the same at every restart: a restart would look
    like the same run, its replay like a second write). Refused unless the job group is
    UUID-shaped and, where the running query's run id is readable, that very id."""
    if _UUID.fullmatch(group) and running in (None, group):
        return
    what = (
        f"not the running query's run id {running}"
        if running is not None
        else "not a streaming query's run id (a UUID)"
    )
    raise ConfigError(
        f"sink {sink_id!r}: Spark's job group on this foreachBatch thread is {group!r}, "
        f"{what}: a setJobGroup call on this thread (in the foreachBatch function, or code "
        "it calls) replaced the one Spark sets to the query's run id, which is the "
        "writer's identity of the run (with it, a restart would look like the same run). "
        f"Nothing was written for batch {batch_id}. Fix: don't call setJobGroup on the "
        "foreachBatch thread (sc.setJobDescription labels jobs without it), or restore "
        "Spark's before handing the batch to the writer: keep "
        "sc.getLocalProperty('spark.jobGroup.id') before your setJobGroup and call "
        "sc.setJobGroup(kept, ...) with it afterwards",
        sink_id=sink_id,
        batch=batch_id,
        job_group=group,
        run_id=running,
    )
