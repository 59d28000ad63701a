"""The "sqlsink" Python data source: a thin adapter from Spark to the protocol.

    import sqlsink
    sqlsink.register(spark)
    (events.writeStream.format("sqlsink")
        .option("url", "postgresql://app@db:5432/shop")
        .option("table", "public.events")
        .option("checkpointLocation", "/chk/events")
        .start())

``streamWriter()`` runs on the driver before every batch (and again in every
commit/abort worker): it parses the options; in Spark's planning worker it also
checks the server, installs the commit log and plans the target, once per batch,
so that an error there is the first thing Spark reports (``_planned_here``);
elsewhere that happens when the writer is sent to the tasks. ``write()`` runs on the
executors (the partition transaction), ``commit()``/``abort()`` on the driver in
a fresh worker each time: nothing is kept in the writer between calls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timezone
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from sqlsink.core.model import Decision, PartitionOutcome
from sqlsink.errors import ConfigError, SqlsinkError
from sqlsink.spark.driver_token import driver_token, run_token
from sqlsink.spark.notices import check_key_ranges
from sqlsink.spark.support import is_connect

# Every Python worker Spark starts for this source (planning, tasks, the data source's
# re-creation, commit) is a fresh process that imports this module first: the options,
# the plan and the PostgreSQL driver are imported where a worker needs them
# (tests/unit/test_worker_imports.py).
if TYPE_CHECKING:
    from sqlsink.core.loading import Loading, TargetPlan
    from sqlsink.options import SinkOptions

log = logging.getLogger("sqlsink")


@dataclass
class SqlsinkCommitMessage(WriterCommitMessage):
    outcome: PartitionOutcome
    # the rows the task was given, written or not (a task of a decided batch skips them):
    # a named load run again compares them with its decision (SqlsinkBatchWriter.commit)
    input_rows: int | None = None


class SqlsinkDataSource(DataSource):
    """Spark data source "sqlsink" (writing only)."""

    @classmethod
    def name(cls) -> str:
        return "sqlsink"

    def writer(self, schema: StructType, overwrite: bool) -> SqlsinkBatchWriter:
        with _sink_error_first():
            if overwrite:
                raise ConfigError(
                    "sqlsink does not overwrite: use mode('append') (the options mode=append "
                    "or mode=upsert say how rows are written), and truncate the table first "
                    "if needed"
                )
            options = _parse(dict(self.options))
            if options.consistent_view is not None and not options.sink_id:
                raise ConfigError(
                    "option consistentView on a batch load needs the option sinkId: a load "
                    "without one gets a new sink id every time, and the view belongs to one "
                    "sink"
                )
            run_id = uuid.uuid4().hex
            # a one-off load: cli/status.one_off_load knows it by this name
            sink_id = options.sink_id or f"load-{run_id[:16]}"
            writer = SqlsinkBatchWriter(
                options, schema, sink_id, run_id, one_off=not options.sink_id
            )
            return _planned_here(writer)

    def streamWriter(self, schema: StructType, overwrite: bool) -> SqlsinkStreamWriter:
        from sqlsink.options import checkpoint_query_id

        with _sink_error_first():
            options = _parse(dict(self.options))
            sink_id = options.sink_id or checkpoint_query_id(options.checkpoint)
            writer = SqlsinkStreamWriter(options, schema, sink_id)
            writer.writer_token = driver_token(sink_id) if sink_id else None
            return _planned_here(writer)


def _parse(given: dict[str, str]) -> SinkOptions:
    from sqlsink.options import Mode, SinkOptions

    options = SinkOptions.parse(given, modes=(Mode.APPEND, Mode.UPSERT))
    if options.mode is Mode.REPLACE:
        raise ConfigError(
            "mode=replace is the foreachBatch writer's (complete output mode: one partition "
            "replaces the table); format('sqlsink') writes append or upsert. Use "
            "sqlsink.ForeachBatchWriter(...).to(table, mode='replace')"
        )
    return options


# Spark's worker that plans a write: it calls writer()/streamWriter(), then pickles the
# writer for the tasks. The commit/abort worker (python_streaming_sink_runner) calls
# streamWriter() too, and needs no plan.
_WRITE_PLANNER = "pyspark.sql.worker.write_into_data_source"
_HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"


def _called_from(module: str, depth: int = 6) -> bool:
    """Whether a frame of ``module`` is among the callers (run as a module or by name)."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return False
        name = frame.f_globals.get("__name__")
        spec = frame.f_globals.get("__spec__")
        if name == module or (name == "__main__" and getattr(spec, "name", None) == module):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _in_spark_worker() -> bool:
    """Whether this process is one of Spark's Python workers (not the user's driver)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return str(getattr(spec, "name", "") or "").startswith("pyspark.")


_W = TypeVar("_W", bound="_SinkWriter")


def _planned_here(writer: _W) -> _W:
    """Plan the target now when Spark's planning worker made the writer (issue 15): an
    error raised here is Spark's error ("Failed to initialize Python data source writer:
    <the sink's error>"), while one raised later, when Spark pickles the writer, comes
    wrapped in a PicklingError and two tracebacks. Elsewhere (commit and abort workers,
    an unknown caller) the plan stays lazy: it is made when the writer is pickled."""
    if _called_from(_WRITE_PLANNER):
        writer.target  # noqa: B018 -- checks, commit log, target: before Spark goes on
    return writer


@contextlib.contextmanager
def _sink_error_first() -> Iterator[None]:
    """The sink's own error first: Spark's worker reports an error of writer() or
    streamWriter() as its formatted traceback, which Spark puts after "Failed to initialize
    Python data source writer: ", so the sink's sentence would come after a dozen lines of
    frames. The worker exits after reporting it (pyspark.sql.worker.utils.worker_run), and
    reads SPARK_HIDE_TRACEBACK when it formats the error: set in this process only, and
    only for the sink's own errors, it makes the report "sqlsink.errors.ConfigError: <the
    sentence and its fix>". Any other error keeps its traceback."""
    try:
        yield
    except SqlsinkError:
        if _in_spark_worker():
            os.environ[_HIDE_TRACEBACK] = "1"
        raise


class _SinkWriter:
    """What the stream and the batch writer share: the plan, the partition write, the commit.

    The target is planned when Spark's planning worker makes the writer
    (``_planned_here``), else when the writer is pickled for the tasks: Spark builds a
    stream writer on the driver before every batch and another one in every
    commit/abort worker, where the plan is not needed. So planning (checks, schema,
    target, ~20 ms) happens once per batch, and an error there stops the batch before
    any task runs.
    """

    is_load = False  # a batch load (df.write), not a streaming query

    def __init__(self, options: SinkOptions, schema: StructType, sink_id: str | None) -> None:
        self.options = options
        self.schema = schema
        self.sink_id = sink_id
        self._target: TargetPlan | None = None
        self.writer_token: str | None = None  # a stream's: its driver's (driver_token)

    @property
    def check_key(self) -> str:
        """Server warnings are logged once per key and worker: the sink, else the table."""
        return self.sink_id or str(self.options.table)

    @property
    def target(self) -> TargetPlan:
        if self._target is None:
            from sqlsink.spark.plan import plan_write

            self._target = plan_write(self.options, self.schema, self.check_key, self.sink_id)
        return self._target

    def _loading(self) -> Loading:
        """The database's interface (sqlsink.backends): light, its methods import what
        they need when called."""
        from sqlsink.backends import open_database

        return open_database(self.options.url).loading()

    def __getstate__(self) -> dict[str, Any]:
        self.target  # noqa: B018 -- plan before the writer leaves the driver
        return dict(self.__dict__)

    def _write(
        self, iterator: Iterator[Any], batch_id: int, run_id: str, query_id: str | None
    ) -> SqlsinkCommitMessage:
        from sqlsink.spark.task import current_task

        sink_id = self.sink_id or query_id
        if sink_id is None:
            raise ConfigError("sqlsink: no sinkId option and no streaming query id to use instead")
        # the token of the driver and the query: an abort without messages finds this run
        # by it, and no other query's of the same driver (spark/driver_token.py)
        token = run_token(self.writer_token, query_id)
        task = current_task(sink_id, batch_id, run_id, query_id, writer_token=token)
        check_partition_cap(self.options, task.partition_id, batch_id)
        given = _Counted(iterator)
        outcome = self._loading().write_partition(self.options, self.target, task, given)
        given.drain()
        return SqlsinkCommitMessage(outcome, input_rows=given.rows)

    def _commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> str | None:
        from sqlsink import driver_log
        from sqlsink.spark.plan import CommitterSession

        driver_log.install()  # the batch's line in the driver's log, unless logging is set up
        outcomes = _outcomes(messages)
        sink_id = self._sink_id(outcomes)
        if sink_id is None:
            return None  # no task wrote anything, and no sink id to look up: nothing to decide
        # a stream relates its checkpoint to the log (invariant 9); a batch load has none
        stream = not self.is_load
        with CommitterSession(self.options, sink_id, check_checkpoint=stream) as committer:
            committer.commit_batch(
                batch_id,
                outcomes,
                query_id=next((o.query_id for o in outcomes if o and o.query_id), None),
                run_id=next((o.run_id for o in outcomes if o and o.run_id), None),
                load=self.is_load,
            )
            self._recheck_server(committer, sink_id, outcomes)
        check_key_ranges(self.writer_token or sink_id, sink_id, batch_id, outcomes)
        return sink_id

    def _recheck_server(
        self, committer: Any, sink_id: str, outcomes: list[PartitionOutcome | None]
    ) -> None:
        """The server's timeouts and slots against this batch's partitions and slowest
        write, when either grew past what this process measured (logged when the verdict
        changes; otherwise the check before the batch already judged the same)."""
        from sqlsink.options import Semantic

        writes = [o.prepared_at - o.started_at for o in outcomes if o is not None and o.gid]
        self._loading().recheck_after_commit(
            committer.backend,
            key=sink_id,
            partitions=len(outcomes),
            slowest_write_s=max(writes, default=None),
            partition_cap=self.options.max_partitions,
            exactly_once=self.options.semantic is Semantic.EXACTLY_ONCE,
        )

    def _abort(
        self,
        messages: list[WriterCommitMessage | None],
        batch_id: int,
        run_id: str | None = None,
    ) -> None:
        """``run_id``: when the writer knows it (a batch load). A stream's comes from the
        tasks' messages; with none of them (Spark passes only ``None`` when every task
        failed or still ran) the abort reads its query id from the checkpoint and finds
        its run by the token of the driver and the query its tasks registered with
        (spark/driver_token.py). Without its query id it cannot prove which run of this
        driver is its own, and does nothing (it never guesses)."""
        outcomes = _outcomes(messages)
        sink_id = self._sink_id(outcomes)
        if sink_id is None:
            log.warning(
                "sqlsink: batch %d aborted before any task reported; recovery at the "
                "next start resolves what it prepared",
                batch_id,
            )
            return
        query_id = next((o.query_id for o in outcomes if o and o.query_id), None)
        reported = run_id is not None or any(o is not None and o.run_id for o in outcomes)
        if not self.is_load and not reported:
            query_id, why = checkpoint_query(self.options.checkpoint)
            if query_id is None:
                _warn_query_unknown(sink_id, batch_id, why)
                return
        from sqlsink.spark.plan import CommitterSession

        with CommitterSession(self.options, sink_id) as committer:
            committer.abort_batch(
                batch_id,
                outcomes,
                run_id=run_id,
                query_id=query_id,
                load=self.is_load,
                writer_token=run_token(self.writer_token, query_id),
            )

    def _sink_id(self, outcomes: list[PartitionOutcome | None]) -> str | None:
        return self.sink_id or next((o.sink_id for o in outcomes if o is not None), None)


class _Counted(Iterator[Any]):
    """A task's Arrow batches, counted as they are read."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self.batches = iter(batches)
        self.rows = 0

    def __next__(self) -> Any:
        batch = next(self.batches)
        self.rows += batch.num_rows
        return batch

    def drain(self) -> None:
        """Read what the write left (Spark wants a task's input read), counting it."""
        for _ in self:
            pass


# reading a remote checkpoint's metadata in an abort: at most this long
QUERY_READ_TIMEOUT_S = 10.0


def checkpoint_query(location: str | None) -> tuple[str | None, str]:
    """The streaming query id in the checkpoint's ``metadata``, as the abort's worker
    reads it: a local or ``file:`` checkpoint directly, any other through ``pyarrow.fs``
    (as the checkpoint check reads it), for at most ``QUERY_READ_TIMEOUT_S``. (None,
    why) when it cannot be read here."""
    from sqlsink.checkpoint.files import display_location, first_line, is_local, join, open_files
    from sqlsink.options import checkpoint_query_id

    if not location:
        return None, "the query has no checkpointLocation option"
    shown = display_location(location)
    if is_local(location):
        found = checkpoint_query_id(location)
        if found is None:
            return None, f"{shown}/metadata is not readable from the driver"
        return found, ""
    result: list[str | None] = []
    failure: list[str] = []

    def read() -> None:
        try:
            files, root = open_files(location)
            line = files.read_text(join(root, "metadata")).splitlines()[0]
            result.append(str(json.loads(line)["id"]))
        except Exception as exc:  # any failure: unknown, and said why
            failure.append(f"{type(exc).__name__}: {first_line(exc, location)}")

    reader = threading.Thread(target=read, name="sqlsink-abort-query-id", daemon=True)
    reader.start()
    reader.join(QUERY_READ_TIMEOUT_S)
    if result and result[0]:
        return result[0], ""
    if failure:
        return None, f"{shown}/metadata is not readable from the driver ({failure[0]})"
    return None, f"reading {shown}/metadata took longer than {QUERY_READ_TIMEOUT_S:.0f} s"


def _warn_query_unknown(sink_id: str, batch_id: int, why: str) -> None:
    log.warning(
        "sqlsink %s: batch %d aborted before any task reported, and this abort cannot "
        "tell its streaming query (%s): another query of this driver may write the same "
        "sink, so it cannot prove which run is its own and touches nothing. A "
        "transaction a task of this batch prepared stays prepared until the query "
        "starts again (its first task resolves it), or until sqlsink recover --sink-id "
        "%s once the run's heartbeat is older than runTimeout (sqlsink status names the "
        "run; recover --force --run-id RUN at once). Fix: give the query its "
        "checkpointLocation as an option, on a file system the driver can read",
        sink_id,
        batch_id,
        why,
        sink_id,
    )


def check_partition_cap(options: SinkOptions, partition: int, batch_id: int) -> None:
    """Option maxPartitions in a data source task: a DataSource writer cannot coalesce its
    input, nor learn the partition count before the tasks run (Spark does not tell the
    Python writer), so a task beyond the cap refuses before it connects: no connection,
    no slot; the batch fails and its other partitions are rolled back."""
    cap = options.max_partitions
    if cap is None or partition < cap:
        return
    raise ConfigError(
        f"batch {batch_id} has more than maxPartitions={cap} partitions (this task writes "
        f"partition {partition}), nothing of it is committed: each non-empty partition takes "
        "a connection and a prepared-transaction slot, and format('sqlsink') cannot coalesce "
        f"its input; fix: write df.coalesce({cap}) (or lower spark.sql.shuffle.partitions), "
        "or raise maxPartitions if the server has the slots and connections",
        partition=partition,
        max_partitions=cap,
    )


class SqlsinkStreamWriter(_SinkWriter, DataSourceStreamArrowWriter):
    """``df.writeStream.format("sqlsink")``: one streaming micro-batch per call."""

    def write(self, iterator: Iterator[Any]) -> SqlsinkCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise ConfigError("sqlsink: write() called outside a Spark task")
        batch_id, run_id, query_id = stream_identity(ctx.getLocalProperty)
        return self._write(iterator, batch_id=batch_id, run_id=run_id, query_id=query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages, batchId)


def stream_identity(prop: Callable[[str], str | None]) -> tuple[int, str, str]:
    """(batch id, run id, query id) of a streaming task, from Spark's local properties.

    No fallbacks: a batch id of 0 or a made-up run id would write a batch under a name
    that is not its own (docs/DESIGN.md invariants 9 and 10)."""
    names = ("streaming.sql.batchId", "spark.jobGroup.id", "sql.streaming.queryId")
    batch, run, query = (prop(name) for name in names)
    if not (batch and batch.isdigit() and run and query):
        raise ConfigError(
            "sqlsink: a streaming task without Spark's batch id, run id or query id "
            f"(local properties {', '.join(names)}: {batch!r}, {run!r}, {query!r}); this "
            "Spark version or launch path is not supported by format('sqlsink'): use the "
            "foreachBatch writer, or report it with your Spark version"
        )
    return int(batch), run, query


class SqlsinkBatchWriter(_SinkWriter, DataSourceArrowWriter):
    """``df.write.format("sqlsink")``: every partition or none, like one streaming batch.

    Without a sinkId the write is a one-off (its log is removed once committed);
    with one, it is idempotent: running the same load again writes nothing.
    """

    is_load = True

    def __init__(
        self, options: SinkOptions, schema: StructType, sink_id: str, run_id: str, one_off: bool
    ) -> None:
        super().__init__(options, schema, sink_id)
        self.run_id = run_id
        self.one_off = one_off

    @property
    def check_key(self) -> str:
        """A one-off load's sink id is new every time: its warnings are keyed by the table."""
        return str(self.options.table) if self.one_off else super().check_key

    def write(self, iterator: Iterator[Any]) -> SqlsinkCommitMessage:
        return self._write(iterator, batch_id=0, run_id=self.run_id, query_id=None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.one_off:
            sink_id = self._commit(messages, 0)
            if sink_id is not None:
                self._loading().forget_one_off_load(self.options, sink_id)
            return
        before = self._decision()  # decided before this run's commit: a replay
        self._commit(messages, 0)
        after = self._decision()
        if after is not None and (before is not None or after.run_id not in (None, self.run_id)):
            given = [m.input_rows for m in messages if isinstance(m, SqlsinkCommitMessage)]
            rerun(after, sum(n or 0 for n in given))

    def _decision(self) -> Decision | None:
        """A named load's one decision (batch 0), if any."""
        return self._loading().load_decision(self.options, str(self.sink_id))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(messages, 0, self.run_id)


def rerun(decision: Decision, input_rows: int) -> None:
    """A named load whose batch another run decided wrote nothing (exactly once: a re-run
    after a crash, or of a job whose commit was done, must not write twice). Never
    silently: with the input of that load (as many rows) a warning in the driver's output;
    with other input a refusal: new data under the old sink id, or the same load over an
    input that changed since (its decided rows are in already: only the others may go,
    under a new sink id)."""
    sink = decision.sink_id
    when = f"{decision.decided_at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    decided = (
        f"sink id {sink} decided its batch 0 at {when} ({decision.rows} rows in "
        f"{len(decision.gids)} partitions, run {decision.run_id}), and a named load is "
        "written once"
    )
    if input_rows != decision.rows:
        # new data, or the same load over an input that changed since: the decided rows
        # are in the table either way, so the fix is never "the whole input again"
        grown = input_rows > decision.rows
        since = "has grown since" if grown else "has changed since"
        what = "the rows added since" if grown else "the rows that are not among them"
        raise ConfigError(
            f"sqlsink {sink}: refused, nothing of this load is written: {decided}; this "
            f"load's input has {input_rows} rows, so it is not a re-run of that load as it "
            "was. Fix: if this is new data, write it under a new sinkId; if it is that same "
            f"load over an input that {since}, its decided rows are already in "
            f"({decision.rows} rows at {when}): write only {what}, under a new sinkId, "
            "never the whole input again",
            sink=sink,
            batch=0,
        )
    log.warning(
        "sqlsink %s: this load wrote nothing: %s; this load's input has the same %d rows, "
        "so it was taken for a re-run of that load (after a crash, or a job retried) and "
        "skipped. If it is new data, write it under a new sinkId",
        sink,
        decided,
        input_rows,
    )


def _outcomes(messages: list[WriterCommitMessage | None]) -> list[PartitionOutcome | None]:
    return [m.outcome if isinstance(m, SqlsinkCommitMessage) else None for m in messages]


def register(spark: Any) -> None:
    """Register the data source; warn when Spark's workers may run another Python."""
    in_venv = sys.prefix != sys.base_prefix
    workers = os.environ.get("PYSPARK_PYTHON")
    # a Spark Connect session's workers run on its server, with the server's settings;
    # a relative PYSPARK_PYTHON (the cluster recipe's ./environment/bin/python) is this
    # interpreter when it resolves to it from here
    connect = is_connect(spark)
    same = workers is not None and os.path.abspath(workers) == os.path.abspath(sys.executable)
    if in_venv and not connect and not same:
        log.warning(
            "sqlsink: this driver runs in a virtualenv (%s) but PYSPARK_PYTHON does not point "
            "at it, so Spark's Python workers may lack pyarrow/psycopg; set "
            "PYSPARK_PYTHON=%s before starting Spark",
            sys.prefix,
            sys.executable,
        )
    spark.dataSource.register(SqlsinkDataSource)
    from sqlsink.spark.listener import install

    install(spark)  # a run's end in the commit log when its query stops (issue 30)
