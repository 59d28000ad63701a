"""The foreachBatch writer: the same protocol as the data source, driven from foreachBatch.

    writer = sqlsink.ForeachBatchWriter(url=URL, sink_id="orders")
    events.writeStream.foreachBatch(writer.to("public.orders")).start()

    def write(batch_df, batch_id):                  # several tables, one decision
        with writer.batch(batch_id) as b:
            b.append(batch_df.select("order_id", "total"), "public.orders")
            b.upsert(lines_df, "public.order_lines", key=["order_id", "line"])

    writer.to("public.orders", view="public.orders_whole")  # readers: whole batches only

    def write(batch_df, batch_id):                  # a batch with nothing for the sink
        if batch_df.isEmpty():
            return                                  # wrap() decides it empty
        ...
    events.writeStream.foreachBatch(writer.wrap(write)).start()

Every batch is handed to the writer exactly once: all DataFrames of a batch in one
``with writer.batch(batch_id)`` block (one decision for all), and a batch with nothing
for the sink through ``writer.skip(batch_id)`` or a block given nothing (an empty
decision); a function that may return early is given to foreachBatch as
``writer.wrap(function)``, which decides empty a batch it returned from without handing
it over. A second hand-over of a batch id by the same run (two ``to()`` calls, two
blocks, two writer objects with one ``sink_id``) finds the batch decided and would be
skipped like Spark's replay, so it is refused with a ``ConfigError`` before anything of
it is written; so is a replay that names a table the batch's decision lacks. A replay by
a new run (a restart) of a decided batch writes nothing, as before. Batches an unwrapped
function never hands to the writer (it returned early) are found when it hands a later
one: they are decided empty, with a warning, before it; a run's batches not handed
before the query stops, or before the run's first hand-over, are seen by nobody (the
restart's checkpoint check stops on them; skip each with ``writer.skip`` from a writer
with ``checkpoint_location=``, the query stopped): ``wrap`` leaves none.
The rules are ``sqlsink/core/writer_batch.py``'s.

Each DataFrame of a batch (a *part*) is written by one Spark job: ``mapInArrow``
runs the partition writer (``sqlsink.postgres.partition.write_partition``) in
every task, which prepares one transaction whose gid carries the part index, and
yields its outcome (one small row); the driver collects the outcomes. When every
part is prepared, the driver decides the batch once and commits it with the
``Committer``, exactly as the data source's commit does (binding, fencing by run
registration, forward-only check, checkpoint check when the checkpoint is known,
server checks). If a part fails, or the block raises, the batch is aborted like the
data source's abort: this run's transactions of the batch are rolled back unless
the batch is decided.

Identity (docs/DESIGN.md 1.5, README "The foreachBatch writer"): the query id, run id and
batch id come from Spark's local properties on the driver thread that runs the
foreachBatch function (``sql.streaming.queryId``, ``spark.jobGroup.id``,
``streaming.sql.batchId``), else (Spark Connect, or outside a stream) from the
query's checkpoint (``checkpoint_location=``, its ``metadata`` file) or the
``query_id=`` argument, with a run id made by the process the writer runs in; the
checkpoint from ``checkpoint_location=``, else from the running query. Without any
query id the writer refuses.

Consistent views (``view=`` per appended table, the data source's ``consistentView``):
the committer keeps each view of the batch before its decision; every view of the sink
hides the rows of its batches not yet complete, so views of several tables agree in any
one snapshot (``sqlsink.postgres.views``).

The batch and its parts are in ``spark/batch.py``, the shaping of each DataFrame and
its Spark job in ``spark/parts.py``.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlsink.core.writer_batch import HandedBatches
from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions, checkpoint_query_id

if TYPE_CHECKING:
    from sqlsink.spark.batch import Batch

log = logging.getLogger("sqlsink")

_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"
_RUN_ID = "spark.jobGroup.id"  # a streaming query's run id, set on its micro-batch thread

# the last batch each run handed to a writer of each sink in this process: every writer
# object of a sink adds to it, so that none decides empty a batch another one was handed
HANDED = HandedBatches()


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


class CallWatch:
    """The blocks of one batch of one sink during one wrapped call: whether one ended
    decided, the error of the last one if it ended undecided (a retry that decided after
    a failure clears it; a failure after a decision does not), how many are still open.
    Known whatever the run id (an abort renews the process's run id)."""

    def __init__(self, sink_id: str, batch_id: int) -> None:
        self.key = (sink_id, batch_id)
        self.open = 0
        self.decided = False
        self.error: BaseException | None = None


class CallWatches:
    """The wrapped calls running in this process (``wrap``); every ``Batch`` block of
    their (sink, batch) reports to them. Thread-safe."""

    def __init__(self) -> None:
        self._watches: list[CallWatch] = []
        self._lock = threading.Lock()

    def watch(self, sink_id: str, batch_id: int) -> CallWatch:
        watch = CallWatch(sink_id, batch_id)
        with self._lock:
            self._watches.append(watch)
        return watch

    def unwatch(self, watch: CallWatch) -> None:
        with self._lock:
            self._watches.remove(watch)

    def _of(self, sink_id: str, batch_id: int) -> list[CallWatch]:
        return [w for w in self._watches if w.key == (sink_id, batch_id)]

    def handed(self, sink_id: str, batch_id: int) -> None:
        """A block of the batch handed it to the writer."""
        with self._lock:
            for watch in self._of(sink_id, batch_id):
                watch.open += 1

    def ended(self, sink_id: str, batch_id: int, handed: bool, error: BaseException | None) -> None:
        """A block of the batch ended: decided (``error`` None) or not."""
        with self._lock:
            for watch in self._of(sink_id, batch_id):
                watch.open -= 1 if handed and watch.open else 0
                watch.decided = watch.decided or error is None
                watch.error = error


WATCHES = CallWatches()


@dataclass(frozen=True)
class Identity:
    """Who writes a batch: the streaming query, its run, and where its checkpoint is."""

    query_id: str
    run_id: str
    checkpoint: str | None
    from_spark: bool  # query and run ids read from Spark (else given and process-made)


class ForeachBatchWriter:
    """Exactly-once writes from ``foreachBatch`` into PostgreSQL tables.

    Give foreachBatch ``writer.wrap(function)`` when the function may return without
    handing a batch to the writer (``if batch_df.isEmpty(): return``): the wrapper
    decides such a batch empty when the function returns (an exception decides
    nothing). Unwrapped, a batch skipped last before the query stops, or before the
    run's first hand-over, is seen by nobody: the restart stops on it with a
    data-loss error until it is skipped (``writer.skip`` outside the stream).

    ``url`` and ``sink_id`` are required; the rest is optional:

    - ``checkpoint_location``: the query's checkpoint, for the checkpoint check (else
      read from the running query where this Spark offers it, else not checked);
    - ``order_by_key``: when the table has a primary key (or the upsert's key), each
      DataFrame is sorted by it within each partition before writing (upsert: also
      range-partitioned by it, so that a key is in one partition); ``repartition(n)``
      hands partitions their rows in random key order, which costs PostgreSQL 2-3x the
      CPU to insert (README "Benchmarks"); False writes the partitions as given;
    - ``query_id``: the streaming query's id, for launch paths where Spark's local
      properties are not readable (e.g. Spark Connect); inside a classic foreachBatch
      it must match Spark's, and is not needed;
    - ``options``: any other option of the data source, by its name (``password``,
      ``createTable``, ``lockTimeout``, ``runTimeout``, ``keepBatches``,
      ``checkpointCheck``, ``transactionTimeout``, ``semantic``, ...); ``maxPartitions``
      coalesces each DataFrame of a batch to at most that many partitions (each
      non-empty one takes a connection and a prepared-transaction slot).
    """

    def __init__(
        self,
        *,
        url: str,
        sink_id: str,
        checkpoint_location: str | None = None,
        query_id: str | None = None,
        order_by_key: bool = True,
        **options: str,
    ) -> None:
        from sqlsink.core.gid import check_sink_id
        from sqlsink.spark.support import require_foreach_batch

        require_foreach_batch()
        self.url = url
        self.sink_id = check_sink_id(sink_id)
        self.checkpoint_location = checkpoint_location
        self.query_id = query_id
        self.order_by_key = order_by_key
        self.trap_warned = False  # the key-order trap is said once per writer
        reserved = {"url", "table", "sinkid", "mode", "keycolumns", "deletecolumn"}
        given = sorted(k for k in options if k.lower() in reserved)
        if given:
            raise ConfigError(
                f"ForeachBatchWriter: {', '.join(given)} is not an option here: url and "
                "sink_id are arguments of the writer, the table, mode and key are given per "
                "DataFrame (to(table, mode=..., key=...), batch().append/upsert)"
            )
        for name in options:
            if name.lower() == "checkpointlocation":
                raise ConfigError(
                    "ForeachBatchWriter: pass the checkpoint as checkpoint_location=..., not "
                    f"{name}= (inside foreachBatch it is read from the running query anyway)"
                )
            if name.lower() == "consistentview":
                raise ConfigError(
                    "ForeachBatchWriter: a consistent view belongs to one table, so it is "
                    "given per table, not as a writer option: to(table, view=...) or "
                    "b.append(df, table, view=...). Views of one sink's tables show the same "
                    "whole batches"
                )
        self.options = dict(options)
        probe = self.sink_options("public.sqlsink_probe")  # option errors now, not at batch 0
        from sqlsink.spark.heartbeat import check_run_timeout

        check_run_timeout(probe)

    def process_run_id(self, query_id: str) -> str:
        """The weaker run identity, used only when Spark's run id is not readable: one per
        (process, sink, query), shared by every writer object of the sink (``ProcessRuns``);
        a writer unpickled in another process (Spark Connect runs foreachBatch in a Python
        worker of its server, one per query start) is in a run of that process."""
        return PROCESS_RUNS.get(self.sink_id, query_id)

    def sink_options(
        self,
        table: str,
        *,
        mode: str = "append",
        key: Sequence[str] | None = None,
        delete_column: str | None = None,
        checkpoint: str | None = None,
        view: str | None = None,
    ) -> SinkOptions:
        opts = {**self.options, "url": self.url, "table": table, "sinkId": self.sink_id}
        if view is not None:
            opts["consistentView"] = view
        opts["mode"] = mode
        if key:
            opts["keyColumns"] = ",".join(key)
        if delete_column:
            opts["deleteColumn"] = delete_column
        if checkpoint:
            opts["checkpointLocation"] = checkpoint
        return SinkOptions.parse(opts)

    def to(
        self,
        table: str,
        *,
        mode: str = "append",
        key: Sequence[str] | None = None,
        delete_column: str | None = None,
        view: str | None = None,
    ) -> Callable[[Any, int], None]:
        """The function for ``foreachBatch``: each batch into ``table``.

        ``mode="upsert"`` (with ``key``, else the table's primary key) is what update
        output mode needs: a key's newest row replaces the stored one. ``mode="replace"``
        is complete output mode's: the batch replaces every row of the table (``Batch.replace``).
        ``view`` (append only): a view of the table that shows whole batches only."""
        self.sink_options(table, mode=mode, key=key, delete_column=delete_column, view=view)

        def write(batch_df: Any, batch_id: int) -> None:
            with self.batch(batch_id) as b:
                b.write(batch_df, table, mode=mode, key=key, delete_column=delete_column, view=view)

        return write

    def batch(self, batch_id: int) -> Batch:
        """A context in which several DataFrames form one batch: one decision for all. A
        block given nothing decides an empty batch (as ``skip``)."""
        from sqlsink.spark.batch import Batch

        return Batch(self, int(batch_id))

    def skip(self, batch_id: int) -> None:
        """The batch has nothing for this sink: decide it empty (no rows, no transaction),
        with the same checks as a batch with rows. Inside foreachBatch, for a batch the
        function does not write (``if batch_df.isEmpty(): writer.skip(batch_id)``);
        outside the stream, for a batch Spark committed that the function did not hand
        over before the query stopped (the query stopped, ``checkpoint_location=`` given:
        the restart's checkpoint check then finds it decided). Outside the stream only a
        batch the checkpoint records as committed, with nothing of it prepared, is
        decided; any other is refused (``core/writer_batch.check_skip_outside``)."""
        with self.batch(batch_id):
            pass

    def wrap(self, function: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """The function for ``foreachBatch`` that calls ``function(batch_df, batch_id)``
        and, when it returns normally without having handed ``batch_id`` to a writer of
        this sink (``to()``, a ``batch()`` block, ``skip``), decides the batch empty (as
        ``skip``). An exception propagates and decides nothing. The way to write a
        function that may return early (``if batch_df.isEmpty(): return``): a batch it
        does not hand over is decided before Spark records it as committed, so no stop
        or restart after it ever finds it undecided. A function that returns normally
        although its hand-over of ``batch_id`` failed (it caught the writer's error) is
        refused with an error (``core/writer_batch.swallowed_error``), so that Spark does
        not record the batch committed without its rows."""

        def wrapped(batch_df: Any, batch_id: int) -> None:
            self._call_wrapped(function, batch_df, int(batch_id))

        return wrapped

    def _call_wrapped(self, function: Callable[[Any, int], None], df: Any, batch_id: int) -> None:
        """``wrap``'s call (a method: the process-wide ``WATCHES`` is not pickled with
        the wrapped function, which Spark Connect ships to its server)."""
        from sqlsink.core.writer_batch import swallowed_error

        watch = WATCHES.watch(self.sink_id, batch_id)
        try:
            function(df, batch_id)
        finally:
            WATCHES.unwatch(watch)
        if watch.error is not None or (watch.open and not watch.decided):
            raise swallowed_error(self.sink_id, batch_id, watch.error) from watch.error
        if not watch.decided:
            self._skip_unhanded(df.sparkSession, batch_id)

    def _skip_unhanded(self, session: Any, batch_id: int) -> None:
        """After a wrapped function returned: skip the batch unless this run handed it to
        a writer of the sink (``HANDED``). Only inside the stream (Spark runs this batch
        on this thread, or Spark Connect): outside it nothing is counted, nothing done."""
        from sqlsink.spark.batch import _in_stream

        if not _in_stream(session, batch_id):
            return
        identity = self.identity(session, batch_id)
        if not HANDED.handed(self.sink_id, identity.run_id, batch_id):
            self.skip(batch_id)

    def identity(self, session: Any, batch_id: int) -> Identity:
        """The query, run and checkpoint of this batch; refuses rather than guesses."""
        props = _local_properties(session)
        query, run, batch = props.get(_QUERY_ID), props.get(_RUN_ID), props.get(_BATCH_ID)
        if batch is not None and batch.isdigit() and int(batch) != batch_id:
            raise ConfigError(
                f"sink {self.sink_id!r}: called with batch id {batch_id}, but Spark is running "
                f"batch {batch} of its query: pass foreachBatch's own batch id"
            )
        if query:
            if self.query_id is not None and self.query_id != query:
                raise ConfigError(
                    f"sink {self.sink_id!r}: query_id={self.query_id!r} was given, but this "
                    f"foreachBatch runs in streaming query {query}: drop the argument"
                )
            checkpoint = self.checkpoint_location or _running_checkpoint(session, query)
            if run:
                check_job_group(self.sink_id, batch_id, run, _running_run_id(session, query))
                from sqlsink.spark.listener import watch_writer  # the run's end (issue 30)

                watch_writer(session, query, run, self)
                return Identity(query, run, checkpoint, from_spark=True)
            return Identity(query, self.process_run_id(query), checkpoint, from_spark=False)
        from_checkpoint = checkpoint_query_id(self.checkpoint_location)
        if self.query_id is not None and from_checkpoint not in (None, self.query_id):
            raise ConfigError(
                f"sink {self.sink_id!r}: query_id={self.query_id!r} was given, but the "
                f"checkpoint {self.checkpoint_location} belongs to query {from_checkpoint}: "
                "drop query_id"
            )
        given = self.query_id or from_checkpoint
        if given is None:
            raise ConfigError(
                f"sink {self.sink_id!r}: no streaming query id: Spark's local property "
                f"{_QUERY_ID} is not readable here (Spark Connect runs foreachBatch in a "
                "session that hides it, or this is not inside foreachBatch of a streaming "
                "query)"
                + (
                    f", and the checkpoint {self.checkpoint_location} has no readable "
                    "metadata file here"
                    if self.checkpoint_location
                    else ""
                )
                + ". sqlsink does not guess a writer identity: pass the query's checkpoint, "
                "ForeachBatchWriter(..., checkpoint_location=<the checkpointLocation of the "
                "query>) (its query id is read from it), or query_id=<the query's id>"
            )
        self._refuse_off_thread(session, given, batch_id)
        return Identity(given, self.process_run_id(given), self.checkpoint_location, False)

    def _refuse_off_thread(self, session: Any, query_id: str, batch_id: int) -> None:
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
            f"sink {self.sink_id!r}: the writer was called for batch {batch_id} on thread "
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
            sink_id=self.sink_id,
            batch=batch_id,
            query_id=query_id,
        )


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
