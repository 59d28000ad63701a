"""The sink's options: parsed once on the driver, case-insensitive, checked as a whole."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlparse

from sqlsink.conninfo import with_params
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
    "keycolumns": "keyColumns",
    "deletecolumn": "deleteColumn",
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


def _choice(name: str, text: str, kind: type[_E]) -> _E:
    value = text.strip().lower()
    for member in kind:
        if member.value == value:
            return member
    choices = ", ".join(str(m.value) for m in kind)
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

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        _check_names(opts)
        try:
            table = TableName.parse(opts["table"])
        except ValueError as exc:
            raise ConfigError(f"option table: {exc}") from None
        semantic = _choice("semantic", opts.get("semantic", "exactly_once"), Semantic)
        mode = _choice("mode", opts.get("mode", "append"), Mode)
        keys, delete_column = _upsert_columns(opts, mode)
        sink_id = opts.get("sinkid")
        timeouts = _timeouts(opts)
        view = _consistent_view(opts.get("consistentview", ""), table, semantic, mode)
        tls = {k: opts[k] for k in TLS_PARAMS if opts.get(k)}
        return cls(
            url=with_params(opts["url"], tls),
            table=table,
            password=_password(opts),
            sink_id=check_sink_id(sink_id) if sink_id else None,
            semantic=semantic,
            create_table=_parse_bool("createTable", opts.get("createtable", "false")),
            lock_timeout_s=parse_duration("lockTimeout", opts.get("locktimeout", "60s")),
            run_timeout_s=parse_duration("runTimeout", opts.get("runtimeout", "5min")),
            keep_batches=_parse_count("keepBatches", opts.get("keepbatches", "1000")),
            max_partitions=(
                _parse_count("maxPartitions", opts["maxpartitions"])
                if opts.get("maxpartitions")
                else None
            ),
            checkpoint=opts.get("checkpointlocation"),
            checkpoint_check=_choice(
                "checkpointCheck", opts.get("checkpointcheck", "warn"), CheckpointMode
            ),
            mode=mode,
            key_columns=keys,
            delete_column=delete_column,
            timeouts=timeouts,
            consistent_view=view,
        )

    def __repr__(self) -> str:  # never show the password, even in a debugger
        return f"SinkOptions(table={self.table}, sink_id={self.sink_id}, semantic={self.semantic})"


def _check_names(opts: Mapping[str, str]) -> None:
    """Refuse unknown options and missing required ones, all of them in one message."""
    problems = [f"unknown option {k!r}" for k in opts if k not in KNOWN and k not in SPARK_OWNED]
    problems += [f"option {KNOWN[k]} is required" for k in ("url", "table") if not opts.get(k)]
    if problems:
        known = ", ".join(sorted(KNOWN.values()))
        raise ConfigError(f"sqlsink options: {'; '.join(problems)} (known options: {known})")


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
