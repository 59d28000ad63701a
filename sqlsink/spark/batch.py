"""One batch of the foreachBatch writer: its DataFrames (parts) are prepared by Spark
jobs as they are given (``spark/parts.py``); leaving the ``with`` block decides and
commits them all with the ``Committer``, or aborts them all (docs/DESIGN.md 1.5). A
block given nothing decides an empty batch. Before the first job (or the empty
decision) the batch is handed over: batches of the run never handed to the writer are
decided empty, and a part of a batch already decided is a replay or refused
(``sqlsink/core/writer_batch.py``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from sqlsink.core.model import Decision, PartitionOutcome
from sqlsink.core.writer_batch import PartStart
from sqlsink.errors import ConfigError
from sqlsink.options import Mode, Semantic, SinkOptions
from sqlsink.spark.handovers import HANDED, WATCHES
from sqlsink.spark.identity import PROCESS_RUNS, Identity, in_stream
from sqlsink.tablename import TableName

if TYPE_CHECKING:
    from sqlsink.core.loading import SchemaChanges
    from sqlsink.spark.plan import CommitterSession

log = logging.getLogger("sqlsink")


class Writer(Protocol):
    """What a batch asks of the writer whose block it is (``ForeachBatchWriter``): the
    sink, its options for a table, who writes the batch, and the once-per-writer notice
    of the key-order trap. The writer's state stays the writer's."""

    @property
    def sink_id(self) -> str: ...

    @property
    def order_by_key(self) -> bool: ...

    def sink_options(
        self,
        table: str,
        *,
        mode: str = ...,
        key: Sequence[str] | None = ...,
        delete_column: str | None = ...,
        checkpoint: str | None = ...,
        view: str | None = ...,
    ) -> SinkOptions: ...

    def identity(self, session: Any, batch_id: int) -> Identity: ...

    def warn_trap(self, batch_id: int, written: Sequence[PartitionOutcome | None]) -> None: ...


class Batch:
    """One batch of a ForeachBatchWriter: its parts are prepared by Spark jobs as they are
    given; leaving the block decides and commits them all, or aborts them all."""

    def __init__(self, writer: Writer, batch_id: int) -> None:
        self.writer = writer
        self.batch_id = batch_id
        self.identity: Identity | None = None
        self.outcomes: list[PartitionOutcome | None] = []
        self.first_options: SinkOptions | None = None
        self.parts = 0
        self.tables: list[str] = []  # the batch's tables, in the order first given
        # the tables whose rows a part prepared, each with the first such part: their
        # prepared transactions hold the table until the batch's decision
        self.holding: dict[str, int] = {}
        self.planned = 0  # partitions of the batch's DataFrames so far: each holds a slot
        # the consistent views the batch's parts name: view -> its table (kept at commit)
        self.views: dict[TableName, TableName] = {}
        # the tables its parts upserted or replaced so far, each with its part and mode
        self.rewritten: dict[TableName, tuple[int, Mode]] = {}
        self.decision: Decision | None = None  # the batch's decision when it was handed over
        self.start: PartStart | None = None  # what its parts do (core/writer_batch.py)
        self.handed_before = False  # this run handed this batch over before, in this process
        # whether the batch runs inside the stream's foreachBatch (``in_stream``), as the
        # hand-over found it
        self.in_stream = False
        self.began = False  # the hand-over began (``WATCHES``: a wrapped call sees it)
        self.committed = False  # the batch's commit returned (its decision is made)

    def __enter__(self) -> Batch:
        return self

    def append(self, df: Any, table: str, *, view: str | None = None) -> None:
        """Insert the DataFrame's rows into ``table``. ``view``: a view of ``table`` for
        readers that shows whole batches only (the data source's ``consistentView``),
        created at the batch's commit; views of the sink's tables agree."""
        self.write(df, table, mode="append", view=view)

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

    def replace(self, df: Any, table: str) -> None:
        """Replace every row of ``table`` by the DataFrame's (complete output mode): one
        partition (the DataFrame is coalesced to one) deletes the table's rows and loads
        its own in one transaction, committed with the batch's decision. Readers see the
        old rows until then, the new ones after (one transaction: no half state); other
        writers of the table wait on its rows from the delete until the commit."""
        self.write(df, table, mode="replace")

    def write(
        self,
        df: Any,
        table: str,
        *,
        mode: str = "append",
        key: Sequence[str] | None = None,
        delete_column: str | None = None,
        view: str | None = None,
    ) -> None:
        """Prepare ``df`` into ``table`` as the next part of the batch (a Spark job)."""
        from sqlsink.core.gid import MAX_PART

        if self.parts > MAX_PART:
            raise ConfigError(f"a batch holds at most {MAX_PART + 1} DataFrames")
        writer = self.writer
        identity = self._hand_over(df.sparkSession)
        options = writer.sink_options(
            table,
            mode=mode,
            key=key,
            delete_column=delete_column,
            checkpoint=identity.checkpoint,
            view=view,
        )
        self._judge(str(options.table))  # a second write, or a replay: before any job
        from sqlsink.spark.plan import check_part  # views vs the batch's other parts

        check_part(
            options,
            sink_id=writer.sink_id,
            batch_id=self.batch_id,
            part=self.parts,
            views=self.views,
            rewritten=self.rewritten,
        )
        self._add_view(options)
        if self.first_options is None:
            self.first_options = options
        if str(options.table) not in self.tables:
            self.tables.append(str(options.table))
        from sqlsink.spark.parts import (
            by_key,
            capped,
            check_slots,
            one_partition,
            partition_count,
            prepare_part,
        )
        from sqlsink.spark.plan import plan_write

        before_changes = None
        held_by = self.holding.get(str(options.table))
        if held_by is not None:  # an earlier part's transactions hold the table
            before_changes = partial(self._refuse_changes, options.table, held_by)
        target = plan_write(
            options, df.schema, options.sink_id or "", before_changes=before_changes
        )
        count = partition_count(df)
        if options.mode is Mode.REPLACE:
            df, count = one_partition(df, count), 1
        else:
            df, count = capped(df, options, count)
            if writer.order_by_key and target.key:
                df = by_key(df, target.key, options, count)
        self.planned += check_slots(count, options, self.planned, self.batch_id)
        part, self.parts = self.parts, self.parts + 1
        # the run is heard from while the batch is open: from a driver thread until the
        # block exits, and now before a part after the first (part 0's tasks register
        # it themselves; spark/heartbeat.py, invariant 10)
        from sqlsink.spark import heartbeat

        heartbeat.before_job(self, options, writer.sink_id, identity.run_id, identity.query_id)
        written = prepare_part(df, options, target, identity, self.batch_id, part)
        self.outcomes += written
        if any(o is not None and o.gid is not None and not o.skipped for o in written):
            self.holding.setdefault(str(options.table), part)
        self.writer.warn_trap(self.batch_id, written)

    def _refuse_changes(self, table: TableName, written_by: int, evolution: SchemaChanges) -> None:
        """Part ``written_by`` of this batch prepared rows of ``table``: its transactions
        hold the table until the batch's own decision, so an ALTER of it now would wait
        for them until its lock wait gives up (and they are not a dead run's)."""
        changes = [f"add column {name!r}" for name, _ in evolution.additions]
        changes += [f"widen column {w.column!r} to {w.new_type}" for w in evolution.widenings]
        raise ConfigError(
            f"sink {self.writer.sink_id!r}: part {self.parts} of batch {self.batch_id} would "
            f"alter table {table} ({'; '.join(changes)}: schemaEvolution), but part "
            f"{written_by} of this batch wrote rows to it: its prepared transactions hold "
            "the table until the batch's decision, so the ALTER TABLE cannot run now. "
            "Nothing was changed; nothing of the batch is committed. Fix: give the "
            "DataFrame with the new columns or types first among the batch's parts "
            "writing the table",
            batch=self.batch_id,
            table=str(table),
        )

    def _add_view(self, options: SinkOptions) -> None:
        """A view names one table, in every part of the batch that gives it."""
        view, table = options.consistent_view, options.table
        if view is None:
            return
        other = self.views.setdefault(view, table)
        if other != table:
            raise ConfigError(
                f"sink {self.writer.sink_id!r}: batch {self.batch_id}: view {view} is given "
                f"for table {other} and for table {table}: a consistent view shows one table. "
                "Name a view per table. Nothing of the batch is committed"
            )

    def _hand_over(self, session: Any) -> Identity:
        """Once per batch, before its first job or its empty decision: who writes it,
        the binding and forward-only checks, this batch's decision as it stands, and the
        batches this run never handed to the writer (decided empty, with a warning)."""
        if self.identity is not None:
            return self.identity
        from sqlsink.spark.support import is_connect, require_foreach_batch

        if not self.began:
            self.began = True
            WATCHES.handed(self.writer.sink_id, self.batch_id)

        if session is not None and is_connect(session):  # the function runs on Connect
            require_foreach_batch(connect=True)
        identity = self.writer.identity(session, self.batch_id)
        sink_id = self.writer.sink_id
        # a stream's run hands its batches in order, once each; an operator's writer
        # outside the stream (writer.skip) is neither counted nor judged so
        self.in_stream = inside = in_stream(session, self.batch_id)
        self.handed_before = inside and HANDED.handed(sink_id, identity.run_id, self.batch_id)
        self.identity = identity
        # this run's earlier batches whose hand-over ended undecided (their error caught)
        failed = HANDED.failed_before(sink_id, identity.run_id, self.batch_id) if inside else []
        self.decision = self._check_writer(failed)
        # counted once its checks passed: a refused hand-over is not a first one
        gap = HANDED.hand(sink_id, identity.run_id, self.batch_id) if inside else range(0)
        if gap:
            self._fill_gap(gap, identity)
        return identity

    def _check_writer(self, failed: Sequence[int] = ()) -> Decision | None:
        """Binding and forward-only checks before any job: a clear error, nothing written.
        ``failed``: this run's earlier batches whose hand-over ended undecided: one still
        undecided in the log is a batch Spark went on past (``swallowed_loss_error``).
        Returns the batch's decision, if it has one."""
        from sqlsink.core.admission import check_binding, check_forward
        from sqlsink.core.model import Binding
        from sqlsink.core.writer_batch import read_decision
        from sqlsink.spark.plan import CommitterSession

        assert self.identity is not None
        options = self.writer.sink_options("public.sqlsink_probe")
        session = CommitterSession(options, self.writer.sink_id)
        with session as committer:
            backend, sink_id = committer.backend, self.writer.sink_id
            session.loading.check_writer_start(
                backend, exactly_once=options.semantic is Semantic.EXACTLY_ONCE
            )
            highest = backend.highest_decided(sink_id)
            check_binding(
                sink_id, backend.binding(sink_id), highest, Binding.of(self.identity.query_id)
            )
            check_forward(sink_id, self.batch_id, highest)
            if failed:
                from sqlsink.core.writer_batch import swallowed_loss_error

                decided = backend.decisions(sink_id, [(sink_id, b) for b in failed])
                lost = [b for b in failed if (sink_id, b) not in decided]
                if lost:
                    raise swallowed_loss_error(sink_id, lost, self.batch_id)
            if self.in_stream:  # what the commit log holds of earlier hand-overs, any process
                from sqlsink.core.writer_batch import handed_loss_error, unfinished_handovers

                run_id = self.identity.run_id
                unfinished = unfinished_handovers(backend, sink_id, self.batch_id, highest)
                if unfinished:
                    raise handed_loss_error(sink_id, unfinished, self.batch_id, run_id)
                backend.record_handover(sink_id, run_id, self.batch_id)
            if highest is None or self.batch_id > highest:
                return None  # a stream's next batch: no decision, nothing to read
            return read_decision(backend, sink_id, self.batch_id)

    def _judge(self, table: str | None) -> PartStart:
        """A part of ``table`` (None: the empty batch) against the batch's decision."""
        from sqlsink.core.writer_batch import judge_part

        assert self.identity is not None
        self.start = judge_part(
            self.writer.sink_id,
            self.batch_id,
            self.identity.run_id,
            table,
            self.decision,
            handed_before=self.handed_before,
        )
        return self.start

    def _fill_gap(self, gap: range, identity: Identity) -> None:
        """Spark ran the batches of ``gap`` in this run without the function handing them
        to the writer: decide them empty before this batch (core/writer_batch.py)."""
        from sqlsink.core.writer_batch import fill_gap, gap_warning

        with self._empty_committer(identity) as committer:
            filled = fill_gap(committer, gap, query_id=identity.query_id, run_id=identity.run_id)
        log.warning(gap_warning(self.writer.sink_id, identity.run_id, gap, filled, self.batch_id))

    def _decide_empty(self) -> None:
        """Nothing was given (no exception): an empty batch, through the same checks and
        the committer; the identity from the active session, as no DataFrame named one."""
        from pyspark.sql import SparkSession

        from sqlsink.core.writer_batch import decide_empty

        identity = self._hand_over(SparkSession.getActiveSession())
        if self._judge(None) is PartStart.REPLAY:
            return
        with self._empty_committer(identity) as committer:
            passing: frozenset[int] = frozenset()
            if not self.in_stream:
                passing = _check_outside(
                    committer.backend, self.writer.sink_id, self.batch_id, identity.checkpoint
                )
            decide_empty(
                committer,
                self.batch_id,
                query_id=identity.query_id,
                run_id=identity.run_id,
                passing=passing,
            )

    def _empty_committer(self, identity: Identity) -> CommitterSession:
        """The committer of empty decisions (a gap's batches, an empty batch): no table,
        no view, the run's checkpoint checked when it has one."""
        from sqlsink.spark.plan import CommitterSession

        options = self.writer.sink_options("public.sqlsink_probe", checkpoint=identity.checkpoint)
        checked = identity.checkpoint is not None
        return CommitterSession(
            options, self.writer.sink_id, check_checkpoint=checked, tables=[], views=[]
        )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        error = exc
        try:
            self._exit(exc)
        except BaseException as raised:
            error = raised
            raise
        finally:
            self._ended(error)

    def _ended(self, error: BaseException | None) -> None:
        """The block ended, decided (``error`` None) or not: said to a wrapped call of the
        batch (``WATCHES``) and, inside the stream, to the run's record (``HANDED``): a
        later hand-over of this run refuses after a failed one the function caught."""
        sink_id, identity = self.writer.sink_id, self.identity
        if self.committed:
            error = None  # an error after the decision (a check after the commit)
        WATCHES.ended(sink_id, self.batch_id, self.began, error)
        if identity is None or not self.in_stream:
            return
        if error is None:
            HANDED.settle(sink_id, identity.run_id, self.batch_id)
            return
        HANDED.fail(sink_id, identity.run_id, self.batch_id)
        if not identity.from_spark:  # the abort renewed the process's run: it goes on
            HANDED.carry(sink_id, identity.run_id, PROCESS_RUNS.get(sink_id, identity.query_id))

    def _exit(self, exc: BaseException | None) -> None:
        from sqlsink.spark import heartbeat

        heartbeat.end(self)  # the commit registers the run by itself
        if self.identity is None or self.first_options is None:
            if exc is None:  # nothing was given: an empty batch
                self._decide_empty()
            return  # nothing prepared
        if exc is None:
            self._commit(self.first_options, self.identity)
        else:
            self._abort(self.first_options, self.identity)

    def _commit(self, options: SinkOptions, identity: Identity) -> None:
        from sqlsink import driver_log
        from sqlsink.spark.plan import CommitterSession

        driver_log.install()  # the batch's line in the driver's log, unless logging is set up
        sink_id = self.writer.sink_id
        checked = identity.checkpoint is not None
        try:
            session = CommitterSession(
                options,
                sink_id,
                check_checkpoint=checked,
                tables=self.tables,
                views=list(self.views.items()),
            )
            with session as committer:
                if self.start is PartStart.WRITE and any(o and o.skipped for o in self.outcomes):
                    self._decided_meanwhile(committer.backend)
                committer.commit_batch(
                    self.batch_id,
                    self.outcomes,
                    query_id=identity.query_id,
                    run_id=identity.run_id,
                )
                self.committed = True  # decided: a later error loses nothing of it
                writes = [o.prepared_at - o.started_at for o in self.outcomes if o and o.gid]
                session.loading.recheck_after_commit(
                    committer.backend,
                    key=sink_id,
                    partitions=len(self.outcomes),
                    slowest_write_s=max(writes, default=None),
                    partition_cap=options.max_partitions,
                    exactly_once=options.semantic is Semantic.EXACTLY_ONCE,
                )
        except BaseException:
            self._abort(options, identity)
            raise

    def _decided_meanwhile(self, backend: Any) -> None:
        """Tasks found the batch decided, which it was not when it was handed over:
        another hand-over of it (another writer object of the sink, on another thread)
        decided it meanwhile. The rule again, on the decision as it is now."""
        from sqlsink.core.writer_batch import judge_part, read_decision

        assert self.identity is not None
        sink_id, run_id = self.writer.sink_id, self.identity.run_id
        decision = read_decision(backend, sink_id, self.batch_id)  # once, for every table
        for table in self.tables:
            judge_part(sink_id, self.batch_id, run_id, table, decision)

    def _abort(self, options: SinkOptions, identity: Identity) -> None:
        from sqlsink.spark.plan import CommitterSession

        try:
            with CommitterSession(options, self.writer.sink_id) as committer:
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
            PROCESS_RUNS.renew(self.writer.sink_id, identity.query_id, identity.run_id)


def _check_outside(
    backend: Any, sink_id: str, batch_id: int, location: str | None
) -> frozenset[int]:
    """An empty decision from outside the stream: only for a batch Spark committed and
    that holds no prepared transaction; returns the later batches its checkpoint check
    passes over (``core/writer_batch.check_skip_outside``)."""
    from sqlsink.checkpoint.parse import checkpoint_policy
    from sqlsink.core.checkpoint_check import CheckpointMode
    from sqlsink.core.gid import Gid
    from sqlsink.core.writer_batch import check_skip_outside

    commits = None
    if location is not None:
        commits = checkpoint_policy(location, CheckpointMode.WARN).read_commits()
    prepared: dict[int, list[str]] = {}
    for t in backend.prepared(sink_id):
        if (g := Gid.parse(t.gid)) is not None and g.sink_id == sink_id:
            prepared.setdefault(g.batch_id, []).append(t.gid)
    return check_skip_outside(sink_id, batch_id, location, commits, prepared)
