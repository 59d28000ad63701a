"""The Spark adapters' interface (:class:`sqlsink.core.loading.Loading`) for MariaDB and
MySQL: planning (the server's version, ``local_infile``, the commit log, the table
matched against the DataFrame or created through SQLAlchemy's MySQL dialect), the
partition writer (``sqlsink.mariadb.partition``: LOAD DATA LOCAL INFILE into an XA
branch), the committer's and the heartbeat's backend, the run's end record.

What is PostgreSQL's only, and how each method here answers it:
- ``consistent_views``: a ConfigError (no consistent view on MariaDB; planning refuses
  ``consistentView`` first, by the missing capability).
- ``view_sharing_rows``: None (no view of the sink's exists on MariaDB);
  ``rewrite_refusal``: a sentence, never reached (no view).
- ``slots_refusal``: None: MariaDB has no ``max_prepared_transactions``; a prepared
  branch holds no session (the partition disconnects after XA PREPARE), so the number
  of partitions is bounded only by ``max_connections`` during the load, which the
  server refuses in its own words (``sqlsink check`` on MariaDB is not built).
- ``recheck_after_commit``: no-op (the server checks are not built on MariaDB).
- ``check_writer_start``: the server's version, binlog_format and the commit log.
Upsert (``upsert.py``): the key is keyColumns or the primary key, and a unique index
on exactly those columns must exist; deleteColumn is a boolean DataFrame column, not
the table's. Refused at planning with the reason: replace, schemaEvolution,
consistentView (by capability), a dead-letter table, a semantic other than
exactly_once, TLS options.
Every method imports what it needs when called."""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlsink.errors import ConfigError

if TYPE_CHECKING:
    from sqlsink.core.backend import TwoPhaseBackend, ViewKeeper
    from sqlsink.core.loading import (
        ColumnKind,
        Mode,
        SchemaChanges,
        SinkOptions,
        TableName,
    )
    from sqlsink.core.loading import TargetPlan as AnyPlan
    from sqlsink.core.model import Decision, PartitionOutcome, TaskIdentity
    from sqlsink.mariadb.backend import MariaDBBackend
    from sqlsink.mariadb.connection import Connection
    from sqlsink.mariadb.upsert import UpsertPlan

log = logging.getLogger("sqlsink")

# MySQL's XA is crash-safe with the binary log from 8.0.30 (issue 31); older is refused
MYSQL_XA_SAFE = (8, 0, 30)
# MariaDB keeps a prepared XA branch when its session ends from 10.5 (MDEV-742); before,
# the server rolls it back, and each partition disconnects after XA PREPARE
MARIADB_DETACHES_XA = (10, 5)
TESTED_MARIADB = (10, 11)
_warned: set[str] = set()


def version_numbers(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of ``VERSION()``; MariaDB's replication prefix ``5.5.5-``
    (as some proxies and old clients show it) is skipped."""
    text = version[len("5.5.5-") :] if version.startswith("5.5.5-") else version
    return tuple(int(n) for n in re.findall(r"\d+", text.split("-")[0])[:3])


def server_verdict(version: str) -> tuple[str | None, str | None]:
    """(refusal, warning) for a server's ``VERSION()``, the planner's and ``sqlsink
    check``'s alike: MariaDB before 10.5 is refused (MDEV-742), 10.11 passes, other
    MariaDB is served but untested; MySQL older than 8.0.30 is refused, newer is served
    but untested (no MySQL server in the tests)."""
    numbers = version_numbers(version)
    if "mariadb" in version.lower():
        if numbers[:2] < MARIADB_DETACHES_XA:
            return (
                f"the server is MariaDB {version}, older than 10.5: it rolls a prepared XA "
                "branch back when the session that prepared it ends (MDEV-742), and each "
                "partition of the sink disconnects after XA PREPARE, so every batch would "
                "lose its branches (the sink reports that as data loss). Nothing was "
                "written. Fix: upgrade to MariaDB 10.11",
                None,
            )
        if numbers[:2] == TESTED_MARIADB:
            return None, None
        return None, (
            f"untested: sqlsink's XA backend is tested on MariaDB 10.11 only; MariaDB "
            f"{version} runs the same statements"
        )
    if numbers < MYSQL_XA_SAFE:
        return (
            f"the server is MySQL {version}: sqlsink refuses MySQL older than 8.0.30, whose "
            "XA is not crash-safe with the binary log (a crash can lose a prepared or "
            "committed branch, or apply it on a replica only). Nothing was written. Fix: "
            "upgrade to MySQL 8.0.30 or later, or write to MariaDB",
            None,
        )
    return None, (
        f"the server is MySQL {version}: sqlsink's XA backend is tested on MariaDB 10.11 "
        "only; on MySQL 8.0.30+ it runs the same statements but is untested"
    )


def check_server(conn: Connection) -> None:
    """Refuse a MariaDB older than 10.5, a MySQL older than 8.0.30 and statement binary
    logging; warn (once per process) of a version that is untested."""
    from sqlsink.mariadb.backend import statement_logging
    from sqlsink.mariadb.connection import rows

    version, log_bin, binlog_format = rows(
        conn, "SELECT VERSION(), @@log_bin, @@SESSION.binlog_format"
    )[0]
    judge_version(str(version))
    if log_bin and str(binlog_format).upper() == "STATEMENT":
        raise ConfigError(f"{statement_logging(str(binlog_format))}. Nothing was written")


def judge_version(version: str) -> None:
    """``check_server``'s verdict on the server's ``SELECT VERSION()``."""
    refusal, warning = server_verdict(version)
    if refusal is not None:
        raise ConfigError(refusal)
    if warning is not None and version not in _warned:
        _warned.add(version)
        log.warning("sqlsink: %s", warning)


def password_of(options: SinkOptions) -> str | None:
    """The option password, or what the password command or provider gives."""
    from sqlsink.credentials import PasswordSource

    given = options.password
    return given.get() if isinstance(given, PasswordSource) else given


def session_url(options: SinkOptions) -> str:
    """The URL with the option password in it (a query parameter, which wins over the
    URL's own): the partition's target carries one string to the executors."""
    password = password_of(options)
    if password is None:
        return str(options.url)
    url = str(options.url)
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}password={urllib.parse.quote(password, safe='')}"


@contextmanager
def _session(options: SinkOptions, doing: str, **kw: Any) -> Iterator[Connection]:
    """A session of the driver's; ``doing`` names what it is for in a failed connect's
    error (planning, the commit of a batch, the heartbeat, the run's end)."""
    from sqlsink.mariadb.connection import connect

    conn = connect(options.url, password=password_of(options), doing=doing, **kw)
    try:
        yield conn
    finally:
        conn.close()


@dataclass(frozen=True)
class MariaDBPlan:
    """The table (its database and name) and its columns in the DataFrame's order."""

    database: str
    table: str
    columns: tuple[str, ...]
    key: tuple[str, ...] = ()  # upsert's key in the DataFrame's spelling (parts.by_key)
    upsert: UpsertPlan | None = None

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.table}"


def _writable(kind: Any) -> bool:
    import pyarrow as pa

    t = pa.types
    return bool(
        t.is_null(kind)
        or t.is_boolean(kind)
        or t.is_integer(kind)
        or t.is_floating(kind)
        or t.is_decimal(kind)
        or t.is_date(kind)
        or t.is_timestamp(kind)
        or t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_binary(kind)
        or t.is_large_binary(kind)
    )


def _refuse_options(options: SinkOptions) -> None:
    problems = []
    if options.mode.value == "replace":
        problems.append(
            "the complete output mode (replace) needs a TRUNCATE inside the prepared "
            "transaction, which MariaDB's XA cannot hold (DDL ends a transaction)"
        )
    if options.semantic.value != "exactly_once":
        problems.append(
            f"semantic={options.semantic.value} is not built on MariaDB (exactly_once is)"
        )
    if options.dead_letter_table is not None:
        problems.append("deadLetterTable is not built on MariaDB")
    if problems:
        raise ConfigError(
            f"sqlsink on MariaDB (table {options.table}): {'; '.join(problems)}. Nothing "
            "was written"
        )


def _columns(conn: Connection, database: str, table: str) -> list[tuple[Any, ...]]:
    from sqlsink.mariadb.connection import rows

    return rows(
        conn,
        "SELECT column_name, is_nullable, column_default, extra FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (database, table),
    )


def unique_keys(conn: Connection, database: str, table: str) -> list[tuple[bool, tuple[str, ...]]]:
    """(is it the primary key, its columns) of each unique index of the table on whole
    columns: an index on a column's prefix (``UNIQUE KEY (k(3))``) is not unique on the
    column's values, so upsert's staging table (unique on the whole column) would send two
    keys sharing the prefix to ON DUPLICATE KEY UPDATE, the second overwriting the first's
    row."""
    from sqlsink.mariadb.connection import rows

    found: dict[str, list[str]] = {}
    prefixed: set[str] = set()
    for index, column, sub_part in rows(
        conn,
        "SELECT index_name, column_name, sub_part FROM information_schema.statistics "
        "WHERE table_schema = %s AND table_name = %s AND non_unique = 0 "
        "ORDER BY index_name, seq_in_index",
        (database, table),
    ):
        found.setdefault(str(index), []).append(str(column))
        if sub_part is not None:
            prefixed.add(str(index))
    return [
        (index == "PRIMARY", tuple(cols)) for index, cols in found.items() if index not in prefixed
    ]


def plan_upsert(
    options: SinkOptions,
    keys_found: Sequence[tuple[bool, tuple[str, ...]]],
    matched: Mapping[str, str],
    field_types: Mapping[str, Any],
) -> tuple[UpsertPlan | None, tuple[str, ...], list[str]]:
    """Upsert's plan (the key in the table's spelling), the key in the DataFrame's
    spelling, and the problems. ``matched``: DataFrame column -> table column."""
    import pyarrow as pa

    from sqlsink.mariadb.upsert import UpsertPlan

    problems = []
    delete = options.delete_column
    if delete is not None:
        if delete not in field_types:
            problems.append(f"deleteColumn {delete!r} is not a column of the DataFrame")
        elif not pa.types.is_boolean(field_types[delete]):
            problems.append(
                f"deleteColumn {delete!r} has Arrow type {field_types[delete]}: it must be a "
                "boolean (true deletes the key)"
            )
    given = tuple(options.key_columns)
    if not given:
        primary = [cols for is_primary, cols in keys_found if is_primary]
        if not primary:
            problems.append(
                "mode=upsert needs a key: the table has no primary key on whole columns; "
                "set the option keyColumns (with a unique index on those columns)"
            )
            return None, (), problems
        given = primary[0]
    by_lower = {table.lower(): frame for frame, table in matched.items()}
    keys = []
    spelled = []
    for k in given:
        frame = by_lower.get(k.lower())
        if frame is None:
            problems.append(f"key column {k!r} is not among the DataFrame's columns")
            continue
        keys.append(matched[frame])
        spelled.append(frame)
    wanted = {k.lower() for k in given}
    if not any({c.lower() for c in cols} == wanted for _, cols in keys_found):
        names = ", ".join(f"`{k}`" for k in given)
        problems.append(
            f"no unique index of the table is on exactly ({names}), which upsert's ON "
            f"DUPLICATE KEY UPDATE needs: ALTER TABLE ... ADD UNIQUE KEY ({names}) (an "
            "index on a prefix of a column, as k(3), does not count: two keys sharing the "
            "prefix would overwrite each other's row)"
        )
    if problems:
        return None, (), problems
    return UpsertPlan(tuple(keys), delete), tuple(spelled), problems


# a privilege the server refuses: for a table, for a column, for a database
_DENIED = {1142, 1143, 1044}


def refuse_missing_privileges(
    conn: Connection, database: str, plan: MariaDBPlan, upsert: UpsertPlan
) -> None:
    """Refuse at planning, with the GRANT that fixes it, a user that may not do what
    upsert's branch does: create its temporary staging table, INSERT ... SELECT the
    written columns (SELECT on the key and updated columns), UPDATE the updated ones,
    DELETE with deleteColumn. Each is tried on no row (WHERE FALSE, rolled back): the
    server checks privileges before it looks for rows."""
    from sqlsink.mariadb.connection import errno, execute, rows
    from sqlsink.mariadb.upsert import quote_name

    where = f"{quote_name(database)}.{quote_name(plan.table)}"  # quoted: a name may hold a backtick
    written = [c for c in plan.columns if c != upsert.delete_column]
    lower_keys = {k.lower() for k in upsert.keys}
    updated = [c for c in written if c.lower() not in lower_keys] or [upsert.keys[0]]
    names = ", ".join(map(quote_name, written))
    sets = ", ".join(f"{quote_name(c)} = {quote_name(c)}" for c in updated)
    tries = [
        ("CREATE TEMPORARY TABLES", upsert.create_stage(where, database, written)),
        ("INSERT", [f"INSERT INTO {where} ({names}) SELECT {names} FROM {where} WHERE FALSE"]),
        ("UPDATE", [f"UPDATE {where} SET {sets} WHERE FALSE"]),
    ]
    if upsert.delete_column:
        tries.append(("DELETE", [f"DELETE FROM {where} WHERE FALSE"]))
    missing: list[str] = []
    said: list[str] = []
    execute(conn, "BEGIN")
    try:
        for privilege, statements in tries:
            try:
                for statement in statements:
                    execute(conn, statement)
            except Exception as exc:
                if errno(exc) not in _DENIED:
                    raise
                missing.append(privilege)
                said.append(str(exc.args[1]))
    finally:
        execute(conn, "ROLLBACK")
        execute(conn, f"DROP TEMPORARY TABLE IF EXISTS {upsert.stage(database)}")
    if not missing:
        return
    user = str(rows(conn, "SELECT CURRENT_USER()")[0][0])
    name, _, host = user.rpartition("@")
    on_table = [p for p in missing if p != "CREATE TEMPORARY TABLES"]
    grants = []
    if on_table:
        grants.append(f"GRANT SELECT, {', '.join(on_table)} ON {where} TO '{name}'@'{host}'")
    if "CREATE TEMPORARY TABLES" in missing:
        grants.append(
            f"GRANT CREATE TEMPORARY TABLES ON {quote_name(database)}.* TO '{name}'@'{host}'"
        )
    raise ConfigError(
        f"user {user} lacks {', '.join(missing)} for upsert into {where} (its branch creates a "
        "temporary staging table, inserts ... on duplicate key updates the written columns"
        + (", and deletes the flagged keys" if upsert.delete_column else "")
        + f"); server says: {'; '.join(said)}. Nothing was written. Fix: {'; '.join(grants)}"
    )


def match_columns(
    where: str,
    engine: str | None,
    table_columns: Sequence[tuple[Any, ...]],
    field_names: Sequence[str],
    field_types: Mapping[str, Any],
    delete_column: str | None = None,
) -> tuple[str, ...]:
    """The table's name of each DataFrame column (MariaDB's column names are case
    insensitive; upsert's ``delete_column`` is the DataFrame's own, as it is); every
    mismatch in one ConfigError."""
    by_name = {str(c[0]).lower(): c for c in table_columns}
    problems = []
    if engine is not None and engine.lower() != "innodb":
        problems.append(
            f"its engine is {engine}, which takes no part in XA (its rows would be written "
            "at once, outside the batch's transaction): use ENGINE=InnoDB"
        )
    matched = []
    for field in field_names:
        if field == delete_column:
            matched.append(field)
            continue
        column = by_name.get(field.lower())
        if column is None:
            problems.append(f"DataFrame column {field!r} is not in the table")
            continue
        if "generated" in str(column[3]).lower():
            problems.append(f"column {column[0]!r} is generated: the DataFrame cannot write it")
        if not _writable(field_types[field]):
            problems.append(
                f"DataFrame column {field!r} has Arrow type {field_types[field]}, which the "
                "MariaDB load does not write: cast it in Spark to a string, a number, a "
                "decimal, a date or a timestamp"
            )
        matched.append(str(column[0]))
    given = {f.lower() for f in field_names if f != delete_column}
    for name, nullable, default, extra in table_columns:
        if str(name).lower() in given or nullable == "YES" or default is not None:
            continue
        if "auto_increment" in str(extra).lower() or "generated" in str(extra).lower():
            continue
        problems.append(f"table column {name!r} is NOT NULL without a default and not given")
    if problems:
        raise ConfigError(
            f"table {where} does not match the DataFrame: {'; '.join(problems)}. Nothing was "
            "written"
        )
    return tuple(matched)


class MariaDBLoading:
    """:class:`sqlsink.core.loading.Loading` for MariaDB (and MySQL 8.0.30+, untested)."""

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
    ) -> MariaDBPlan:
        from sqlsink.mariadb.connection import rows
        from sqlsink.mariadb.schema import ensure_schema

        _refuse_options(options)
        database, name = options.table.schema, options.table.name
        if not database:
            raise ConfigError(
                f"table {name!r} names no database and the url names none: give the table "
                "as database.table, or the url as mariadb://user@host:port/database"
            )
        where = f"`{database}`.`{name}`"
        with _session(options, "planning the batch", local_infile=True) as conn:
            check_server(conn)
            if not rows(conn, "SELECT @@local_infile")[0][0]:
                raise ConfigError(
                    "the server refuses LOAD DATA LOCAL INFILE (local_infile is OFF), which "
                    "the sink's load needs. Nothing was written. Fix: SET GLOBAL "
                    "local_infile = ON (and local_infile=ON in the server's configuration)"
                )
            ensure_schema(conn)
            found = _columns(conn, database, name)
            if not found and create_columns is not None:
                self._create(conn, database, name, create_columns())
                found = _columns(conn, database, name)
            if not found:
                raise ConfigError(
                    f"table {where} does not exist (or the sink's user cannot see it). "
                    "Nothing was written. Fix: create it, or set createTable=true"
                )
            engine = rows(
                conn,
                "SELECT engine FROM information_schema.tables "
                "WHERE table_schema = %s AND table_name = %s",
                (database, name),
            )
            arrow = arrow_schema()
            types = {f.name: f.type for f in arrow}
            delete = options.delete_column if options.mode.value == "upsert" else None
            try:
                columns = match_columns(
                    where, str(engine[0][0]) if engine else None, found, field_names, types,
                    delete,
                )  # fmt: skip
                problems: list[str] = []
            except ConfigError as exc:
                if options.mode.value != "upsert":
                    raise
                columns, problems = (), [str(exc)]  # with upsert's, in one message
            if options.mode.value != "upsert":
                return MariaDBPlan(database, name, columns)
            matched = (
                dict(zip(field_names, columns, strict=True))
                if columns
                else {f: f for f in field_names}
            )
            keys_found = unique_keys(conn, database, name)
            upsert, ordering, more = plan_upsert(options, keys_found, matched, types)
            if problems or more:
                said = "; ".join(problems + [f"upsert into {where}: {p}" for p in more])
                raise ConfigError(said if problems else f"{said}. Nothing was written")
            assert upsert is not None
            plan = MariaDBPlan(database, name, columns, ordering, upsert)
            refuse_missing_privileges(conn, database, plan, upsert)
        return plan

    def _create(self, conn: Connection, database: str, name: str, columns: Sequence[Any]) -> None:
        import sqlalchemy as sa
        from sqlalchemy.dialects import mysql
        from sqlalchemy.schema import CreateTable

        from sqlsink.mariadb.connection import execute

        table = sa.Table(
            name,
            sa.MetaData(),
            *columns,
            schema=database,
            mysql_engine="InnoDB",
            mysql_charset="utf8mb4",
        )
        ddl = CreateTable(table, if_not_exists=True).compile(dialect=mysql.dialect())
        execute(conn, str(ddl).replace("%", "%%"))

    def column_type(self, kind: ColumnKind) -> Any | None:
        """MariaDB's type (SQLAlchemy's MySQL dialect) of ``kind``; None for an array (no
        array type on MariaDB)."""
        import sqlalchemy as sa
        from sqlalchemy.dialects import mysql

        simple: dict[str, Any] = {
            "boolean": sa.Boolean,
            "int8": mysql.TINYINT,
            "int16": sa.SmallInteger,
            "int32": sa.Integer,
            "int64": sa.BigInteger,
            "float32": mysql.FLOAT,
            "float64": mysql.DOUBLE,
            "string": mysql.LONGTEXT,
            "binary": mysql.LONGBLOB,
            "date": sa.Date,
            # DATETIME(6), not TIMESTAMP: TIMESTAMP ends in 2038; the session is in UTC
            "timestamp": lambda: mysql.DATETIME(fsp=6),
            "timestamptz": lambda: mysql.DATETIME(fsp=6),
        }
        if kind.name in simple:
            return simple[kind.name]()
        if kind.name == "decimal":
            return sa.Numeric(kind.precision, kind.scale)
        return None  # arrays, documents: the load does not write them

    def column(self, name: str, type_: Any, nullable: bool) -> Any:
        import sqlalchemy as sa

        return sa.Column(name, type_, nullable=nullable)

    def view_sharing_rows(
        self, options: SinkOptions, table: TableName, views: Mapping[TableName, TableName]
    ) -> TableName | None:
        return None  # no consistent view on MariaDB, so none of the sink's shares rows

    def rewrite_refusal(
        self, where: str, table: TableName, mode: Mode, view: TableName, viewed: TableName
    ) -> str:
        return f"{where}: {mode.value} into {table}, which view {view} of {viewed} shows"

    @contextmanager
    def committer_backend(self, options: SinkOptions, sink_id: str) -> Iterator[MariaDBBackend]:
        with self._backend(options, f"sink {sink_id}: the driver's commit session") as backend:
            yield backend

    @contextmanager
    def heartbeat_backend(self, options: SinkOptions, sink_id: str) -> Iterator[MariaDBBackend]:
        with self._backend(options, f"sink {sink_id}: the run's heartbeat") as backend:
            yield backend

    @contextmanager
    def _backend(self, options: SinkOptions, doing: str) -> Iterator[MariaDBBackend]:
        from sqlsink.mariadb.backend import MariaDBBackend

        with _session(options, doing) as conn:
            yield MariaDBBackend(conn, options.lock_timeout_s)

    def consistent_views(
        self, backend: TwoPhaseBackend, views: Sequence[tuple[TableName, TableName]]
    ) -> ViewKeeper:
        raise ConfigError(
            "consistentView is not built on MariaDB (no consistent view of whole batches); "
            "nothing of the batch is committed"
        )

    def check_writer_start(self, backend: TwoPhaseBackend, *, exactly_once: bool) -> None:
        from sqlsink.mariadb.backend import MariaDBBackend
        from sqlsink.mariadb.schema import ensure_schema

        assert isinstance(backend, MariaDBBackend), type(backend)
        check_server(backend.conn)  # the version and the binary log's format
        ensure_schema(backend.conn)

    def slots_refusal(self, options: SinkOptions, partitions: int) -> ConfigError | None:
        return None  # no max_prepared_transactions: a prepared branch holds no session

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
        return None  # the server checks are not built on MariaDB (Capability.SERVER_CHECKS)

    def write_partition(
        self, options: SinkOptions, plan: AnyPlan, task: TaskIdentity, batches: Iterable[Any]
    ) -> PartitionOutcome:
        from sqlsink.mariadb.partition import LoadTarget, write_partition

        assert isinstance(plan, MariaDBPlan), type(plan)
        target = LoadTarget(
            url=session_url(options),
            table=plan.qualified,
            lock_timeout_s=options.lock_timeout_s,
            timeouts=options.timeouts,
            run_timeout_s=options.run_timeout_s,
            upsert=plan.upsert,
        )
        names = list(plan.columns)
        return write_partition(target, task, (b.rename_columns(names) for b in batches))

    def forget_one_off_load(self, options: SinkOptions, sink_id: str) -> None:
        from sqlsink.mariadb.connection import LOG_DATABASE, execute

        with _session(options, f"sink {sink_id}: forgetting the one-off load") as conn:
            execute(conn, "BEGIN")
            try:
                execute(conn, "SET @sqlsink_forget = %s", (sink_id,))
                for table in ("handovers", "markers", "decisions", "runs", "sinks"):
                    statement = f"DELETE FROM `{LOG_DATABASE}`.{table} WHERE sink_id = %s"
                    execute(conn, statement, (sink_id,))
                execute(conn, "COMMIT")
            finally:
                execute(conn, "SET @sqlsink_forget = NULL")

    def load_decision(self, options: SinkOptions, sink_id: str) -> Decision | None:
        from sqlsink.mariadb import commit_log
        from sqlsink.mariadb.connection import LOG_DATABASE

        with _session(options, f"sink {sink_id}: reading the one-off load's decision") as conn:
            found = commit_log.decisions(conn, LOG_DATABASE, sink_id, [(sink_id, 0)])
        return found.get((sink_id, 0))

    def record_run_end(
        self, options: SinkOptions, sink_id: str, run_id: str, how: str, error: str | None
    ) -> bool:
        from sqlsink.mariadb import run_registry
        from sqlsink.mariadb.connection import LOG_DATABASE

        doing = f"sink {sink_id}: recording the end ({how}) of run {run_id}"
        with _session(options, doing) as conn:
            return run_registry.record_end(conn, LOG_DATABASE, sink_id, run_id, how, error)

    def scrub(self, text: str, options: SinkOptions) -> str:
        from sqlsink.credentials import known_passwords
        from sqlsink.urlparts import mariadb_params, redact

        secrets = sorted(known_passwords(), key=len, reverse=True)
        if isinstance(options.password, str) and options.password:
            secrets.append(options.password)
        try:
            given = mariadb_params(options.url)["password"]
        except ConfigError:
            given = None
        if given:  # as given and as the URL writes it
            secrets += [str(given), urllib.parse.quote(str(given), safe="")]
        for secret in secrets:
            text = text.replace(secret, "***")
        return redact(text)


LOADING = MariaDBLoading()

if TYPE_CHECKING:
    from sqlsink.core.loading import Loading

    _conforms: Loading = LOADING
