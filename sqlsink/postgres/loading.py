"""The Spark adapters' interface (:class:`sqlsink.core.loading.Loading`) for PostgreSQL:
planning with the server checks, binary COPY into prepared transactions, the consistent
views, ``max_prepared_transactions``. Every method imports the modules it needs when
called: the object costs nothing on a worker that never plans or writes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlsink.core.backend import TwoPhaseBackend, ViewKeeper
    from sqlsink.core.loading import ColumnKind, SchemaChanges
    from sqlsink.core.loading import TargetPlan as AnyPlan
    from sqlsink.core.model import Decision, PartitionOutcome, TaskIdentity
    from sqlsink.errors import ConfigError
    from sqlsink.options import Mode, SinkOptions
    from sqlsink.postgres.backend import PostgresBackend
    from sqlsink.postgres.evolution import Evolution
    from sqlsink.postgres.target import TargetPlan
    from sqlsink.tablename import TableName


def _postgres(backend: TwoPhaseBackend) -> PostgresBackend:
    from sqlsink.postgres.backend import PostgresBackend

    assert isinstance(backend, PostgresBackend), type(backend)
    return backend


class PostgresLoading:
    """:class:`sqlsink.core.loading.Loading` for PostgreSQL."""

    def plan(
        self,
        options: SinkOptions,
        *,
        key: str,
        sink_id: str | None,
        field_names: Sequence[str],
        create_columns: Callable[[], Sequence[Any]] | None,
        arrow_schema: Callable[[], Any],
        column_type: Callable[[str], Any] | None,
        before_changes: Callable[[SchemaChanges], None] | None,
    ) -> TargetPlan:
        from sqlsink.options import Mode, SchemaEvolution, Semantic
        from sqlsink.postgres import appnames
        from sqlsink.postgres.checks import check_at_start
        from sqlsink.postgres.planning_errors import in_sinks_words
        from sqlsink.postgres.schema import ensure_schema, ensure_schema_version
        from sqlsink.postgres.sessions import session
        from sqlsink.postgres.target import plan_target

        with (
            session(options.url, options.password, application_name=appnames.PLANNER) as conn,
            in_sinks_words(conn, options.url, options.table, options.create_table),
        ):
            # server settings: an error stops here, before any data; warnings are logged
            # once per worker and again only when the verdict changes
            check_at_start(
                conn,
                key=key,
                partitions=options.max_partitions,  # the most a batch may have (None: unknown)
                exactly_once=options.semantic is Semantic.EXACTLY_ONCE,
            )
            ensure_schema(conn)
            view = options.consistent_view
            # the views' module is imported only where a view can matter (an upsert or a
            # replace, a view of the sink's own): an append's planning worker needs none
            if options.mode is not Mode.APPEND:
                from sqlsink.postgres.views import check_rewrite

                # an upsert or replace into a table one of the sink's views shows
                owner = sink_id or options.sink_id  # the foreachBatch writer's: its options
                where = f"sink {owner}" if owner else f"table {options.table}"
                check_rewrite(conn, options.table, options.mode, owner, where)
            if view is not None:  # the tasks' markers must record their xid (schema 5)
                from sqlsink.postgres import views

                why = f"option consistentView={view}"
                ensure_schema_version(conn, views.SCHEMA_VERSION, why=why)
            create = None if create_columns is None else create_columns()
            arrow = arrow_schema()
            evolving = options.schema_evolution is not SchemaEvolution.NONE
            types = column_type if evolving else None

            def check_changes(evolution: Evolution) -> None:
                if view is not None:  # a view's refusals come before a schema change too
                    views.check_before_writing(conn, view, options.table, sink_id)
                if before_changes is not None:
                    before_changes(evolution)

            plan = plan_target(
                conn, options, field_names, create, arrow, types, before_changes=check_changes
            )
            if view is not None:  # refusals before any data; the committer creates the view
                views.check_before_writing(conn, view, options.table, sink_id)
            if options.dead_letter_table is not None:  # created when missing, before any data
                from sqlsink.postgres.dead_letters import ensure_table

                ensure_table(conn, options.dead_letter_table, options.table)
            return plan

    def column_type(self, kind: ColumnKind) -> Any | None:
        """The PostgreSQL type (SQLAlchemy's) of ``kind`` (see docs/reference/types.md);
        None for an array of arrays: PostgreSQL's arrays do not nest (int[][] is int[])."""
        import sqlalchemy as sa  # DDL only: createTable (its import costs ~0.1 s a process)
        from sqlalchemy.dialects import postgresql as pg

        simple: dict[str, Any] = {
            "boolean": sa.Boolean,
            "int8": sa.SmallInteger,
            "int16": sa.SmallInteger,
            "int32": sa.Integer,
            "int64": sa.BigInteger,
            "float32": sa.REAL,
            "float64": pg.DOUBLE_PRECISION,
            "string": sa.Text,
            "binary": pg.BYTEA,
            "date": sa.Date,
            "timestamp": lambda: pg.TIMESTAMP(timezone=False),
            "timestamptz": lambda: pg.TIMESTAMP(timezone=True),
            "document": pg.JSONB,
        }
        if kind.name in simple:
            return simple[kind.name]()
        if kind.name == "decimal":
            return sa.Numeric(kind.precision, kind.scale)
        if kind.name == "array" and kind.element is not None and kind.element.name != "array":
            element = self.column_type(kind.element)
            return None if element is None else pg.ARRAY(element)
        return None

    def column(self, name: str, type_: Any, nullable: bool) -> Any:
        import sqlalchemy as sa

        return sa.Column(name, type_, nullable=nullable)

    def view_sharing_rows(
        self, options: SinkOptions, table: TableName, views: Mapping[TableName, TableName]
    ) -> TableName | None:
        from sqlsink.postgres import appnames
        from sqlsink.postgres.sessions import session
        from sqlsink.postgres.views import quoted, sharing_rows

        with session(options.url, options.password, application_name=appnames.PLANNER) as conn:
            related = sharing_rows(conn, table)
        return next((v for v, viewed in views.items() if quoted(viewed) in related), None)

    def rewrite_refusal(
        self, where: str, table: TableName, mode: Mode, view: TableName, viewed: TableName
    ) -> str:
        from sqlsink.postgres.views import quoted, rewrite_refusal

        return rewrite_refusal(where, table, mode, str(view), quoted(viewed))

    @contextmanager
    def committer_backend(self, options: SinkOptions, sink_id: str) -> Iterator[PostgresBackend]:
        from sqlsink.postgres import appnames

        with self._backend(options, appnames.committer(sink_id)) as backend:
            yield backend

    @contextmanager
    def heartbeat_backend(self, options: SinkOptions, sink_id: str) -> Iterator[PostgresBackend]:
        name = f"sqlsink {sink_id} heartbeat".encode()[:63].decode(errors="ignore")
        with self._backend(options, name) as backend:
            yield backend

    @contextmanager
    def _backend(self, options: SinkOptions, name: str) -> Iterator[PostgresBackend]:
        from sqlsink.postgres.backend import PostgresBackend
        from sqlsink.postgres.sessions import session

        with session(options.url, options.password, application_name=name) as conn:
            yield PostgresBackend(conn, options.lock_timeout_s)

    def consistent_views(
        self, backend: TwoPhaseBackend, views: Sequence[tuple[TableName, TableName]]
    ) -> ViewKeeper:
        from sqlsink.postgres.views import ConsistentViews  # imported only by a sink with views

        return ConsistentViews(_postgres(backend), views)

    def check_writer_start(self, backend: TwoPhaseBackend, *, exactly_once: bool) -> None:
        from sqlsink.postgres.checks import require_prepared_transactions
        from sqlsink.postgres.schema import ensure_schema

        conn = _postgres(backend).conn
        if exactly_once:  # the first error, before any DDL
            require_prepared_transactions(conn)
        ensure_schema(conn)

    def slots_refusal(self, options: SinkOptions, partitions: int) -> ConfigError | None:
        from sqlsink.errors import ConfigError
        from sqlsink.postgres import appnames
        from sqlsink.postgres.checks import require_prepared_transactions
        from sqlsink.postgres.sessions import session

        with session(options.url, options.password, application_name=appnames.PLANNER) as conn:
            try:
                require_prepared_transactions(conn, partitions)
            except ConfigError as exc:
                return exc
        return None

    def recheck_after_commit(
        self,
        backend: TwoPhaseBackend,
        *,
        key: str,
        partitions: int,
        slowest_write_s: float | None,
        partition_cap: int | None,
        exactly_once: bool,
    ) -> None:
        from sqlsink.postgres.checks import check_after_commit

        check_after_commit(
            _postgres(backend).conn,
            key=key,
            partitions=partitions,
            slowest_write_s=slowest_write_s,
            partition_cap=partition_cap,
            exactly_once=exactly_once,
        )

    def write_partition(
        self, options: SinkOptions, plan: AnyPlan, task: TaskIdentity, batches: Iterable[Any]
    ) -> PartitionOutcome:
        from sqlsink.postgres.partition import write_partition
        from sqlsink.postgres.target import TargetPlan

        assert isinstance(plan, TargetPlan), type(plan)
        return write_partition(options, plan, task, batches)

    def _connect(self, options: SinkOptions) -> Any:
        from sqlsink.postgres import appnames
        from sqlsink.postgres.connection import connect

        return connect(options.url, options.password, application_name=appnames.ONE_OFF)

    def forget_one_off_load(self, options: SinkOptions, sink_id: str) -> None:
        from sqlsink.postgres import commit_log

        with self._connect(options) as conn:
            commit_log.forget_one_off_load(conn, sink_id)

    def load_decision(self, options: SinkOptions, sink_id: str) -> Decision | None:
        from sqlsink.postgres import commit_log

        with self._connect(options) as conn:
            return commit_log.decisions(conn, sink_id, [(sink_id, 0)]).get((sink_id, 0))

    def record_run_end(
        self, options: SinkOptions, sink_id: str, run_id: str, how: str, error: str | None
    ) -> bool:
        from sqlsink.postgres import run_registry
        from sqlsink.postgres.sessions import session

        name = f"sqlsink {sink_id} end".encode()[:63].decode(errors="ignore")
        with session(options.url, options.password, application_name=name) as conn:
            return run_registry.record_end(conn, sink_id, run_id, how, error)

    def scrub(self, text: str, options: SinkOptions) -> str:
        from sqlsink.postgres.connection import scrub

        return scrub(text, options.url, options.password)


LOADING = PostgresLoading()
