"""Server settings the sink depends on: read them, judge them, say how to fix them.

Three layers, so that the rules are testable without a server:

``read_settings(conn)``
    The effective values for the connection's login role and database, each with
    where it comes from (``pg_settings.source``, cross-checked with
    ``pg_db_role_setting``).
``analyse(settings, trigger_interval_s=..., partitions=..., slowest_write_s=...)``
    Pure: one ``Finding`` per setting checked (level "error", "warning" or "ok"),
    each naming the value, its source, the quantity it was compared with, and the
    exact statement that fixes it, at the level the value comes from.
``check_server(conn, ...)``
    Both. ``sqlsink check`` prints the findings; the sink calls
    ``check_at_start`` when a query starts, which logs them through
    ``log_findings`` (once, then again only when the verdict changes) and raises
    ``ConfigError`` on an error.

The rules (DESIGN.md section 5)
-------------------------------
``max_prepared_transactions``
    0: error (every PREPARE TRANSACTION fails; needs a restart to change). Fewer
    than the partitions of a batch: error (a batch can never prepare all of its
    partitions). Fewer than 2 x partitions: warning (retried and speculative
    attempts, and other users of the cluster-wide slots, need headroom). Only
    with ``exactly_once`` (the default); the other semantics never prepare.
``statement_timeout``, ``idle_in_transaction_session_timeout``, ``transaction_timeout`` (17+)
    Each can end a partition's transaction before it prepares (the COPY is one
    statement streaming all of a partition's rows; none of them applies once
    prepared). A non-zero value below the required time is a warning. Required:
    the longer of the trigger interval and ``safety_factor`` x the slowest
    partition write, when either is known; else ``FLOOR_S`` (10 min). (Verified on
    PostgreSQL 16: idle_in_transaction_session_timeout does not fire while a COPY
    streams, only between statements, so for it the rule is on the safe side.)
``lock_timeout``
    Overridden inside the sink's partition transactions (``partition.py`` sets
    ``lock_timeout`` from the option lockTimeout right after BEGIN): "ok". It
    does apply, though, to the waits for the sink's advisory lock outside those
    transactions (the committer; a partition resolving leftovers); below
    ``LOCK_WAIT_FLOOR_S`` that is a warning.
``idle_session_timeout``
    Closes a connection idle longer than it: shorter than the trigger interval
    (below ``FLOOR_S`` when the interval is unknown) is a warning, for a
    connection kept between batches.

Sources are those of the session that reads them: run the check connected as the
sink's role to the sink's database (its URL). Role settings (``ALTER ROLE``) are
those of the login role (``session_user``): PostgreSQL applies them at login and
``SET ROLE`` does not change them.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

import psycopg

from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection

ERROR, WARNING, OK = "error", "warning", "ok"

FLOOR_S = 600.0  # required time when neither the trigger interval nor the slowest write is known
LOCK_WAIT_FLOOR_S = 10.0  # below this, a server lock_timeout may end a wait for the sink's lock
DEFAULT_SAFETY_FACTOR = 3.0
MIN_PREPARED_SLOTS = 64
SINK_LOCK_TIMEOUT_DEFAULT = "60s"  # option lockTimeout's default (sqlsink.options)

TIMEOUTS = (
    "statement_timeout",
    "idle_in_transaction_session_timeout",
    "transaction_timeout",
    "lock_timeout",
    "idle_session_timeout",
)
SYNC_REP = ("synchronous_standby_names", "synchronous_commit")
SETTINGS = ("max_prepared_transactions", *TIMEOUTS, *SYNC_REP)

# pg_db_role_setting (setdatabase, setrole) != 0 -> the pg_settings.source it produces
_DB_ROLE_SOURCES = {
    (True, True): "database user",
    (False, True): "user",
    (True, False): "database",
    (False, False): "global",
}


# -- the data -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One verdict on one setting; the same fields as a finding of ``sqlsink check``."""

    level: str  # "error" | "warning" | "ok"
    setting: str  # e.g. "idle_in_transaction_session_timeout"
    value: str  # as PostgreSQL shows it (SHOW), e.g. "5s", "0"
    source: str  # "server (postgresql.conf)", "default", "database shop", "role app", ...
    message: str  # why it matters to the sink, naming the quantity it was compared with
    fix: str | None = None  # the exact statement, at the level the value comes from


@dataclass(frozen=True)
class Setting:
    """A row of pg_settings, as the reading session sees it."""

    name: str
    value: str  # current_setting(name): '5s', '0', '64'
    setting: str  # pg_settings.setting: '5000'
    unit: str | None  # pg_settings.unit: 'ms', 's', 'min' or None
    source: str  # pg_settings.source: 'default', 'configuration file', 'user', ...
    sourcefile: str | None = None  # visible to superusers and pg_read_all_settings only

    def seconds(self) -> float:
        """A time setting in seconds (0 when off)."""
        factor = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
        return float(self.setting) * factor.get(self.unit or "", 1.0)


@dataclass(frozen=True)
class ServerSettings:
    """What ``analyse`` judges: effective values and where they come from."""

    role: str  # the login role (session_user), whose ALTER ROLE settings apply
    database: str
    server_version_num: int
    settings: Mapping[str, Setting]
    # values stored by ALTER ROLE/DATABASE for this role and database, keyed by
    # (setting, the pg_settings.source they produce: 'user', 'database', 'database user',
    # 'global'); pg_settings.source names the one in effect
    stored: Mapping[tuple[str, str], str] = field(default_factory=dict)
    prepared_in_use: int = 0  # pg_prepared_xacts, cluster-wide
    server_version: str = ""
    # standbys connected as synchronous (pg_stat_replication.sync_state sync or quorum);
    # None when this role may not see it (pg_read_all_stats or pg_monitor may)
    sync_standbys: int | None = None


# -- reading ------------------------------------------------------------------------------


def read_settings(conn: Connection) -> ServerSettings:
    """The effective settings of this session's role and database, with their sources."""
    row = conn.execute(
        "SELECT session_user::text, current_database()::text, current_setting('server_version'), "
        "current_setting('server_version_num')::int, "
        "(SELECT oid FROM pg_roles WHERE rolname = session_user), "
        "(SELECT oid FROM pg_database WHERE datname = current_database()), "
        "(SELECT count(*) FROM pg_prepared_xacts), "
        "(SELECT CASE WHEN count(*) FILTER (WHERE sync_state IS NULL) > 0 THEN NULL "
        "             ELSE count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) END "
        "   FROM pg_stat_replication)"
    ).fetchone()
    assert row is not None
    role, database, version, version_num, role_oid, db_oid, in_use, sync_standbys = row
    rows = conn.execute(
        "SELECT name, current_setting(name), setting, unit, source, sourcefile "
        "FROM pg_settings WHERE name = ANY(%s)",
        (list(SETTINGS),),
    ).fetchall()
    found = {
        str(n): Setting(str(n), str(v), str(s), _opt(u), str(src), _opt(f))
        for n, v, s, u, src, f in rows
    }
    stored: dict[tuple[str, str], str] = {}
    try:
        overrides = conn.execute(
            "SELECT setdatabase <> 0, setrole <> 0, unnest(setconfig) FROM pg_db_role_setting "
            "WHERE setdatabase IN (0, %s) AND setrole IN (0, %s)",
            (db_oid, role_oid),
        ).fetchall()
    except psycopg.errors.InsufficientPrivilege:  # readable by everyone by default
        overrides = []
    for has_db, has_role, item in overrides:
        name, _, value = str(item).partition("=")
        if name in SETTINGS:
            stored[(name, _DB_ROLE_SOURCES[(bool(has_db), bool(has_role))])] = value
    return ServerSettings(
        role=str(role),
        database=str(database),
        server_version_num=int(version_num),
        settings=found,
        stored=stored,
        prepared_in_use=int(in_use),
        server_version=str(version),
        sync_standbys=None if sync_standbys is None else int(sync_standbys),
    )


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


# -- where a value comes from, and how to change it there ---------------------------------

# keywords that may not be a role or database name unquoted (pg_get_keywords() catcode
# R, C, T, PostgreSQL 16 and 17); quoting one too many is harmless
_KEYWORD_TEXT = """
    all analyse analyze and any array as asc asymmetric authorization between bigint binary
    bit boolean both case cast char character check coalesce collate collation column
    concurrently constraint create cross current_catalog current_date current_role
    current_schema current_time current_timestamp current_user dec decimal default deferrable
    desc distinct do else end except exists extract false fetch float for foreign freeze from
    full grant greatest group grouping having ilike in initially inner inout int integer
    intersect interval into is isnull join json json_array json_arrayagg json_exists
    json_object json_objectagg json_query json_scalar json_serialize json_table json_value
    lateral leading least left like limit localtime localtimestamp merge_action national
    natural nchar none normalize not notnull null nullif numeric offset on only or order out
    outer overlaps overlay placing position precision primary real references returning right
    row select session_user setof similar smallint some substring symmetric system_user table
    tablesample then time timestamp to trailing treat trim true union unique user using values
    varchar variadic verbose when where window with xmlattributes xmlconcat xmlelement
    xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable"""
_KEYWORDS = frozenset(_KEYWORD_TEXT.split())
_PLAIN_IDENT = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_ident(name: str) -> str:
    """A role or database name as SQL: bare when it may be, else double-quoted."""
    if _PLAIN_IDENT.fullmatch(name) and name not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def describe_source(setting: Setting, settings: ServerSettings) -> str:
    """Where the effective value comes from, in words naming the role and database."""
    role, db = settings.role, settings.database
    source = setting.source
    if source == "default":
        return "default"
    if source == "configuration file":
        name = os.path.basename(setting.sourcefile) if setting.sourcefile else "configuration file"
        return f"server ({name})"
    if source == "command line":
        return "server (command line)"
    if source == "environment variable":
        return "server (environment variable)"
    if source == "global":
        return "all roles (ALTER ROLE ALL)"
    if source == "database":
        return f"database {db}"
    if source == "user":
        return f"role {role}"
    if source == "database user":
        return f"role {role} in database {db}"
    if source == "client":
        return "connection options (PGOPTIONS or options= in the URL)"
    if source == "session":
        return "session"
    return f"server ({source})"


def role_fix(name: str, value: str, settings: ServerSettings) -> str:
    return f"ALTER ROLE {quote_ident(settings.role)} SET {name} = {value}"


def fix_statement(setting: Setting, value: str, settings: ServerSettings) -> str:
    """The statement that sets ``value`` (already SQL: '15min') where the current one comes
    from, so that it wins as the current one did."""
    role, db, name = quote_ident(settings.role), quote_ident(settings.database), setting.name
    source = setting.source
    if source == "database user":
        return f"ALTER ROLE {role} IN DATABASE {db} SET {name} = {value}"
    if source == "user":
        return f"ALTER ROLE {role} SET {name} = {value}"
    if source == "database":
        return f"ALTER DATABASE {db} SET {name} = {value}"
    if source == "global":
        return f"ALTER ROLE ALL SET {name} = {value}"
    if source == "client":
        return (
            f"remove -c {name}=... from the connection's options (the URL's options= "
            f"parameter or PGOPTIONS), or set -c {name}={value.strip(chr(39))} there"
        )
    if source == "session":
        return f"SET {name} = {value}"
    if source in ("default", "configuration file", "environment variable"):
        return f"ALTER SYSTEM SET {name} = {value}; SELECT pg_reload_conf();"
    # the command line (and anything more exotic) outranks ALTER SYSTEM: override per role
    return role_fix(name, value, settings)


def _alternative(setting: Setting, value: str, settings: ServerSettings) -> str:
    """For a value set for everybody: how to change it for the sink's role only."""
    if setting.source in ("database user", "user", "session", "client"):
        return ""
    if setting.source == "command line":
        return (
            " (it is set on the server's command line, which ALTER SYSTEM does not override: "
            "the fix overrides it for the sink's role)"
        )
    return f"; to change it for the sink's role only: {role_fix(setting.name, value, settings)}"


# -- durations ----------------------------------------------------------------------------


def format_seconds(seconds: float) -> str:
    """A duration the way PostgreSQL shows one: 500ms, 36s, 10min, 2h, 1d."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


_LADDER = (60, 300, 900, 1800, 3600, 7200, 21600, 43200, 86400)
_MAX_TIMEOUT_S = 2_147_483.647  # the timeouts are int milliseconds


def recommended(required_s: float) -> str:
    """A round value at least ``required_s``, as a SQL literal: '15min'."""
    for step in _LADDER:
        if step >= required_s:
            return f"'{format_seconds(step)}'"
    hours = math.ceil(required_s / 3600)
    if hours * 3600 > _MAX_TIMEOUT_S:
        return "0"  # longer than the setting can be: off
    return f"'{hours}h'"


@dataclass(frozen=True)
class _Required:
    seconds: float
    text: str  # what was compared with, for the message


def _required_time(
    trigger_interval_s: float | None, slowest_write_s: float | None, safety_factor: float
) -> _Required:
    trigger = trigger_interval_s if trigger_interval_s and trigger_interval_s > 0 else None
    slowest = slowest_write_s if slowest_write_s and slowest_write_s > 0 else None
    if trigger is None and slowest is None:
        return _Required(
            FLOOR_S,
            f"the conservative floor of {format_seconds(FLOOR_S)} (neither the trigger interval "
            "nor the slowest partition write is known)",
        )
    parts: list[tuple[float, str]] = []
    if trigger is not None:
        parts.append((trigger, f"the trigger interval ({format_seconds(trigger)})"))
    if slowest is not None:
        scaled = slowest * safety_factor
        parts.append(
            (
                scaled,
                f"{safety_factor:g} x the slowest partition write ({safety_factor:g} x "
                f"{format_seconds(slowest)} = {format_seconds(scaled)})",
            )
        )
    if len(parts) == 1:
        return _Required(*parts[0])
    longest = max(p[0] for p in parts)
    return _Required(
        longest, f"the longer of {parts[0][1]} and {parts[1][1]}, i.e. {format_seconds(longest)}"
    )


# -- the rules ----------------------------------------------------------------------------

_EFFECTS = {
    "statement_timeout": (
        "cancels any statement that runs longer, including a partition's COPY, one "
        "statement that streams all of the partition's rows"
    ),
    "idle_in_transaction_session_timeout": (
        "ends a partition's session that sits idle inside its transaction for longer: between "
        "BEGIN, the COPY, the marker row and PREPARE TRANSACTION (not while the COPY streams)"
    ),
    "transaction_timeout": (
        "ends a partition's transaction that lasts longer before it reaches PREPARE TRANSACTION"
    ),
}


def analyse(
    settings: ServerSettings,
    *,
    trigger_interval_s: float | None,
    partitions: int | None,
    slowest_write_s: float | None,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
    exactly_once: bool = True,
) -> list[Finding]:
    """One finding per setting checked (transaction_timeout from PostgreSQL 17 on).

    ``trigger_interval_s``: the query's trigger interval (None, or 0 for "as fast as
    possible", when unknown); ``partitions``: partitions per batch; ``slowest_write_s``:
    the longest a partition's write (BEGIN to PREPARE) has taken.
    """
    out: list[Finding] = []
    mpt = settings.settings.get("max_prepared_transactions")
    if mpt is not None:
        out.append(_prepared_slots(mpt, settings, partitions, exactly_once))
    required = _required_time(trigger_interval_s, slowest_write_s, safety_factor)
    for name in ("statement_timeout", "idle_in_transaction_session_timeout", "transaction_timeout"):
        setting = settings.settings.get(name)
        if setting is None or (
            name == "transaction_timeout" and settings.server_version_num < 170000
        ):
            continue
        out.append(_transaction_timeout(setting, settings, required))
    lock = settings.settings.get("lock_timeout")
    if lock is not None:
        out.append(_lock_timeout(lock, settings))
    idle = settings.settings.get("idle_session_timeout")
    if idle is not None:
        out.append(_idle_session(idle, settings, trigger_interval_s))
    names = settings.settings.get("synchronous_standby_names")
    if names is not None:
        out.append(_synchronous_standbys(names, settings))
    return out


def prepared_slots_needed(partitions: int | None) -> int:
    return max(MIN_PREPARED_SLOTS, 2 * (partitions or 0))


def _prepared_slots(
    s: Setting, settings: ServerSettings, partitions: int | None, exactly_once: bool
) -> Finding:
    source = describe_source(s, settings)
    slots = int(s.setting)
    needed = prepared_slots_needed(partitions)
    in_use = settings.prepared_in_use
    if not exactly_once:
        return Finding(
            OK,
            s.name,
            s.value,
            source,
            "not needed: only semantic=exactly_once prepares transactions",
        )

    def fix(n: int) -> str:
        if s.source == "command line":
            return (
                f"restart PostgreSQL with -c max_prepared_transactions={n} (it is set on the "
                "server's command line, which ALTER SYSTEM does not override)"
            )
        return f"ALTER SYSTEM SET max_prepared_transactions = {n}; -- then restart PostgreSQL"

    if slots == 0:
        return Finding(
            ERROR,
            s.name,
            s.value,
            source,
            "prepared transactions are disabled on this server: set max_prepared_transactions "
            f"to at least {needed} and restart PostgreSQL (exactly-once writes end each "
            "partition's transaction with PREPARE TRANSACTION, which fails while it is 0; "
            "or use the option semantic=at_least_once)",
            fix(needed),
        )
    if partitions and slots < partitions:
        return Finding(
            ERROR,
            s.name,
            s.value,
            source,
            f"max_prepared_transactions = {slots} is fewer than the {partitions} partitions of a "
            "batch, which all stay prepared until the batch commits: no batch can ever "
            f"commit; set it to at least {needed} (2 x partitions) and restart PostgreSQL",
            fix(needed),
        )
    usage = f"{in_use} of {slots} in use now, cluster-wide"
    if partitions and slots < 2 * partitions:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"max_prepared_transactions = {slots} ({usage}) is fewer than 2 x the {partitions} "
            f"partitions of a batch = {2 * partitions}: retried and speculative attempts, "
            "leftovers and other users of the cluster-wide slots need headroom, and a "
            "partition that finds no free slot fails its batch",
            fix(needed),
        )
    if partitions and slots - in_use < partitions:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"only {slots - in_use} of {slots} prepared-transaction slots are free (cluster-wide) "
            f"for the {partitions} partitions of a batch: leftover prepared transactions hold "
            "the others",
            "sqlsink status / sqlsink recover to resolve the sink's leftovers (others: see "
            "pg_prepared_xacts)",
        )
    compared = f"at least 2 x the {partitions} partitions of a batch" if partitions else "above 0"
    return Finding(
        OK, s.name, s.value, source, f"prepared transactions are enabled: {compared} ({usage})"
    )


def _transaction_timeout(s: Setting, settings: ServerSettings, required: _Required) -> Finding:
    source = describe_source(s, settings)
    effect = _EFFECTS[s.name]
    seconds = s.seconds()
    if seconds == 0:
        return Finding(OK, s.name, s.value, source, "off: it cannot end a partition's transaction")
    if seconds >= required.seconds:
        return Finding(
            OK,
            s.name,
            s.value,
            source,
            f"{s.value} is at least {required.text}; it {effect} (prepared transactions are "
            "not affected)",
        )
    value = recommended(required.seconds)
    return Finding(
        WARNING,
        s.name,
        s.value,
        source,
        f"{s.name} = {s.value}, from {source}, is shorter than {required.text}: it {effect}, "
        "before the transaction is prepared; the partition then fails and its batch is "
        f"retried, and may fail again the same way{_alternative(s, value, settings)}",
        fix_statement(s, value, settings),
    )


def _lock_timeout(s: Setting, settings: ServerSettings) -> Finding:
    source = describe_source(s, settings)
    overridden = (
        "the sink's partition transactions set their own lock_timeout right after BEGIN "
        f"(option lockTimeout, default {SINK_LOCK_TIMEOUT_DEFAULT}), which replaces this value "
        "there"
    )
    seconds = s.seconds()
    if seconds == 0:
        return Finding(OK, s.name, s.value, source, f"off; {overridden}")
    floor = format_seconds(LOCK_WAIT_FLOOR_S)
    if seconds >= LOCK_WAIT_FLOOR_S:
        return Finding(
            OK,
            s.name,
            s.value,
            source,
            f"{overridden}; outside them it bounds the short waits for the sink's lock "
            f"(committer, resolution of leftovers), and {s.value} is at least the {floor} "
            "those may take",
        )
    value = recommended(LOCK_WAIT_FLOOR_S)
    return Finding(
        WARNING,
        s.name,
        s.value,
        source,
        f"{s.name} = {s.value}, from {source}, is shorter than {floor}: {overridden}, but it "
        "applies to the waits for the sink's lock (pg_advisory_lock) outside them: the "
        "committer's, and a partition's that resolves leftovers, which wait while another "
        "session commits or "
        "resolves (after a crash, or during sqlsink recover); a wait that gives up fails the "
        f"commit or the task{_alternative(s, value, settings)}",
        fix_statement(s, value, settings),
    )


def _synchronous_standbys(s: Setting, settings: ServerSettings) -> Finding:
    """Waits at commit time for a standby: what bounds them (invariant 11, syncrep)."""
    source = describe_source(s, settings)
    commit = settings.settings.get("synchronous_commit")
    level = commit.value if commit is not None else "on"
    if not s.value.strip():
        return Finding(OK, s.name, "''", source, "commits do not wait for a standby")
    waits = (
        "the sink's decisions (written with synchronous_commit = on)"
        if level in ("off", "local")
        else "every PREPARE TRANSACTION, COMMIT PREPARED and commit-log write of the sink "
        f"(synchronous_commit = {level})"
    )
    bound = (
        f"{waits} waits until a standby confirms it; neither lock_timeout nor "
        "statement_timeout ends that wait, so the sink cancels each of its writes after its "
        "lockTimeout plus a second: the transaction is then committed on this server but not "
        "confirmed, and the sink fails the batch with an error naming this setting (the "
        "restart finds the batch committed)"
    )
    if settings.sync_standbys == 0:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"no synchronous standby is connected (pg_stat_replication): {bound}",
            "start or reconnect the standby, or ALTER SYSTEM SET synchronous_standby_names = "
            "''; SELECT pg_reload_conf();",
        )
    seen = (
        "this role cannot see pg_stat_replication's sync_state (GRANT pg_monitor to see it)"
        if settings.sync_standbys is None
        else f"{settings.sync_standbys} synchronous standby(s) connected"
    )
    return Finding(OK, s.name, s.value, source, f"{seen}; {bound}")


def _idle_session(
    s: Setting, settings: ServerSettings, trigger_interval_s: float | None
) -> Finding:
    source = describe_source(s, settings)
    effect = "closes a connection idle for longer"
    seconds = s.seconds()
    if seconds == 0:
        return Finding(OK, s.name, s.value, source, "off: no idle connection is closed")
    if trigger_interval_s and trigger_interval_s > 0:
        required = _Required(
            trigger_interval_s, f"the trigger interval ({format_seconds(trigger_interval_s)})"
        )
    else:
        required = _required_time(None, None, DEFAULT_SAFETY_FACTOR)
    if seconds >= required.seconds:
        return Finding(
            OK, s.name, s.value, source, f"{s.value} is at least {required.text}; it {effect}"
        )
    value = recommended(required.seconds)
    return Finding(
        WARNING,
        s.name,
        s.value,
        source,
        f"{s.name} = {s.value}, from {source}, is shorter than {required.text}: it {effect}, so a "
        "connection kept open between batches (the driver's) is closed under it"
        f"{_alternative(s, value, settings)}",
        fix_statement(s, value, settings),
    )


# -- entry points -------------------------------------------------------------------------


def check_server(
    conn: Connection,
    *,
    trigger_interval_s: float | None = None,
    partitions: int | None = None,
    slowest_write_s: float | None = None,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
    exactly_once: bool = True,
) -> list[Finding]:
    """``read_settings`` then ``analyse``: the findings for this connection's role and database."""
    return analyse(
        read_settings(conn),
        trigger_interval_s=trigger_interval_s,
        partitions=partitions,
        slowest_write_s=slowest_write_s,
        safety_factor=safety_factor,
        exactly_once=exactly_once,
    )


def max_prepared_transactions(conn: Connection) -> int:
    row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    return int(row[0]) if row else 0


def require_prepared_transactions(conn: Connection, partitions: int | None = None) -> None:
    """Exactly-once needs PREPARE TRANSACTION: fail before any data is written if it is off
    (or, with ``partitions``, has fewer slots than a batch's partitions)."""
    settings = read_settings(conn)
    mpt = settings.settings["max_prepared_transactions"]
    finding = _prepared_slots(mpt, settings, partitions, exactly_once=True)
    if finding.level == ERROR:
        raise ConfigError(_as_error(finding), setting=finding.setting, value=finding.value)


def _as_error(finding: Finding) -> str:
    text = f"{finding.message} [{finding.setting} = {finding.value}, from {finding.source}]"
    return f"{text}; fix: {finding.fix}" if finding.fix else text


Verdict = frozenset[tuple[str, str, str, str]]
VerdictState = MutableMapping[str, Verdict]
_VERDICTS: dict[str, Verdict] = {}  # the default state: this Python process's


def verdict(findings: Iterable[Finding]) -> Verdict:
    """What is wrong, as a comparable value: (level, setting, value, source) of each
    warning and error ("ok" findings do not count)."""
    return frozenset((f.level, f.setting, f.value, f.source) for f in findings if f.level != OK)


def log_findings(
    findings: Sequence[Finding],
    key: str,
    logger: logging.Logger | None = None,
    state: VerdictState | None = None,
) -> bool:
    """Log the warnings and errors, unless the same verdict was logged last for ``key``.

    Intended use: the sink checks the server when a query starts and, cheaply, at later
    batches (with the slowest write measured so far); it calls this with the sink id (or
    query id) as ``key`` every time, and the log shows the problems once per query start
    and again only when they change, not once per batch. When the problems go away, one
    INFO line says so. ``state`` holds the last verdict per key: pass a dict the caller
    keeps for as long as the warnings should not repeat (the driver's query object, say);
    by default it is this process's, and a fresh Python worker starts empty, which logs
    again, as a new query start should. Returns whether anything was logged.
    """
    log = logger or logging.getLogger("sqlsink")
    memory = _VERDICTS if state is None else state
    new = verdict(findings)
    old = memory.get(key)
    if old == new:
        return False
    memory[key] = new
    if not new:
        if old:
            log.info("sqlsink %s: the server settings reported before are now fine", key)
            return True
        return False
    for f in findings:
        if f.level == OK:
            continue
        log.log(
            logging.ERROR if f.level == ERROR else logging.WARNING,
            "sqlsink %s: %s = %s (%s): %s%s",
            key,
            f.setting,
            f.value,
            f.source,
            f.message,
            f"; fix: {f.fix}" if f.fix else "",
        )
    return True


def check_at_start(
    conn: Connection,
    *,
    key: str,
    trigger_interval_s: float | None = None,
    partitions: int | None = None,
    slowest_write_s: float | None = None,
    exactly_once: bool = True,
    logger: logging.Logger | None = None,
    state: VerdictState | None = None,
) -> list[Finding]:
    """The driver's check when a query starts (or later, with what it has measured): log the
    warnings through ``log_findings`` and raise ``ConfigError`` on an error, before any
    data is written."""
    findings = check_server(
        conn,
        trigger_interval_s=trigger_interval_s,
        partitions=partitions,
        slowest_write_s=slowest_write_s,
        exactly_once=exactly_once,
    )
    log_findings(findings, key, logger, state)
    errors = [f for f in findings if f.level == ERROR]
    if errors:
        raise ConfigError(
            " | ".join(_as_error(f) for f in errors),
            setting=errors[0].setting,
            value=errors[0].value,
        )
    return findings
