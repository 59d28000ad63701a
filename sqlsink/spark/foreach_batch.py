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
runs the partition writer (the database's ``Loading.write_partition``) in
every task, which prepares one transaction whose gid carries the part index, and
yields its outcome (one small row); the driver collects the outcomes. When every
part is prepared, the driver decides the batch once and commits it with the
``Committer``, exactly as the data source's commit does (binding, fencing by run
registration, forward-only check, checkpoint check when the checkpoint is known,
server checks). If a part fails, or the block raises, the batch is aborted like the
data source's abort: this run's transactions of the batch are rolled back unless
the batch is decided.

Identity (docs/DESIGN.md 1.5, docs/entry-points/foreach-batch.md): the query id, run id and
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
one snapshot (the PostgreSQL backend's consistent views).

Here the writer's face (``to``, ``batch``, ``skip``, ``wrap``); one batch's block is
``spark/batch.py``, each DataFrame's shape and Spark job ``spark/parts.py``, who writes
a batch ``spark/identity.py``, what this process knows of the hand-overs
``spark/handovers.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlsink.core.model import PartitionOutcome
from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions
from sqlsink.spark.handovers import HANDED, WATCHES
from sqlsink.spark.identity import PROCESS_RUNS, Identity, identify, in_stream

if TYPE_CHECKING:
    from sqlsink.spark.batch import Batch

log = logging.getLogger("sqlsink")


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
      CPU to insert (docs/performance.md); False writes the partitions as given;
    - ``query_id``: the streaming query's id, for launch paths where Spark's local
      properties are not readable (e.g. Spark Connect); inside a classic foreachBatch
      it must match Spark's, and is not needed;
    - ``schema_evolution``: the option ``schemaEvolution`` (``none``, ``addColumns``,
      ``widen``) for every table the writer writes;
    - ``dead_letter_table``: the option ``deadLetterTable`` for every table the writer
      writes (unqualified: in each table's schema);
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
        schema_evolution: str | None = None,
        dead_letter_table: str | None = None,
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
        self._trap_warned = False  # the key-order trap is said once per writer
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
        if schema_evolution is not None:  # the option schemaEvolution, for every table
            self.options["schemaEvolution"] = schema_evolution
        if dead_letter_table is not None:  # the option deadLetterTable, for every table
            self.options["deadLetterTable"] = dead_letter_table
        probe = self.sink_options("public.sqlsink_probe")  # option errors now, not at batch 0
        from sqlsink.spark.heartbeat import check_run_timeout

        check_run_timeout(probe)

    def process_run_id(self, query_id: str) -> str:
        """The weaker run identity, used only when Spark's run id is not readable: one per
        (process, sink, query), shared by every writer object of the sink (``ProcessRuns``);
        a writer unpickled in another process (Spark Connect runs foreachBatch in a Python
        worker of its server, one per query start) is in a run of that process."""
        return PROCESS_RUNS.get(self.sink_id, query_id)

    def identity(self, session: Any, batch_id: int) -> Identity:
        """The query, run and checkpoint of this batch; refuses rather than guesses. A run
        whose ids Spark gave has its end recorded when its query stops (``listener``)."""
        identity = identify(
            session,
            batch_id,
            sink_id=self.sink_id,
            query_id=self.query_id,
            checkpoint_location=self.checkpoint_location,
        )
        if identity.from_spark:
            from sqlsink.spark.listener import watch_writer

            watch_writer(session, identity.query_id, identity.run_id, self)
        return identity

    def warn_trap(self, batch_id: int, written: Sequence[PartitionOutcome | None]) -> None:
        """The key-order trap, per DataFrame (with order_by_key=False, or a table whose
        key the DataFrame does not write): said once per writer."""
        from sqlsink.core.key_ranges import trap_warning, unordered

        found = None if self._trap_warned else unordered(written)
        if found is not None:
            log.warning(trap_warning(self.sink_id, batch_id, *found))
            self._trap_warned = True

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
        if not in_stream(session, batch_id):
            return
        identity = self.identity(session, batch_id)
        if not HANDED.handed(self.sink_id, identity.run_id, batch_id):
            self.skip(batch_id)
