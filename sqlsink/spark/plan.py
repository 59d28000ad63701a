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
from sqlsink.options import Mode, SchemaEvolution, SinkOptions
from sqlsink.tablename import TableName

if TYPE_CHECKING:
    from sqlsink.core.database import Database
    from sqlsink.core.loading import SchemaChanges, TargetPlan


def database_of(options: SinkOptions) -> Database:
    """The database ``options.url`` names (sqlsink.backends: no connection, no import of
    a backend's heavy modules until its methods are called)."""
    from sqlsink.backends import open_database

    return open_database(options.url)


def require_capabilities(database: Database, options: SinkOptions) -> None:
    """Refuse, before anything is written, what the options ask of a database that
    cannot do it."""
    from sqlsink.core.database import Capability, require

    require(database, Capability.BULK_LOAD, "the sink's load")
    if options.mode is Mode.UPSERT:
        require(database, Capability.UPSERT, "mode=upsert")
    if options.schema_evolution is not SchemaEvolution.NONE:
        require(database, Capability.SCHEMA_EVOLUTION, "schemaEvolution")
    if options.consistent_view is not None:
        require(database, Capability.CONSISTENT_VIEW, "consistentView")


def plan_write(
    options: SinkOptions,
    schema: StructType,
    key: str,
    sink_id: str | None = None,
    *,
    before_changes: Callable[[SchemaChanges], None] | None = None,
) -> TargetPlan:
    """Before any data: what the database must be able to do for the options, the
    server's settings (``key`` names whose warnings these are), the commit log, the
    view's refusals (the target's triggers; an upsert or replace into a table that a view
    of the sink shows), and the target table matched against ``schema``.
    ``before_changes``: the caller's refusal of a schema change (the foreachBatch writer's
    of a table an earlier part of the batch wrote), after the view's."""
    from sqlsink.spark.types import arrow_schema, column_type, table_columns

    database = database_of(options)
    require_capabilities(database, options)
    create = (lambda: table_columns(schema, database)) if options.create_table else None
    return database.loading().plan(
        options,
        key=key,
        sink_id=sink_id,
        field_names=schema.fieldNames(),
        create_columns=create,
        arrow_schema=lambda: arrow_schema(schema),
        column_type=lambda name: column_type(schema[name].dataType, name, database),
        before_changes=before_changes,
    )


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
            text = _rewrite_refusal(options, where, table, mode, shown, views[shown])
            raise ConfigError(
                f"{text}. An earlier part of this batch gives the view; nothing of the "
                "batch is committed",
                batch=batch_id,
            )
    if view is not None:
        for written, (written_part, written_mode) in rewritten.items():
            if _shown(options, written, {view: table}) is not None:
                where = f"sink {sink_id}: batch {batch_id}, part {written_part}"
                text = _rewrite_refusal(options, where, written, written_mode, view, table)
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
    return database_of(options).loading().view_sharing_rows(options, table, views)


def _rewrite_refusal(
    options: SinkOptions,
    where: str,
    table: TableName,
    mode: Mode,
    view: TableName,
    viewed: TableName,
) -> str:
    return database_of(options).loading().rewrite_refusal(where, table, mode, view, viewed)


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

        self.loading = loading = database_of(self.options).loading()
        self._session = loading.committer_backend(self.options, self.sink_id)
        backend = self._session.__enter__()
        check = None
        if self.check_checkpoint:
            from sqlsink.checkpoint.parse import checkpoint_policy
            from sqlsink.core.checkpoint_check import CheckpointCheck, EntryPoint

            policy = checkpoint_policy(self.options.checkpoint, self.options.checkpoint_check)
            entry = EntryPoint.FOREACH_BATCH if self.foreach_batch else EntryPoint.DATA_SOURCE
            check = CheckpointCheck(backend, replace(policy, entry=entry))
        consistent = None
        if self.views:
            consistent = loading.consistent_views(backend, self.views)
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
