"""The sink's options: parsed once on the driver, case-insensitive, checked as a whole."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlparse

from sqlsink.conninfo import default_schema, scheme_problem, with_params
from sqlsink.core.checkpoint_check import CheckpointMode
from sqlsink.core.committer import DEFAULT_KEEP_BATCHES, DEFAULT_RUN_TIMEOUT_S
from sqlsink.core.gid import check_sink_id
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.credentials import DEFAULT_CACHE_S, PasswordSource
from sqlsink.errors import ConfigError
from sqlsink.tablename import TableName


class Mode(enum.Enum):
    APPEND = "append"
    UPSERT = "upsert"
    # the foreachBatch writer's complete output mode: the batch, as one partition, deletes
    # every row of the table and loads its own (format("sqlsink") refuses it)
    REPLACE = "replace"


class Semantic(enum.Enum):
    """Delivery guarantee, named after Flink's: ``none`` is best effort, no flush guarantee."""

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    NONE = "none"


class SchemaEvolution(enum.Enum):
    """Option schemaEvolution: what planning may change in the target table (evolution.py)."""

    NONE = "none"
    ADD_COLUMNS = "addColumns"  # a DataFrame column the table lacks: added, nullable
    WIDEN = "widen"  # addColumns, and a column widened where PostgreSQL keeps its values


# option name (lower case) -> shown name, for messages
KNOWN = {
    "url": "url",
    "table": "table",
    "password": "password",
    "passwordcommand": "passwordCommand",
    "passwordprovider": "passwordProvider",
    "passwordcacheseconds": "passwordCacheSeconds",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sinkid": "sinkId",
    "semantic": "semantic",
    "createtable": "createTable",
    "mode": "mode",
    "locktimeout": "lockTimeout",
    "runtimeout": "runTimeout",
    "checkpointcheck": "checkpointCheck",
    "keepbatches": "keepBatches",
    "maxpartitions": "maxPartitions",
    "consistentview": "consistentView",
    "deadlettertable": "deadLetterTable",
    "keycolumns": "keyColumns",
    "deletecolumn": "deleteColumn",
    "schemaevolution": "schemaEvolution",
    "transactiontimeout": "transactionTimeout",
    "transactiontimeoutwarningratio": "transactionTimeoutWarningRatio",
    "ignorecommitfailuresaftertransactiontimeout": "ignoreCommitFailuresAfterTransactionTimeout",
}
# libpq's TLS parameters: passed through as they are, overriding the URL's
TLS_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
# set by Spark itself, never by the user
SPARK_OWNED = {"checkpointlocation", "path", "queryname"}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|seconds?|min|minutes?|h|hours?)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60}
_UNIT_SECONDS |= {"minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600}


def parse_duration(name: str, text: str) -> float:
    """Seconds from '30s', '500ms', '15min', '2h' or a bare number of seconds."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise ConfigError(f"option {name}: {text!r} is not a duration (e.g. '30s', '15min')")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]


_E = TypeVar("_E", bound=enum.Enum)
_T = TypeVar("_T")


def _choice(name: str, text: str, kind: type[_E], offered: Collection[_E] | None = None) -> _E:
    """The member whose value ``text`` is; an error offers ``offered`` (default: all)."""
    value = text.strip().lower()
    for member in kind:
        if member.value == value:
            return member
    choices = ", ".join(str(m.value) for m in kind if offered is None or m in offered)
    raise ConfigError(f"option {name}: unknown value {value!r} (choose one of {choices})")


def _parse_count(name: str, text: str) -> int:
    """A whole number of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"option {name}: {text!r} is not a whole number of at least 1")
    return int(text)


def _parse_bool(name: str, text: str) -> bool:
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name}: {text!r} is not true or false")


@dataclass(frozen=True)
class SinkOptions:
    url: str
    table: TableName
    # fixed, or a command / callable asked at each connect (cached per process)
    password: str | PasswordSource | None = None
    sink_id: str | None = None  # None: the streaming query's id
    semantic: Semantic = Semantic.EXACTLY_ONCE
    create_table: bool = False
    lock_timeout_s: float = 60.0
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S  # a run is live while heard from this recently
    keep_batches: int = DEFAULT_KEEP_BATCHES  # retention of the commit log's decisions
    # at most this many partitions per batch: each non-empty one takes a connection and a
    # prepared-transaction slot (None: no cap)
    max_partitions: int | None = None
    checkpoint: str | None = None
    # relate the checkpoint's commits/ to the log at commit time (docs/DESIGN.md invariant 9)
    checkpoint_check: CheckpointMode = CheckpointMode.WARN
    mode: Mode = Mode.APPEND
    key_columns: tuple[str, ...] = ()  # upsert: () means the table's primary key
    delete_column: str | None = None
    timeouts: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    # a view of the table that shows whole batches only (docs/DESIGN.md invariant 13)
    consistent_view: TableName | None = None
    schema_evolution: SchemaEvolution = SchemaEvolution.NONE
    # rows the sink judges unwritable go there, in the batch's transaction (dead_letters.py)
    dead_letter_table: TableName | None = None

    @classmethod
    def parse(
        cls, options: Mapping[str, str], modes: tuple[Mode, ...] = tuple(Mode)
    ) -> SinkOptions:
        """Every option checked, and every problem said in one ConfigError. ``modes``: the
        modes the entry point writes, the only ones a mode error offers."""
        opts = {k.lower(): v for k, v in options.items()}
        _check_names(opts)  # unknown and missing options: nothing else is read then
        problems: list[str] = []

        def take(read: Callable[[], _T], default: _T) -> _T:
            try:
                return read()
            except ConfigError as exc:
                problems.append(str(exc))
                return default

        def table_of() -> TableName:
            try:
                return TableName.parse(opts["table"], default_schema(opts["url"]))
            except ValueError as exc:
                raise ConfigError(f"option table: {exc}") from None

        table = take(table_of, None)
        semantic = take(
            lambda: _choice("semantic", opts.get("semantic", "exactly_once"), Semantic), None
        )
        mode = take(lambda: _choice("mode", opts.get("mode", "append"), Mode, modes), None)
        no_keys: tuple[tuple[str, ...], str | None] = ((), None)
        keys, delete_column = take(lambda: _upsert_columns(opts, mode or Mode.APPEND), no_keys)
        sink_id = opts.get("sinkid")
        password = take(lambda: _password(opts), None)
        valid_sink_id = take(lambda: check_sink_id(sink_id), None) if sink_id else None
        create_table = take(
            lambda: _parse_bool("createTable", opts.get("createtable", "false")), False
        )
        lock_timeout_s = take(
            lambda: parse_duration("lockTimeout", opts.get("locktimeout", "60s")), 60.0
        )
        run_timeout_s = take(
            lambda: parse_duration("runTimeout", opts.get("runtimeout", "5min")), 300.0
        )
        keep_batches = take(
            lambda: _parse_count("keepBatches", opts.get("keepbatches", "1000")), 1000
        )
        max_partitions = (
            take(lambda: _parse_count("maxPartitions", opts["maxpartitions"]), None)
            if opts.get("maxpartitions")
            else None
        )
        checkpoint_check = take(
            lambda: _choice("checkpointCheck", opts.get("checkpointcheck", "warn"), CheckpointMode),
            CheckpointMode.WARN,
        )
        timeouts = take(lambda: _timeouts(opts), TimeoutPolicy())
        schema_evolution = take(
            lambda: _schema_evolution(opts.get("schemaevolution", "none")),
            SchemaEvolution.NONE,
        )
        view = None
        if table is not None and semantic is not None and mode is not None:
            view = take(
                lambda: _consistent_view(opts.get("consistentview", ""), table, semantic, mode),
                None,
            )
        dead_letters = None
        if table is not None:
            dead_letters = take(
                lambda: _dead_letter_table(opts.get("deadlettertable", ""), table), None
            )
        tls = {k: opts[k] for k in TLS_PARAMS if opts.get(k)}
        url = take(lambda: with_params(opts["url"], tls), opts["url"])
        if problems or table is None or semantic is None or mode is None:
            raise ConfigError(f"sqlsink options: {'; '.join(problems)}")
        return cls(
            url=url,
            table=table,
            semantic=semantic,
            checkpoint=opts.get("checkpointlocation"),
            mode=mode,
            key_columns=keys,
            delete_column=delete_column,
            consistent_view=view,
            password=password,
            sink_id=valid_sink_id,
            create_table=create_table,
            lock_timeout_s=lock_timeout_s,
            run_timeout_s=run_timeout_s,
            keep_batches=keep_batches,
            max_partitions=max_partitions,
            checkpoint_check=checkpoint_check,
            timeouts=timeouts,
            schema_evolution=schema_evolution,
            dead_letter_table=dead_letters,
        )

    def __repr__(self) -> str:  # never show the password, even in a debugger
        return f"SinkOptions(table={self.table}, sink_id={self.sink_id}, semantic={self.semantic})"


def _check_names(opts: Mapping[str, str]) -> None:
    """Refuse unknown options and missing required ones, all of them in one message."""
    problems = [f"unknown option {k!r}" for k in opts if k not in KNOWN and k not in SPARK_OWNED]
    problems += [f"option {KNOWN[k]} is required" for k in ("url", "table") if not opts.get(k)]
    wrong_database = scheme_problem(opts["url"]) if opts.get("url") else None
    problems += [f"option url: {wrong_database}"] if wrong_database else []
    if problems:
        known = ", ".join(sorted(KNOWN.values()))
        raise ConfigError(f"sqlsink options: {'; '.join(problems)} (known options: {known})")


def _schema_evolution(text: str) -> SchemaEvolution:
    """The option schemaEvolution, its value case-insensitive (``addColumns``)."""
    for member in SchemaEvolution:
        if member.value.lower() == text.strip().lower():
            return member
    choices = ", ".join(m.value for m in SchemaEvolution)
    raise ConfigError(f"option schemaEvolution: unknown value {text!r} (choose one of {choices})")


def _upsert_columns(opts: Mapping[str, str], mode: Mode) -> tuple[tuple[str, ...], str | None]:
    """The options keyColumns and deleteColumn, which only mode=upsert takes."""
    keys = tuple(k.strip() for k in opts.get("keycolumns", "").split(",") if k.strip())
    delete_column = opts.get("deletecolumn", "").strip() or None
    if mode is not Mode.UPSERT and (keys or delete_column):
        given = "keyColumns" if keys else "deleteColumn"
        raise ConfigError(f"option {given} needs mode=upsert (mode is {mode.value})")
    return keys, delete_column


def _timeouts(opts: Mapping[str, str]) -> TimeoutPolicy:
    """The options transactionTimeout, transactionTimeoutWarningRatio and
    ignoreCommitFailuresAfterTransactionTimeout."""
    timeout = opts.get("transactiontimeout")
    ratio = opts.get("transactiontimeoutwarningratio", "0.8")
    try:
        ratio_value = float(ratio)
    except ValueError:
        ratio_value = -1.0
    if not 0 < ratio_value <= 1:
        raise ConfigError(
            f"option transactionTimeoutWarningRatio: {ratio!r} is not a number in (0, 1]"
        )
    ignore = _parse_bool(
        "ignoreCommitFailuresAfterTransactionTimeout",
        opts.get("ignorecommitfailuresaftertransactiontimeout", "false"),
    )
    if ignore and not timeout:
        raise ConfigError(
            "option ignoreCommitFailuresAfterTransactionTimeout needs transactionTimeout"
        )
    return TimeoutPolicy(
        parse_duration("transactionTimeout", timeout) if timeout else None, ratio_value, ignore
    )


def _password(opts: Mapping[str, str]) -> str | PasswordSource | None:
    """The option password, or a password source: passwordCommand / passwordProvider,
    with passwordCacheSeconds (a duration, default 300 s)."""
    given = [KNOWN[k] for k in ("password", "passwordcommand", "passwordprovider") if opts.get(k)]
    if len(given) > 1:
        raise ConfigError(f"options {' and '.join(given)}: give one of them, not both")
    cache = opts.get("passwordcacheseconds")
    cache_s = parse_duration("passwordCacheSeconds", cache) if cache else DEFAULT_CACHE_S
    if cache and not (opts.get("passwordcommand") or opts.get("passwordprovider")):
        raise ConfigError("option passwordCacheSeconds needs passwordCommand or passwordProvider")
    if command := opts.get("passwordcommand"):
        return PasswordSource.from_command(command, cache_s)
    if provider := opts.get("passwordprovider"):
        return PasswordSource.from_callable(provider, cache_s)
    return opts.get("password")


def _consistent_view(
    text: str, table: TableName, semantic: Semantic, mode: Mode
) -> TableName | None:
    """The option consistentView: a view name (unqualified: in the table's schema),
    refused where no view can show whole batches (docs/DESIGN.md invariant 13)."""
    if not text.strip():
        return None
    try:
        view = TableName.parse(text.strip(), default_schema=table.schema)
    except ValueError as exc:
        raise ConfigError(f"option consistentView: {exc}") from None
    if view == table:
        raise ConfigError(
            f"option consistentView: {view} is the target table itself; name a view "
            "for readers, e.g. consistentView=" + f"{table.name}_whole"
        )
    if semantic is not Semantic.EXACTLY_ONCE:
        raise ConfigError(
            f"option consistentView needs semantic=exactly_once (it is {semantic.value}): "
            "with at_least_once or none each partition commits on its own and records "
            "nothing that tells a whole batch from part of one, so no view can hide a "
            "batch committed in part. Use semantic=exactly_once, or drop consistentView"
        )
    if mode is not Mode.APPEND:
        raise ConfigError(
            f"option consistentView cannot be used with mode={mode.value}: a batch of that "
            "mode replaces and deletes rows, and once one of its transactions is committed "
            "the rows it replaced or deleted are gone, so no view can show the table as it "
            "was before the batch while the rest commits. Use mode=append (readers then "
            "see whole batches through the view), or drop consistentView"
        )
    return view


def _dead_letter_table(text: str, table: TableName) -> TableName | None:
    """The option deadLetterTable: a table name (unqualified: in the target's schema)."""
    if not text.strip():
        return None
    try:
        dead = TableName.parse(text.strip(), default_schema=table.schema)
    except ValueError as exc:
        raise ConfigError(f"option deadLetterTable: {exc}") from None
    if dead == table:
        raise ConfigError(
            f"option deadLetterTable: {dead} is the target table itself; name another "
            f"table, e.g. deadLetterTable={table.name}_dead_letters"
        )
    return dead


def checkpoint_query_id(checkpoint: str | None) -> str | None:
    """The query id in a local checkpoint's ``metadata`` file (None if not readable here)."""
    if not checkpoint:
        return None
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return None  # HDFS, S3, ...: the tasks' query id is used instead
    path = Path(unquote(parsed.path) if parsed.scheme else checkpoint) / "metadata"
    try:
        first_line = path.read_text(encoding="utf-8").splitlines()[0]
        query_id = json.loads(first_line)["id"]
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return None
    return str(query_id)


# -- the options' one definition: docs/reference/options.md is generated from it ----------


@dataclass(frozen=True)
class OptionSpec:
    """An option as the user sees it (scripts/gen_docs.py writes the reference from these;
    tests/unit/test_docs_options.py checks that they cover exactly ``KNOWN``)."""

    name: str  # the shown name, as KNOWN maps it
    default: str  # as the reference says it ("required", "—": none)
    meaning: str
    # how the foreachBatch writer takes it: a keyword of its own ("keyword"), or as said
    writer: str = "keyword"
    backends: tuple[str, ...] = ("PostgreSQL",)


_TLS_MEANING = (
    "TLS, passed to libpq unchanged (they override the URL's, where they may also be "
    "given): e.g. `sslmode=verify-full` with `sslrootcert=/path/ca.crt`; `sslcert`/`sslkey` "
    "for client-certificate logins. The files must exist on the driver and every executor"
)

OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "url",
        "required",
        "libpq URI or `key=value` conninfo (a `jdbc:` prefix is accepted); a multi-host URL "
        "with `target_session_attrs=read-write` follows a failover. MariaDB (tested on "
        "10.11) and MySQL 8.0.30+ (untested): `mariadb://user:password@host:port/database` "
        "or `mysql://...` (exactly_once append only)",
        writer="`url=` argument",
    ),
    OptionSpec(
        "table",
        "required",
        '`table`, `schema.table`, or `"Quoted"."Names"`',
        writer="per DataFrame: `to(table)`, `b.append(df, table)`",
    ),
    OptionSpec(
        "password",
        "—",
        "else from the URL or libpq's environment (`PGPASSWORD`, `.pgpass`); never shown in "
        "errors, logs or the commit log",
    ),
    OptionSpec(
        "passwordCommand",
        "—",
        "a command (run without a shell, on the driver and every executor) whose stdout is "
        "the password, e.g. `vault kv get -field=password secret/pg`: asked when a connection "
        "is opened, cached per process, asked again when the server refuses the password "
        "(rotated). See [passwords that rotate](../deployment/credentials.md"
        "#passwords-that-rotate-and-tls)",
    ),
    OptionSpec(
        "passwordProvider",
        "—",
        "the same from a Python function, `module:function` (no arguments, returns the "
        "password; importable on the executors too)",
    ),
    OptionSpec(
        "passwordCacheSeconds",
        "`300`",
        "how long a process reuses the password of `passwordCommand`/`passwordProvider` (a "
        "duration: `300`, `5min`; `0`: ask at every connect)",
    ),
    OptionSpec("sslmode", "libpq's", _TLS_MEANING),
    OptionSpec("sslrootcert", "libpq's", _TLS_MEANING),
    OptionSpec("sslcert", "libpq's", _TLS_MEANING),
    OptionSpec("sslkey", "libpq's", _TLS_MEANING),
    OptionSpec(
        "sinkId",
        "the streaming query's id (from the checkpoint's `metadata`)",
        "names the sink in transaction ids and the commit log; 1–64 letters, digits, `-`. "
        "One writer per sink id: another writer reusing it is refused. A batch load with "
        "a `sinkId` is idempotent",
        writer="`sink_id=` argument (required)",
    ),
    OptionSpec(
        "semantic",
        "`exactly_once`",
        "`exactly_once` (2PC), `at_least_once` (each partition commits "
        "directly), `none` (commits directly, without waiting for the WAL flush)",
    ),
    OptionSpec(
        "mode",
        "`append`",
        "`append`: binary `COPY` into the target; `upsert`: by key, last row of a key in the "
        "batch wins; `replace` (the writer only): the batch replaces every row",
        writer="per DataFrame: `to(table, mode=...)`, `b.upsert`, `b.replace`",
    ),
    OptionSpec(
        "keyColumns",
        "the table's primary key",
        "upsert key; a unique index on exactly these columns must exist",
        writer="per DataFrame: `key=[...]`",
    ),
    OptionSpec(
        "deleteColumn",
        "—",
        "upsert: a boolean DataFrame column; `true` deletes the key (change data capture)",
        writer="per DataFrame: `delete_column=`",
    ),
    OptionSpec(
        "createTable",
        "`false`",
        "create a missing target from the DataFrame's schema (SQLAlchemy DDL)",
    ),
    OptionSpec(
        "schemaEvolution",
        "`none`",
        "`none`: a DataFrame column the table lacks stops the query at planning; `addColumns`: "
        "it is added, nullable, with the type `createTable` gives it, before any partition "
        "writes; `widen`: that, and a column whose DataFrame type is wider is widened where "
        "PostgreSQL keeps every value (`integer` to `bigint`, `varchar(n)` to `text`, ...). "
        "Anything else is refused before anything is written, with the statement that fixes "
        "it ([schema evolution](../entry-points/data-source.md#schema-evolution))",
        writer="`schema_evolution=` argument",
    ),
    OptionSpec(
        "lockTimeout",
        "`60s`",
        "`lock_timeout` of every sink session: partition transactions and the sink lock wait "
        "at most this long; the error names who holds the lock (a prepared transaction, with "
        "the `sqlsink recover` that resolves it) and the fix",
    ),
    OptionSpec(
        "runTimeout",
        "`5min`",
        "a run is live while heard from within this, or within 3 × its recent batch interval "
        "when that is longer (the sink never learns the trigger: it measures the gaps "
        "between the run's last decisions); `sqlsink recover` never rolls back a live run's "
        "transactions. A run is heard from when a task of it starts or prepares, at each "
        "commit, and (foreachBatch writer) every `runTimeout`/3 (1.1 s at the shortest) "
        "while a `batch()` block is open, so a DataFrame that computes for long while "
        "another one of the batch is prepared is covered; the writer refuses a `runTimeout` "
        "under 3s, which those beats could not keep. Raise it above the longest time a "
        "batch goes without any of these: with the data source, your longest task (once the "
        "batch's other tasks have prepared, nothing else of it is heard while that one "
        "runs), or a lost shuffle stage that Spark recomputes mid-batch",
    ),
    OptionSpec(
        "maxPartitions",
        "—",
        "at most this many partitions per batch: each non-empty partition takes a connection "
        "and a prepared-transaction slot. The foreachBatch writer coalesces each batch to "
        'this many; `format("sqlsink")` cannot coalesce its input, so a batch with more is '
        "refused (nothing committed, the error says `df.coalesce(N)`), and a cap above the "
        "server's `max_prepared_transactions` is refused at planning",
    ),
    OptionSpec(
        "keepBatches",
        "`1000`",
        "decisions kept in the commit log per sink: every 100th batch the complete decisions "
        "more than this many batches old are pruned (the highest decided batch and any "
        "incomplete one always stay)",
    ),
    OptionSpec(
        "consistentView",
        "—",
        "a view for readers that shows whole batches only (`view` in the table's schema, or "
        "`schema.view`): the sink creates it at its first commit, replaces it when the table "
        "gains a column, "
        "and refuses to touch any other object of that name. Needs `semantic=exactly_once`, "
        "`mode=append` and a table without insert triggers; a batch load needs a `sinkId`. "
        "See [the guarantees](../guarantees.md)",
        writer="per appended table: `to(table, view=...)`, `b.append(df, table, view=...)`",
    ),
    OptionSpec(
        "deadLetterTable",
        "—",
        "a table (`table` in the target's schema, or `schema.table`) for the rows the sink "
        "judges unwritable before sending them (NUL in text, NULL into `NOT NULL`, a value "
        "out of the column's range or length, invalid UTF-8, infinity into `numeric`): each "
        "goes there as JSON with the reason and the column, in the partition's transaction, "
        "and the batch goes on; created at planning when missing. Rows only the server can "
        "refuse (a `CHECK`, a foreign key, a unique violation) still fail the batch. See "
        "[dead letters](../entry-points/data-source.md#dead-letters)",
        writer="`dead_letter_table=` argument",
    ),
    OptionSpec(
        "checkpointCheck",
        "`warn`",
        "at a run's first commit, compare the checkpoint's `commits/` with the commit log (a "
        "failover or restore that lost committed batches stops the query with a data-loss "
        "error); `warn`: a checkpoint the driver cannot read (local and `file:` directly, "
        "others through `pyarrow.fs`) is logged and shown as unverified; `require`: it stops "
        "the commit; `off`: never read",
    ),
    OptionSpec(
        "transactionTimeout",
        "—",
        "as in Flink: the time a batch's transactions may stay open (first write → `COMMIT "
        "PREPARED`, `XA COMMIT` on MariaDB)",
    ),
    OptionSpec(
        "transactionTimeoutWarningRatio",
        "`0.8`",
        "warn when a transaction was open longer than this share of `transactionTimeout`",
    ),
    OptionSpec(
        "ignoreCommitFailuresAfterTransactionTimeout",
        "`false`",
        "as in Flink: a decided transaction that is gone, decided longer than "
        "`transactionTimeout` ago, is logged as probable data loss and skipped instead of "
        "failing every restart",
    ),
)
