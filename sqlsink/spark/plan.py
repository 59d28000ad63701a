"""What the data source and the foreachBatch writer share on the driver: the target's plan
(server checks, commit log, the table and its types, before any data) and a committer
session for one commit or abort. Nothing here imports the data source API, so the
foreachBatch writer runs on PySpark versions that lack it (spark/support.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from sqlsink.errors import ConfigError
from sqlsink.options import Mode, SchemaEvolution, Semantic, SinkOptions
from sqlsink.tablename import TableName

if TYPE_CHECKING:
    from sqlsink.postgres.evolution import Evolution
    from sqlsink.postgres.target import TargetPlan


def plan_write(
    options: SinkOptions,
    schema: StructType,
    key: str,
    sink_id: str | None = None,
    *,
    before_changes: Callable[[Evolution], None] | None = None,
) -> TargetPlan:
    """Before any data: the server's settings (``key`` names whose warnings these are), the
    commit log, the view's refusals (the target's triggers; an upsert or replace into a
    table that a view of the sink shows), and the target table matched against ``schema``.
    ``before_changes``: the caller's refusal of a schema change (the foreachBatch writer's
    of a table an earlier part of the batch wrote), after the view's."""
    from sqlsink.postgres import appnames
    from sqlsink.postgres.checks import check_at_start
    from sqlsink.postgres.planning_errors import in_sinks_words
    from sqlsink.postgres.schema import ensure_schema, ensure_schema_version
    from sqlsink.postgres.sessions import session
    from sqlsink.postgres.target import plan_target
    from sqlsink.spark.types import arrow_schema, column_type, table_columns

    with (
        session(options.url, options.password, application_name=appnames.PLANNER) as conn,
        in_sinks_words(conn, options.url, options.table, options.create_table),
    ):
        # server settings: an error stops here, before any data; warnings are logged once
        # per worker and again only when the verdict changes
        check_at_start(
            conn,
            key=key,
            partitions=options.max_partitions,  # the most a batch may have (None: unknown)
            exactly_once=options.semantic is Semantic.EXACTLY_ONCE,
        )
        ensure_schema(conn)
        view = options.consistent_view
        # the views' module is imported only where a view can matter (an upsert or a
        # replace, a view of the sink's own): an append's planning worker needs none of it
        if options.mode is not Mode.APPEND:
            from sqlsink.postgres.views import check_rewrite

            # an upsert or replace into a table one of the sink's views shows: before the job
            owner = sink_id or options.sink_id  # the foreachBatch writer's is in its options
            where = f"sink {owner}" if owner else f"table {options.table}"
            check_rewrite(conn, options.table, options.mode, owner, where)
        if view is not None:  # the tasks' markers must record their xid (schema 5)
            from sqlsink.postgres import views

            why = f"option consistentView={view}"
            ensure_schema_version(conn, views.SCHEMA_VERSION, why=why)
        create = table_columns(schema) if options.create_table else None
        arrow = arrow_schema(schema)
        evolving = options.schema_evolution is not SchemaEvolution.NONE  # its types: lazily
        types = (lambda name: column_type(schema[name].dataType, name)) if evolving else None

        def check_changes(evolution: Evolution) -> None:
            if view is not None:  # a view's refusals come before a schema change too
                views.check_before_writing(conn, view, options.table, sink_id)
            if before_changes is not None:
                before_changes(evolution)

        plan = plan_target(
            conn, options, schema.fieldNames(), create, arrow, types, before_changes=check_changes
        )
        if view is not None:  # refusals before any data; the committer creates the view
            views.check_before_writing(conn, view, options.table, sink_id)
        if options.dead_letter_table is not None:  # created when missing, before any data
            from sqlsink.postgres.dead_letters import ensure_table

            ensure_table(conn, options.dead_letter_table, options.table)
        return plan


def check_part(
    options: SinkOptions,
    *,
    sink_id: str,
    batch_id: int,
    part: int,
    views: Mapping[TableName, TableName],
    rewritten: MutableMapping[TableName, tuple[int, Mode]],
) -> None:
    """The foreachBatch writer, before a part's job: refuse an upsert or replace into a
    table that a view given by an earlier part of the batch shows, and a view over a
    table that an earlier part upserted or replaced (``views.rewrites``; the views made
    by earlier batches are looked up by ``plan_write``). The batch's views are made at
    its commit, so they are not in the database yet. ``part``: this part's index;
    ``views``: the batch's views so far (view -> its table); ``rewritten``: the tables its
    parts upserted or replaced so far, each with its part and mode (this part's is added).
    A refused part writes nothing; the error leaving the batch's block aborts what
    earlier parts prepared."""
    mode, table, view = options.mode, options.table, options.consistent_view
    if mode is not Mode.APPEND and views:
        shown = _shown(options, table, views)
        if shown is not None:
            where = f"sink {sink_id}: batch {batch_id}, part {part}"
            text = _rewrite_refusal(where, table, mode, shown, views[shown])
            raise ConfigError(
                f"{text}. An earlier part of this batch gives the view; nothing of the "
                "batch is committed",
                batch=batch_id,
            )
    if view is not None:
        for written, (written_part, written_mode) in rewritten.items():
            if _shown(options, written, {view: table}) is not None:
                where = f"sink {sink_id}: batch {batch_id}, part {written_part}"
                text = _rewrite_refusal(where, written, written_mode, view, table)
                raise ConfigError(
                    f"{text}. Part {part} of this batch gives the view {view} of "
                    f"table {table}; nothing of the batch is committed",
                    batch=batch_id,
                )
    if mode is not Mode.APPEND:
        rewritten.setdefault(table, (part, mode))


def _shown(
    options: SinkOptions, table: TableName, views: Mapping[TableName, TableName]
) -> TableName | None:
    """The first of ``views`` (view -> its table) that shows rows of ``table``: over the
    table itself, else (a catalog read, only then) over a descendant or an ancestor."""
    for view, viewed in views.items():
        if viewed == table:
            return view
    from sqlsink.postgres import appnames
    from sqlsink.postgres.sessions import session
    from sqlsink.postgres.views import quoted, sharing_rows

    with session(options.url, options.password, application_name=appnames.PLANNER) as conn:
        related = sharing_rows(conn, table)
    return next((v for v, viewed in views.items() if quoted(viewed) in related), None)


def _rewrite_refusal(
    where: str, table: TableName, mode: Mode, view: TableName, viewed: TableName
) -> str:
    from sqlsink.postgres.views import quoted, rewrite_refusal

    return rewrite_refusal(where, table, mode, str(view), quoted(viewed))


class CommitterSession:
    """A connection and a Committer for one commit()/abort() call."""

    def __init__(
        self,
        options: SinkOptions,
        sink_id: str,
        *,
        check_checkpoint: bool = False,
        tables: Sequence[str] | None = None,
        views: Sequence[tuple[TableName, TableName]] | None = None,
        foreach_batch: bool | None = None,
    ) -> None:
        self.options = options
        self.sink_id = sink_id
        self.check_checkpoint = check_checkpoint  # a stream's commit: its checkpoint vs the log
        # which entry point commits (the checkpoint check's wording for a batch without a
        # decision); default: the foreachBatch writer is the caller that names its tables
        self.foreach_batch = tables is not None if foreach_batch is None else foreach_batch
        # the tables a decision records (default: the option table)
        self.tables = [str(options.table)] if tables is None else list(tables)
        # the consistent views to keep before the decision, (view, table); default: the
        # option's (consistentView of the option table)
        if views is None:
            view = options.consistent_view
            views = [] if view is None else [(view, options.table)]
        self.views = list(views)

    def __enter__(self) -> Any:
        from sqlsink.core.committer import Committer
        from sqlsink.postgres import appnames
        from sqlsink.postgres.backend import PostgresBackend
        from sqlsink.postgres.sessions import session

        self._session = session(
            self.options.url,
            self.options.password,
            application_name=appnames.committer(self.sink_id),
        )
        self.conn = self._session.__enter__()
        backend = PostgresBackend(self.conn, self.options.lock_timeout_s)
        check = None
        if self.check_checkpoint:
            from sqlsink.checkpoint.parse import checkpoint_policy
            from sqlsink.core.checkpoint_check import CheckpointCheck, EntryPoint

            policy = checkpoint_policy(self.options.checkpoint, self.options.checkpoint_check)
            entry = EntryPoint.FOREACH_BATCH if self.foreach_batch else EntryPoint.DATA_SOURCE
            check = CheckpointCheck(backend, replace(policy, entry=entry))
        consistent = None
        if self.views:  # imported only by a sink with views
            from sqlsink.postgres.views import ConsistentViews

            consistent = ConsistentViews(backend, self.views)
        return Committer(
            backend,
            self.sink_id,
            timeouts=self.options.timeouts,
            run_timeout_s=self.options.run_timeout_s,
            keep_batches=self.options.keep_batches,
            checkpoint_check=check,
            view=consistent,
            tables=self.tables,
        )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # kept for the next batch after a clean use (sessions.py), closed otherwise
        self._session.__exit__(kind, exc, tb)
