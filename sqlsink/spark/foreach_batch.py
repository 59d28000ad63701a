"""The foreachBatch writer: the same protocol as the data source, driven from foreachBatch.

    writer = sqlsink.ForeachBatchWriter(url=URL, sink_id="orders")
    events.writeStream.foreachBatch(writer.to("public.orders")).start()

    def write(batch_df, batch_id):                  # several tables, one decision
        with writer.batch(batch_id) as b:
            b.append(batch_df.select("order_id", "total"), "public.orders")
            b.upsert(lines_df, "public.order_lines", key=["order_id", "line"])

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
``streaming.sql.batchId``), else from the ``query_id=`` argument with a run id made
by this writer's process; the checkpoint from ``checkpoint_location=``, else from
the running query. Without any query id the writer refuses.
"""

from __future__ import annotations

import logging
import pickle
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from sqlsink.core.model import PartitionOutcome
from sqlsink.errors import ConfigError
from sqlsink.options import Semantic, SinkOptions

log = logging.getLogger("sqlsink")

_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"
_RUN_ID = "spark.jobGroup.id"  # a streaming query's run id, set on its micro-batch thread
_OUTCOME_SCHEMA = "outcome binary"


@dataclass(frozen=True)
class Identity:
    """Who writes a batch: the streaming query, its run, and where its checkpoint is."""

    query_id: str
    run_id: str
    checkpoint: str | None
    from_spark: bool  # query and run ids read from Spark (else given and process-made)


class ForeachBatchWriter:
    """Exactly-once writes from ``foreachBatch`` into PostgreSQL tables.

    ``url`` and ``sink_id`` are required; the rest is optional:

    - ``checkpoint_location``: the query's checkpoint, for the checkpoint check (else
      read from the running query where this Spark offers it, else not checked);
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
        **options: str,
    ) -> None:
        from sqlsink.core.gid import check_sink_id

        self.url = url
        self.sink_id = check_sink_id(sink_id)
        self.checkpoint_location = checkpoint_location
        self.query_id = query_id
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
                    "ForeachBatchWriter: the option consistentView is not supported by the "
                    "foreachBatch writer yet (a batch may span several tables); use "
                    "format('sqlsink') for a consistent view"
                )
        self.options = dict(options)
        # the weaker run identity, used only when Spark's run id is not readable: one per
        # writer object (so per driver process), never reused
        self.process_run_id = uuid.uuid4().hex
        self.sink_options("public.sqlsink_probe")  # option errors now, not at batch 0

    def sink_options(
        self,
        table: str,
        *,
        mode: str = "append",
        key: Sequence[str] | None = None,
        delete_column: str | None = None,
        checkpoint: str | None = None,
    ) -> SinkOptions:
        opts = {**self.options, "url": self.url, "table": table, "sinkId": self.sink_id}
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
    ) -> Callable[[Any, int], None]:
        """The function for ``foreachBatch``: each batch into ``table``.

        ``mode="upsert"`` (with ``key``, else the table's primary key) is what update
        output mode needs: a key's newest row replaces the stored one."""
        self.sink_options(table, mode=mode, key=key, delete_column=delete_column)

        def write(batch_df: Any, batch_id: int) -> None:
            with self.batch(batch_id) as b:
                b.write(batch_df, table, mode=mode, key=key, delete_column=delete_column)

        return write

    def batch(self, batch_id: int) -> Batch:
        """A context in which several DataFrames form one batch: one decision for all."""
        return Batch(self, int(batch_id))

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
                return Identity(query, run, checkpoint, from_spark=True)
            return Identity(query, self.process_run_id, checkpoint, from_spark=False)
        if self.query_id is None:
            raise ConfigError(
                f"sink {self.sink_id!r}: no streaming query id: Spark's local property "
                f"{_QUERY_ID} is not set here (not inside foreachBatch of a streaming query, "
                "or a launch path such as Spark Connect that hides it) and no query_id= "
                "argument was given. sqlsink does not guess a writer identity: call it from "
                "foreachBatch, or pass ForeachBatchWriter(..., query_id=<the query's id>, "
                "checkpoint_location=<its checkpoint>)"
            )
        return Identity(self.query_id, self.process_run_id, self.checkpoint_location, False)


class Batch:
    """One batch of a ForeachBatchWriter: its parts are prepared by Spark jobs as they are
    given; leaving the block decides and commits them all, or aborts them all."""

    def __init__(self, writer: ForeachBatchWriter, batch_id: int) -> None:
        self.writer = writer
        self.batch_id = batch_id
        self.identity: Identity | None = None
        self.outcomes: list[PartitionOutcome | None] = []
        self.first_options: SinkOptions | None = None
        self.parts = 0
        self.planned = 0  # partitions of the batch's DataFrames so far: each holds a slot

    def __enter__(self) -> Batch:
        return self

    def append(self, df: Any, table: str) -> None:
        """Insert the DataFrame's rows into ``table``."""
        self.write(df, table, mode="append")

    def upsert(
        self,
        df: Any,
        table: str,
        key: Sequence[str] | None = None,
        delete_column: str | None = None,
    ) -> None:
        """Insert or replace by ``key`` (default: the table's primary key); rows whose
        ``delete_column`` is true delete their key instead."""
        self.write(df, table, mode="upsert", key=key, delete_column=delete_column)

    def write(
        self,
        df: Any,
        table: str,
        *,
        mode: str = "append",
        key: Sequence[str] | None = None,
        delete_column: str | None = None,
    ) -> None:
        """Prepare ``df`` into ``table`` as the next part of the batch (a Spark job)."""
        from sqlsink.core.gid import MAX_PART

        if self.parts > MAX_PART:
            raise ConfigError(f"a batch holds at most {MAX_PART + 1} DataFrames")
        writer = self.writer
        if self.identity is None:
            self.identity = writer.identity(df.sparkSession, self.batch_id)
            self._check_writer()
        options = writer.sink_options(
            table,
            mode=mode,
            key=key,
            delete_column=delete_column,
            checkpoint=self.identity.checkpoint,
        )
        if self.first_options is None:
            self.first_options = options
        df = _capped(df, options)
        self.planned += _check_slots(df, options, self.planned, self.batch_id)
        part, self.parts = self.parts, self.parts + 1
        self.outcomes += _prepare(df, options, self.identity, self.batch_id, part)

    def _check_writer(self) -> None:
        """Binding and forward-only checks before any job: a clear error, nothing written."""
        from sqlsink.core.committer import check_binding, check_forward
        from sqlsink.core.model import Binding
        from sqlsink.spark.datasource import _CommitterSession

        assert self.identity is not None
        options = self.writer.sink_options("public.sqlsink_probe")
        with _CommitterSession(options, self.writer.sink_id) as committer:
            backend, sink_id = committer.backend, self.writer.sink_id
            from sqlsink.postgres.checks import require_prepared_transactions
            from sqlsink.postgres.schema import ensure_schema

            if options.semantic is Semantic.EXACTLY_ONCE:  # the first error, before any DDL
                require_prepared_transactions(backend.conn)
            ensure_schema(backend.conn)
            highest = backend.highest_decided(sink_id)
            check_binding(
                sink_id, backend.binding(sink_id), highest, Binding.of(self.identity.query_id)
            )
            check_forward(sink_id, self.batch_id, highest)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.identity is None or self.first_options is None:
            return  # nothing was given: nothing prepared, nothing to decide
        if exc is None:
            self._commit(self.first_options, self.identity)
        else:
            self._abort(self.first_options, self.identity)

    def _commit(self, options: SinkOptions, identity: Identity) -> None:
        from sqlsink.postgres.checks import check_server, log_findings
        from sqlsink.spark.datasource import _CommitterSession

        sink_id = self.writer.sink_id
        checked = identity.checkpoint is not None
        try:
            with _CommitterSession(options, sink_id, check_checkpoint=checked) as committer:
                committer.commit_batch(
                    self.batch_id,
                    self.outcomes,
                    query_id=identity.query_id,
                    run_id=identity.run_id,
                )
                writes = [o.prepared_at - o.started_at for o in self.outcomes if o and o.gid]
                findings = check_server(
                    committer.backend.conn,
                    partitions=len(self.outcomes),
                    slowest_write_s=max(writes, default=None),
                    exactly_once=options.semantic is Semantic.EXACTLY_ONCE,
                )
                log_findings(findings, key=sink_id)
        except BaseException:
            self._abort(options, identity)
            raise

    def _abort(self, options: SinkOptions, identity: Identity) -> None:
        from sqlsink.spark.datasource import _CommitterSession

        try:
            with _CommitterSession(options, self.writer.sink_id) as committer:
                committer.abort_batch(
                    self.batch_id,
                    self.outcomes,
                    run_id=identity.run_id,
                    query_id=identity.query_id,
                )
        except Exception as exc:  # the original error matters more; recovery resolves later
            log.warning(
                "sqlsink %s: batch %d: the abort failed too (%s); the next batch or "
                "sqlsink recover resolves what it prepared",
                self.writer.sink_id,
                self.batch_id,
                exc,
            )
        if not identity.from_spark:
            # the run marked this batch aborted: a retry of it in this process must be a
            # new run (Spark's own run ends with the failed query, so it never retries)
            self.writer.process_run_id = uuid.uuid4().hex


def _capped(df: Any, options: SinkOptions) -> Any:
    """Option maxPartitions: each non-empty partition takes a connection and a
    prepared-transaction slot, so the DataFrame is coalesced to at most that many
    partitions (no shuffle; the work before it runs in as many tasks, which
    ``repartition(n)`` before the write avoids when it needs more)."""
    cap = options.max_partitions
    if cap is None:
        return df
    try:
        if int(df.rdd.getNumPartitions()) <= cap:
            return df
    except Exception:  # Spark Connect has no RDDs: coalesce anyway (fewer is a no-op)
        pass
    return df.coalesce(cap)


def _check_slots(df: Any, options: SinkOptions, before: int, batch_id: int) -> int:
    """Issue 12 item 12: every partition of the batch stays prepared until its commit, so
    a server with fewer prepared-transaction slots than the batch's partitions can never
    commit it. This writer knows the count before writing (the data source does not):
    refuse before any slot is taken. Returns this DataFrame's partition count."""
    from sqlsink.options import Semantic
    from sqlsink.postgres import appnames
    from sqlsink.postgres.checks import require_prepared_transactions
    from sqlsink.postgres.connection import connect

    try:
        partitions = int(df.rdd.getNumPartitions())
    except Exception:  # Spark Connect has no RDDs: the tasks' own check (53200) remains
        return 0
    if options.semantic is not Semantic.EXACTLY_ONCE:
        return partitions
    total = before + partitions
    if total <= _SLOTS_OK.get(options.url, 0):  # the slots only change with a restart
        return partitions
    with connect(options.url, options.password, application_name=appnames.PLANNER) as conn:
        try:
            require_prepared_transactions(conn, total)
        except ConfigError as exc:
            if exc.context.get("value") == "0":
                raise  # disabled: no partition count helps, the sentence says what does
            raise ConfigError(
                f"batch {batch_id}: {total} partitions planned (this DataFrame's {partitions}"
                + (f", after {before} of the batch's earlier DataFrames" if before else "")
                + f"), nothing written: {exc.message}; or write fewer partitions "
                "(the option maxPartitions, or batch_df.coalesce(n))",
                **exc.context,
            ) from None
    _SLOTS_OK[options.url] = total
    return partitions


# url -> the most partitions a batch was checked to have slots for (this process);
# the tasks' own error (SQLSTATE 53200) stays the backstop after a server restart
_SLOTS_OK: dict[str, int] = {}


def _prepare(
    df: Any, options: SinkOptions, identity: Identity, batch_id: int, part: int
) -> list[PartitionOutcome | None]:
    """One Spark job: every task prepares its partition; their outcomes, on the driver."""
    from sqlsink.spark.datasource import _plan_target

    target = _plan_target(options, df.schema, options.sink_id or "")
    sink_id = options.sink_id
    assert sink_id is not None
    query_id, run_id = identity.query_id, identity.run_id

    def prepare(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from sqlsink.postgres.partition import write_partition
        from sqlsink.spark.task import current_task

        task = current_task(sink_id, batch_id, run_id, query_id, part)
        outcome = write_partition(options, target, task, batches)
        yield pa.RecordBatch.from_pydict(
            {"outcome": [pickle.dumps(outcome)]}, schema=pa.schema([("outcome", pa.binary())])
        )

    rows = df.mapInArrow(prepare, _OUTCOME_SCHEMA).collect()
    outcomes: list[PartitionOutcome | None] = [pickle.loads(r["outcome"]) for r in rows]
    return outcomes


def _local_properties(session: Any) -> dict[str, str]:
    """Spark's local properties of this driver thread; empty where they are not readable
    (Spark Connect has no SparkContext on the client)."""
    try:
        context = session.sparkContext
        values = {name: context.getLocalProperty(name) for name in (_QUERY_ID, _RUN_ID, _BATCH_ID)}
    except Exception:  # no SparkContext here (Spark Connect): nothing to read
        return {}
    return {k: v for k, v in values.items() if v}


def _running_checkpoint(session: Any, query_id: str) -> str | None:
    """The resolved checkpoint of the running query, through the JVM (not a public API:
    guarded, None when this Spark does not offer it)."""
    try:
        from pyspark.sql import SparkSession

        sessions = [session, SparkSession.getActiveSession(), SparkSession.builder.getOrCreate()]
        for candidate in sessions:
            if candidate is None:
                continue
            query = candidate.streams.get(query_id)
            if query is not None:
                root = query._jsq.streamingQuery().resolvedCheckpointRoot()
                return str(root) if root else None
    except Exception as exc:  # an internal API: absent on other versions
        log.debug("sqlsink: the running query's checkpoint is not readable: %s", exc)
    return None
