"""What the data source and the foreachBatch writer share on the driver: the target's plan
(server checks, commit log, the table and its types, before any data) and a committer
session for one commit or abort. Nothing here imports the data source API, so the
foreachBatch writer runs on PySpark versions that lack it (spark/support.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

from pyspark.sql.types import StructType

from sqlsink.options import Semantic, SinkOptions
from sqlsink.postgres.target import TargetPlan
from sqlsink.tablename import TableName


def plan_write(
    options: SinkOptions, schema: StructType, key: str, sink_id: str | None = None
) -> TargetPlan:
    """Before any data: the server's settings (``key`` names whose warnings these are), the
    commit log, the view's refusals, and the target table matched against ``schema``."""
    from sqlsink.postgres import appnames, views
    from sqlsink.postgres.checks import check_at_start
    from sqlsink.postgres.schema import ensure_schema, ensure_schema_version
    from sqlsink.postgres.sessions import session
    from sqlsink.postgres.target import plan_target
    from sqlsink.spark.types import arrow_schema, table_columns

    with session(options.url, options.password, application_name=appnames.PLANNER) as conn:
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
        if view is not None:  # the tasks' markers must record their xid (schema 5)
            why = f"option consistentView={view}"
            ensure_schema_version(conn, views.SCHEMA_VERSION, why=why)
        create = table_columns(schema) if options.create_table else None
        arrow = arrow_schema(schema)
        plan = plan_target(conn, options, schema.fieldNames(), create, arrow)
        if view is not None:  # refusals before any data; the committer creates the view
            views.check_before_writing(conn, view, options.table, sink_id)
        return plan


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
        from sqlsink.checkpoint.parse import checkpoint_policy
        from sqlsink.core.checkpoint_check import CheckpointCheck, EntryPoint
        from sqlsink.core.committer import Committer
        from sqlsink.postgres import appnames
        from sqlsink.postgres.backend import PostgresBackend
        from sqlsink.postgres.sessions import session
        from sqlsink.postgres.views import ConsistentViews

        self._session = session(
            self.options.url,
            self.options.password,
            application_name=appnames.committer(self.sink_id),
        )
        self.conn = self._session.__enter__()
        backend = PostgresBackend(self.conn, self.options.lock_timeout_s)
        check = None
        if self.check_checkpoint:
            policy = checkpoint_policy(self.options.checkpoint, self.options.checkpoint_check)
            entry = EntryPoint.FOREACH_BATCH if self.foreach_batch else EntryPoint.DATA_SOURCE
            check = CheckpointCheck(backend, replace(policy, entry=entry))
        return Committer(
            backend,
            self.sink_id,
            timeouts=self.options.timeouts,
            run_timeout_s=self.options.run_timeout_s,
            keep_batches=self.options.keep_batches,
            checkpoint_check=check,
            view=ConsistentViews(backend, self.views) if self.views else None,
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
