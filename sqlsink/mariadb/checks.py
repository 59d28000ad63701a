"""``sqlsink check`` on MariaDB (and MySQL): the server's settings, version and
privileges, judged against what the sink does there. One entry point,
``run_checks(conn, ctx)``, on the PyMySQL session of ``sqlsink.mariadb.connection``
connected as the sink's user (its URL): the values judged are those a new session of
that user gets, and each finding names where the value comes from (MariaDB's
``information_schema.SYSTEM_VARIABLES.GLOBAL_VALUE_ORIGIN``, MySQL's
``performance_schema.variables_info``) and the statement that fixes it there.

What the sink does on MariaDB, which the rules rest on (sqlsink/mariadb/):
- No session is kept between batches: each partition opens one, loads its rows with
  ``LOAD DATA LOCAL INFILE`` (one statement streaming the partition from Spark's
  iterator through a FIFO) inside an XA branch, prepares and disconnects; the after-
  PREPARE check, each commit, abort and heartbeat open their own and close them.
- Every session of the tasks, commits and heartbeats sets ``innodb_lock_wait_timeout``
  from the option lockTimeout (``MariaDBBackend``); the planner's session (which
  creates and migrates the commit log, and the table with createTable) and the run's
  end record do not.
- The commit log is the database ``sqlsink`` on the same server (``schema.py``).

The rules (each finding: level, setting, value, source, message, fix):
``server version``
    MariaDB 10.11: ok (tested). MariaDB before 10.5: error (a prepared XA branch is
    rolled back when its session disconnects, MDEV-742, and the sink disconnects after
    XA PREPARE). Other MariaDB: warning (untested). MySQL: ``loading.server_verdict``,
    the planner's own verdict (older than 8.0.30: error; else warning, untested).
``local_infile``
    OFF: error (the load needs it; the planner refuses to start).
``log_bin``
    ON on MariaDB: warning naming MDEV-21469 and MDEV-31921 (open reports of crashes
    that lose a prepared or decided branch with the binary log on; the sink's marker
    rows make such a loss a data-loss error, never a silent gap).
``binlog_format`` (with the binary log on)
    STATEMENT: error (the sink's sessions run at READ COMMITTED, which InnoDB logs by
    rows only: every write is refused, 1665; measured).
``read_only``
    ON: error, unless the user has SUPER or READ_ONLY ADMIN (every write refused, 1290).
``max_connections`` (or a lower ``max_user_connections``, also one set per user)
    Against partitions + 2 (a connection per loading partition, the driver's heartbeat
    and commit): warning when fewer are open, or free now.
``net_read_timeout``
    The server waits at most this long for each next piece of a partition's
    ``LOAD DATA LOCAL``: a longer pause of Spark's iterator between two Arrow batches
    ends the load (measured: net_read_timeout 2 s, a 5 s pause). Warning below the
    servers' default, 30 s.
``max_statement_time`` (MariaDB; per user too)
    Ends any statement that runs longer, the partition's LOAD DATA included (measured).
    Warning when shorter than the trigger interval (else a floor of 10 min) or than
    lockTimeout's default (the sink lock's GET_LOCK is one statement).
``innodb_lock_wait_timeout``
    Replaced on the sink's task, commit and heartbeat sessions by lockTimeout; applies
    to the planner's session and to other applications writing rows a prepared branch
    holds until its batch commits, or altering a table it wrote (measured: ALTER TABLE
    behind a prepared branch waits this long, then fails with 1205; the detached branch
    holds no metadata lock). Warning below 10 s.
``wait_timeout``
    Closes a session idle between statements for longer. No session of the sink is
    idle between batches, so the trigger interval does not bound it; a commit's own
    pauses do (reading the checkpoint): warning below 60 s. ``interactive_timeout`` is
    not judged: PyMySQL does not connect as an interactive client, so the sink's
    sessions take wait_timeout.
``XA RECOVER``
    Run as the sink's user: MySQL 8 refuses it without XA_RECOVER_ADMIN (error, with
    the GRANT); MariaDB lists every prepared branch to any user (measured on 10.11).
``sqlsink schema`` and ``sqlsink privileges``
    The commit log's version (not installed: info, the sink's first run creates it),
    and the privileges on ``sqlsink`` that ``SHOW GRANTS`` gives (roles included): to
    create it (CREATE, TRIGGER, and with the binary log on SUPER or
    ``log_bin_trust_function_creators``), and to use it (SELECT, INSERT, UPDATE, DELETE).
``target privileges``
    INSERT on the URL's database (the sink's appends), CREATE for createTable.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlsink.core.admin import CheckContext, Finding
from sqlsink.mariadb import xid
from sqlsink.mariadb.connection import LOG_DATABASE, Connection, errno, rows

ERROR, WARNING, OK, INFO = "error", "warning", "ok", "info"

FLOOR_S = 600.0  # a statement's required time when the trigger interval is unknown
SINK_LOCK_TIMEOUT_S = 60.0  # option lockTimeout's default (sqlsink.options)
LOCK_WAIT_FLOOR_S = 10.0
WAIT_FLOOR_S = 60.0
NET_READ_FLOOR_S = 30.0  # MariaDB's and MySQL's default
DRIVER_SESSIONS = 2  # the driver's heartbeat and its commit, beside the loading partitions

_SETTINGS = (
    "local_infile",
    "log_bin",
    "log_bin_trust_function_creators",
    "max_connections",
    "max_user_connections",
    "net_read_timeout",
    "max_statement_time",
    "innodb_lock_wait_timeout",
    "wait_timeout",
    "binlog_format",
    "read_only",
    "innodb_flush_log_at_trx_commit",
    "sync_binlog",
)
# limits MariaDB's GRANT ... WITH sets for one user: the session shows it
_PER_USER = ("max_statement_time", "max_user_connections")
_ORIGINS = {  # MariaDB's GLOBAL_VALUE_ORIGIN
    "COMPILE-TIME": "default",
    "COMMAND-LINE": "server (command line)",
    "SQL": "server (SET GLOBAL)",
    "AUTO": "server (set automatically)",
    "ENVIRONMENT": "server (environment)",
}
_MYSQL_SOURCES = {  # MySQL's performance_schema.variables_info.VARIABLE_SOURCE
    "COMPILED": "default",
    "COMMAND_LINE": "server (command line)",
    "DYNAMIC": "server (SET GLOBAL)",
    "PERSISTED": "server (SET PERSIST)",
}


@dataclass(frozen=True)
class Variable:
    name: str
    value: str  # what a new session of the sink's user gets
    source: str  # in words: "default", "server (my.cnf)", ...
    origin: str  # the server's own word: COMPILE-TIME, CONFIG, COMMAND-LINE, SQL, ...
    path: str | None = None  # the configuration file, when it comes from one

    def number(self) -> float:
        try:
            return float(self.value)
        except ValueError:
            return 0.0

    def on(self) -> bool:
        return self.value.upper() in ("ON", "1", "YES", "TRUE")


@dataclass(frozen=True)
class Server:
    version: str
    mariadb: bool
    numbers: tuple[int, ...]
    user: str  # CURRENT_USER(): 'user@host'
    database: str | None  # the URL's database
    variables: Mapping[str, Variable]

    @property
    def kind(self) -> str:
        return "MariaDB" if self.mariadb else "MySQL"

    @property
    def account(self) -> str:
        """The sink's account as SQL: 'user'@'host'."""
        name, _, host = self.user.rpartition("@")
        return f"{_literal(name)}@{_literal(host)}"


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# -- reading -------------------------------------------------------------------------------


def read_server(conn: Connection) -> Server:
    version, user, database = rows(conn, "SELECT VERSION(), CURRENT_USER(), DATABASE()")[0]
    version = str(version)
    mariadb = "mariadb" in version.lower()
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    variables = _read_mariadb(conn) if mariadb else _read_mysql(conn)
    return Server(version, mariadb, numbers, str(user), database and str(database), variables)


def _read_mariadb(conn: Connection) -> dict[str, Variable]:
    found = rows(
        conn,
        "SELECT lower(VARIABLE_NAME), GLOBAL_VALUE, SESSION_VALUE, GLOBAL_VALUE_ORIGIN, "
        "GLOBAL_VALUE_PATH FROM information_schema.SYSTEM_VARIABLES "
        f"WHERE VARIABLE_NAME IN ({', '.join(['%s'] * len(_SETTINGS))})",
        [s.upper() for s in _SETTINGS],
    )
    out = {}
    for name, global_value, session_value, origin, path in found:
        name, origin = str(name), str(origin or "")
        value = _shown(global_value)
        source = _ORIGINS.get(origin, f"server ({origin.lower()})")
        if origin == "CONFIG":
            source = f"server ({os.path.basename(path)})" if path else "server (configuration)"
        if name == "log_bin":  # read-only, said by the option log-bin; its origin says nothing
            source = "server (option log-bin)" if value.upper() == "ON" else "default"
        if name in _PER_USER and session_value is not None:
            mine = _shown(session_value)
            if mine != value:  # GRANT ... WITH MAX_STATEMENT_TIME n (or ...) for the user
                value, source, origin = mine, "the user's limit (GRANT ... WITH)", "USER"
        out[name] = Variable(name, value, source, origin, path and str(path))
    return out


def _read_mysql(conn: Connection) -> dict[str, Variable]:
    """performance_schema.variables_info where readable, else SHOW GLOBAL VARIABLES."""
    marks = ", ".join(["%s"] * len(_SETTINGS))
    try:
        found = rows(
            conn,
            "SELECT g.VARIABLE_NAME, g.VARIABLE_VALUE, i.VARIABLE_SOURCE, i.VARIABLE_PATH "
            "FROM performance_schema.global_variables g JOIN performance_schema.variables_info "
            f"i USING (VARIABLE_NAME) WHERE g.VARIABLE_NAME IN ({marks})",
            list(_SETTINGS),
        )
    except Exception:  # performance_schema off, or not readable
        found = []
    if not found:
        found = [
            (n, v, "", None)
            for n, v in rows(
                conn, f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({marks})", list(_SETTINGS)
            )
        ]
    out = {}
    for name, value, origin, path in found:
        name, origin = str(name).lower(), str(origin or "")
        source = _MYSQL_SOURCES.get(origin, "unknown" if not origin else "server (option file)")
        if path:
            source = f"server ({os.path.basename(str(path))})"
        out[name] = Variable(name, _shown(value), source, origin or "UNKNOWN", path and str(path))
    return out


def _shown(value: object) -> str:
    """A value as the server shows it, numbers without a trailing '.000000'."""
    text = "" if value is None else str(value)
    if re.fullmatch(r"\d+\.0+", text):
        return text.split(".")[0]
    return text


# -- fixes ---------------------------------------------------------------------------------


def fix(server: Server, v: Variable, value: str) -> str:
    """SET GLOBAL (or SET PERSIST on MySQL) now, and the line that keeps it at a restart,
    where the current value comes from."""
    if not server.mariadb:
        return f"SET PERSIST {v.name} = {value}"
    line = f"{v.name} = {value}"
    if v.origin == "COMMAND-LINE":
        keep = (
            f"and change --{v.name.replace('_', '-')} on mariadbd's command line (it "
            "outranks the configuration files)"
        )
    elif v.path:
        keep = f"and {line} in {v.path}"
    else:
        keep = f"and {line} under [mariadbd] in the server's configuration"
    return f"SET GLOBAL {v.name} = {value}; {keep}"


def seconds_text(seconds: float) -> str:
    return f"{seconds:g} s"


def _round_up(seconds: float) -> int:
    for step in (30, 60, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if step >= seconds:
            return step
    return int(math.ceil(seconds / 3600) * 3600)


# -- the rules -----------------------------------------------------------------------------


def check_version(server: Server, ctx: CheckContext) -> list[Finding]:
    from sqlsink.mariadb.loading import server_verdict  # the planner's verdict, one rule

    name, v, where = "server version", server.version, "server"
    refusal, warning = server_verdict(server.version)
    if refusal is not None:
        advice = (
            "upgrade to MariaDB 10.11" if server.mariadb else "upgrade to MySQL 8.0.30 or later"
        )
        said = refusal.split(". Nothing was written")[0]
        return [Finding(ERROR, name, v, where, said, advice)]
    if warning is not None:
        return [Finding(WARNING, name, v, where, warning)]
    return [Finding(OK, name, v, where, "MariaDB 10.11: the version sqlsink's tests run on")]


def check_local_infile(server: Server, ctx: CheckContext) -> list[Finding]:
    v = server.variables.get("local_infile")
    if v is None:
        return []
    if v.on():
        return [
            Finding(
                OK,
                v.name,
                v.value,
                v.source,
                "each partition loads its rows with LOAD DATA LOCAL INFILE, which this allows",
            )
        ]
    return [
        Finding(
            ERROR,
            v.name,
            v.value,
            v.source,
            "the server refuses LOAD DATA LOCAL INFILE, with which each partition loads its "
            "rows: the sink refuses to start",
            fix(server, v, "ON"),
        )
    ]


def check_binary_log(server: Server, ctx: CheckContext) -> list[Finding]:
    v = server.variables.get("log_bin")
    if v is None:
        return []
    if not v.on():
        return [
            Finding(OK, v.name, v.value, v.source, "no binary log: its XA caveats do not apply")
        ]
    if not server.mariadb:
        return [
            Finding(
                OK,
                v.name,
                v.value,
                v.source,
                "MySQL 8.0.30 and later keep XA and the binary log consistent through a crash",
            )
        ]
    return [
        Finding(
            WARNING,
            v.name,
            v.value,
            v.source,
            "with the binary log on, open MariaDB reports (MDEV-21469, MDEV-31921) describe "
            "crashes of mariadbd that lose a prepared or a decided XA branch; the sink's "
            "marker rows turn such a loss into a data-loss error naming the batch and "
            "partition, never a silent gap (sqlsink's tests run with the binary log on). A "
            "reader of the binary log (change data capture) sees a branch's rows at XA "
            "PREPARE, before the batch is decided",
            "keep it if replicas, point-in-time recovery or change data capture need it; "
            "otherwise remove log-bin from the server's configuration and restart mariadbd",
        )
    ]


def check_durability(server: Server, ctx: CheckContext) -> list[Finding]:
    """Invariant 1's durability: each commit on disk when it returns. Otherwise a crash of
    the host (power, the kernel; not mariadbd's alone) can take back the last commits:
    decisions and XA COMMITs among them, so the database goes back in time. The sink does
    not lose such a batch silently (Spark's checkpoint names batches the log lacks: a
    data-loss error), but the rows are gone and must come again from the source."""
    out: list[Finding] = []
    back = (
        "a crash of the host (power, the kernel) can take back about the last second of "
        "commits, the sink's decisions and XA COMMITs among them; the sink then reports "
        "the batches Spark committed whose records are gone as data loss (never a silent "
        "gap), and their rows must come again from the source"
    )
    v = server.variables.get("innodb_flush_log_at_trx_commit")
    if v is not None:
        when = "once a second" if v.value.strip() in ("0", "2") else "not at each commit"
        if v.value.strip() == "1":
            out.append(
                Finding(OK, v.name, v.value, v.source, "each commit is on disk when it returns")
            )
        else:
            out.append(
                Finding(
                    WARNING,
                    v.name,
                    v.value,
                    v.source,
                    f"InnoDB writes its log to disk {when}: {back}",
                    fix(server, v, "1"),
                )
            )
    log_bin = server.variables.get("log_bin")
    v = server.variables.get("sync_binlog")
    if v is not None and log_bin is not None and log_bin.on():
        if v.value.strip() == "1":
            out.append(
                Finding(OK, v.name, v.value, v.source, "the binary log is on disk at each commit")
            )
        else:
            out.append(
                Finding(
                    WARNING,
                    v.name,
                    v.value,
                    v.source,
                    "with the binary log on, it decides every commit (XA's included) at a "
                    "restart, and it is not written to disk at each commit: a branch the "
                    f"binary log lost is rolled back although its commit returned; {back}",
                    fix(server, v, "1"),
                )
            )
    return out


def check_binlog_format(server: Server, ctx: CheckContext) -> list[Finding]:
    """With the binary log on, STATEMENT logging refuses every write of the sink: its
    sessions run at READ COMMITTED, which InnoDB logs by rows only (measured: 1665)."""
    v, log_bin = server.variables.get("binlog_format"), server.variables.get("log_bin")
    if v is None or log_bin is None or not log_bin.on():
        return []
    if v.value.upper() != "STATEMENT":
        return [
            Finding(
                OK,
                v.name,
                v.value,
                v.source,
                "the sink's sessions run at READ COMMITTED, which InnoDB logs by rows: "
                f"{v.value} allows it",
            )
        ]
    return [
        Finding(
            ERROR,
            v.name,
            v.value,
            v.source,
            "the sink's sessions run at READ COMMITTED, which InnoDB logs by rows only: with "
            "binlog_format = STATEMENT the server refuses every write of the sink (error "
            "1665), its loads and its commit log's",
            fix(server, v, "ROW"),
        )
    ]


def check_read_only(conn: Connection, server: Server, ctx: CheckContext) -> list[Finding]:
    """A read-only server (a replica, say) refuses the sink's writes, unless the user may
    write all the same (SUPER, READ_ONLY ADMIN)."""
    v = server.variables.get("read_only")
    if v is None:
        return []
    if not v.on():
        return [Finding(OK, v.name, v.value, v.source, "the server accepts writes")]
    exempt = {"SUPER", "READ_ONLY ADMIN", "ALL PRIVILEGES"}
    if exempt & read_grants(conn, server.mariadb).global_:
        return [
            Finding(
                OK,
                v.name,
                v.value,
                v.source,
                f"the server is read-only, but {server.user} may write all the same (SUPER or "
                "READ_ONLY ADMIN)",
            )
        ]
    return [
        Finding(
            ERROR,
            v.name,
            v.value,
            v.source,
            f"the server is read-only (a replica?): it refuses every write of {server.user}, "
            "the sink's loads and its commit log's (error 1290)",
            f"point the URL at the primary server; or {fix(server, v, 'OFF')}",
        )
    ]


def check_connections(conn: Connection, server: Server, ctx: CheckContext) -> list[Finding]:
    v = server.variables.get("max_connections")
    if v is None:
        return []
    most = int(v.number())
    per_user = server.variables.get("max_user_connections")
    limit, limiter = most, v
    if per_user is not None and 0 < int(per_user.number()) < most:
        limit, limiter = int(per_user.number()), per_user
    status = rows(conn, "SHOW GLOBAL STATUS LIKE 'Threads_connected'")
    in_use = int(status[0][1]) if status else 0
    now = f"{in_use} connected now, server-wide, of {most}"
    partitions = ctx.partitions

    def fix_to(n: int) -> str:
        if limiter.origin == "USER":
            statement = f"GRANT USAGE ON *.* TO {server.account} WITH MAX_USER_CONNECTIONS {n}"
        else:
            statement = fix(server, limiter, str(n))
        return f"{statement} (or cap a batch's partitions with the option maxPartitions)"

    named = f"{limiter.name} = {limit}"
    if not partitions:
        return [
            Finding(
                OK,
                v.name,
                v.value,
                v.source,
                "each partition holds a connection while it loads (it disconnects after XA "
                "PREPARE), the driver one for its heartbeat and one to commit: at most "
                f"partitions + {DRIVER_SESSIONS} at once ({now}); give --partitions to compare",
            )
        ]
    need = partitions + DRIVER_SESSIONS
    if need > limit:
        return [
            Finding(
                WARNING,
                limiter.name,
                limiter.value,
                limiter.source,
                f"a batch of {partitions} partitions may hold {need} connections at once (one "
                f"per loading partition, the driver's heartbeat and commit) but {named}: when "
                "as many tasks load at once, those beyond it fail to connect and the batch "
                f"fails; cap it with the option maxPartitions={max(limit - DRIVER_SESSIONS, 1)}, "
                f"or raise {limiter.name}",
                fix_to(need + (in_use if limiter is v else 0)),
            )
        ]
    if limiter is v and need > most - in_use:
        return [
            Finding(
                WARNING,
                v.name,
                v.value,
                v.source,
                f"only {max(most - in_use, 0)} connections are free now ({now}) for the up to "
                f"{need} that a batch of {partitions} partitions holds at once: tasks beyond "
                "them fail to connect and the batch fails",
                fix_to(need + in_use),
            )
        ]
    return [
        Finding(
            OK,
            limiter.name,
            limiter.value,
            limiter.source,
            f"room for the up to {need} connections a batch of {partitions} partitions holds "
            f"at once ({now})",
        )
    ]


def check_net_read(server: Server, ctx: CheckContext) -> list[Finding]:
    v = server.variables.get("net_read_timeout")
    if v is None:
        return []
    effect = (
        "the server waits at most this long for each next piece of a partition's LOAD DATA "
        "LOCAL, which streams the rows as Spark's iterator gives them: a longer pause between "
        "two Arrow batches (a slow upstream stage, a shuffle fetch, a GC pause) ends the "
        "connection and fails the partition (the batch is retried, nothing is left prepared)"
    )
    if v.number() >= NET_READ_FLOOR_S:
        return [Finding(OK, v.name, v.value, v.source, f"{v.value} s; {effect}")]
    return [
        Finding(
            WARNING,
            v.name,
            v.value,
            v.source,
            f"{v.name} = {v.value} s is shorter than the servers' default of "
            f"{seconds_text(NET_READ_FLOOR_S)}: {effect}",
            fix(server, v, str(int(NET_READ_FLOOR_S))),
        )
    ]


def _required(ctx: CheckContext) -> tuple[float, str]:
    trigger = (
        ctx.trigger_interval_s if ctx.trigger_interval_s and ctx.trigger_interval_s > 0 else None
    )
    base, text = (
        (trigger, f"the trigger interval ({seconds_text(trigger)})")
        if trigger is not None
        else (FLOOR_S, f"the floor of {seconds_text(FLOOR_S)} (the trigger interval is not known)")
    )
    if base >= SINK_LOCK_TIMEOUT_S:
        return base, text
    return SINK_LOCK_TIMEOUT_S, (
        f"the option lockTimeout's default ({seconds_text(SINK_LOCK_TIMEOUT_S)}), longer "
        f"than {text}"
    )


def check_statement_time(server: Server, ctx: CheckContext) -> list[Finding]:
    v = server.variables.get("max_statement_time")
    if v is None:
        return []
    effect = (
        "it ends any statement that runs longer: a partition's LOAD DATA, one statement "
        "streaming all of its rows, and the sink lock's GET_LOCK, which waits up to lockTimeout"
    )
    if v.number() == 0:
        return [Finding(OK, v.name, v.value, v.source, "off: it cannot end a partition's load")]
    required, text = _required(ctx)
    if v.number() >= required:
        return [Finding(OK, v.name, v.value, v.source, f"{v.value} s is at least {text}; {effect}")]
    value = str(_round_up(required))
    if v.origin == "USER":
        remedy = f"GRANT USAGE ON *.* TO {server.account} WITH MAX_STATEMENT_TIME {value}"
    else:
        remedy = fix(server, v, value)
    return [
        Finding(
            WARNING,
            v.name,
            v.value,
            v.source,
            f"{v.name} = {v.value} s is shorter than {text}: {effect}; the partition then "
            "fails and its batch is retried, and may fail again the same way",
            remedy,
        )
    ]


def check_lock_wait(server: Server, ctx: CheckContext) -> list[Finding]:
    v = server.variables.get("innodb_lock_wait_timeout")
    if v is None:
        return []
    replaced = (
        "the sink's tasks, commits and heartbeats set their own on every session (option "
        f"lockTimeout, default {seconds_text(SINK_LOCK_TIMEOUT_S)}), so this value is replaced "
        "there; it applies to the planner's session (which creates or migrates the commit "
        "log) and to the run's end record"
    )
    held = (
        "a batch's prepared branches hold the rows they loaded until the batch commits"
        + (
            f" (about the trigger interval, {seconds_text(ctx.trigger_interval_s)})"
            if ctx.trigger_interval_s
            else ""
        )
        + f": other sessions writing those rows, or altering a table a prepared branch wrote "
        f"(a migration of the commit log's markers too), wait up to {v.value} s, then fail "
        "with error 1205"
    )
    if v.number() >= LOCK_WAIT_FLOOR_S:
        return [
            Finding(
                OK,
                v.name,
                v.value,
                v.source,
                f"{replaced}, and {v.value} s is at least the "
                f"{seconds_text(LOCK_WAIT_FLOOR_S)} such a wait may take; {held}",
            )
        ]
    return [
        Finding(
            WARNING,
            v.name,
            v.value,
            v.source,
            f"{v.name} = {v.value} s is shorter than {seconds_text(LOCK_WAIT_FLOOR_S)}: "
            f"{replaced}, where a wait that gives up fails the query at its start (nothing "
            f"written); {held}",
            fix(server, v, str(int(LOCK_WAIT_FLOOR_S))),
        )
    ]


def check_wait_timeout(server: Server, ctx: CheckContext) -> list[Finding]:
    v = server.variables.get("wait_timeout")
    if v is None:
        return []
    trigger = (
        f"the trigger interval ({seconds_text(ctx.trigger_interval_s)}) does not bound it"
        if ctx.trigger_interval_s
        else "the trigger interval does not bound it"
    )
    how = (
        "it closes a session idle between two statements for longer; no session of the sink "
        "is idle between batches (each partition, commit and heartbeat opens its own and "
        f"closes it), so {trigger}; a commit's own pauses between statements (reading the "
        "query's checkpoint for its check) do"
    )
    if v.number() >= WAIT_FLOOR_S:
        return [
            Finding(
                OK,
                v.name,
                v.value,
                v.source,
                f"{v.value} s is at least {seconds_text(WAIT_FLOOR_S)}; {how}",
            )
        ]
    return [
        Finding(
            WARNING,
            v.name,
            v.value,
            v.source,
            f"{v.name} = {v.value} s is shorter than {seconds_text(WAIT_FLOOR_S)}: {how}; a "
            "commit whose session is closed under it fails, and its batch is retried",
            fix(server, v, str(int(WAIT_FLOOR_S))),
        )
    ]


def check_xa_recover(conn: Connection, server: Server, ctx: CheckContext) -> list[Finding]:
    name = "XA RECOVER"
    try:
        listed = rows(conn, "XA RECOVER")
    except Exception as exc:
        if errno(exc) not in (1227, 1044, 1045, 1142):
            raise
        return [
            Finding(
                ERROR,
                name,
                "refused",
                f"user {server.user}",
                f"{server.kind} refuses XA RECOVER to {server.user} ({exc.args[-1]}): the "
                "sink lists its prepared branches with it to commit, roll back and recover "
                "them",
                f"GRANT XA_RECOVER_ADMIN ON *.* TO {server.account}",
            )
        ]
    ours = sum(1 for r in listed if xid.from_recover_row(tuple(r)) is not None)
    who = (
        "MariaDB lists every prepared branch to any user, and lets any user finish one"
        if server.mariadb
        else "this user may list prepared branches (XA_RECOVER_ADMIN)"
    )
    return [
        Finding(
            OK,
            name,
            "allowed",
            f"user {server.user}",
            f"{who}; {len(listed)} prepared branch(es) on the server now, {ours} of them sqlsink's",
        )
    ]


# -- privileges ------------------------------------------------------------------------------

_ALL = frozenset(
    {
        "SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "REFERENCES", "INDEX",
        "ALTER", "CREATE TEMPORARY TABLES", "LOCK TABLES", "EXECUTE", "CREATE VIEW",
        "SHOW VIEW", "CREATE ROUTINE", "ALTER ROUTINE", "EVENT", "TRIGGER", "DELETE HISTORY",
    }
)  # fmt: skip
_GRANT = re.compile(r"^GRANT (.+?) ON (.+?) TO ", re.IGNORECASE)
_TARGET = re.compile(r"^(\*|`((?:[^`]|``)*)`)\.(\*|`((?:[^`]|``)*)`)$")


@dataclass(frozen=True)
class Grants:
    """What SHOW GRANTS gives the session (the user's grants and its enabled roles')."""

    global_: frozenset[str]
    databases: tuple[tuple[str, frozenset[str]], ...]  # (pattern, privileges)
    tables: tuple[tuple[str, str, frozenset[str]], ...]  # (database, table, privileges)

    def on_database(self, database: str) -> frozenset[str]:
        out = set(self.global_)
        for pattern, privileges in self.databases:
            if _matches(pattern, database):
                out |= privileges
        return frozenset(out)

    def on_some_table(self, database: str, privilege: str) -> list[str]:
        return sorted(t for d, t, p in self.tables if d == database and privilege in p)


def _matches(pattern: str, database: str) -> bool:
    """A database grant's name: '%' and '_' are wildcards, '\\_' and '\\%' literal."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), database, re.IGNORECASE) is not None


def _privileges(text: str) -> frozenset[str]:
    text = re.sub(r"\([^)]*\)", "", text)  # column lists: SELECT (a, b)
    names = {" ".join(p.split()).upper() for p in text.split(",")}
    if "ALL PRIVILEGES" in names or "ALL" in names:  # kept: on *.* it holds SUPER too
        return _ALL | names | {"ALL PRIVILEGES"}
    return frozenset(names)


def read_grants(conn: Connection, mariadb: bool = True) -> Grants:
    """SHOW GRANTS of the session: the user's, and those of its enabled roles (MariaDB
    lists an enabled role's grants; MySQL only with USING, its active roles)."""
    statement = "SHOW GRANTS"
    if not mariadb:
        active = rows(conn, "SELECT CURRENT_ROLE()")[0][0]
        if active and str(active) != "NONE":
            statement = f"SHOW GRANTS FOR CURRENT_USER() USING {active}"
    return parse_grants(str(r[0]) for r in rows(conn, statement))


def parse_grants(lines: Iterable[str]) -> Grants:
    global_: set[str] = set()
    databases: list[tuple[str, frozenset[str]]] = []
    tables: list[tuple[str, str, frozenset[str]]] = []
    for line in lines:
        found = _GRANT.match(line)
        if found is None:
            continue  # a role granted, SET DEFAULT ROLE
        target = _TARGET.match(found.group(2).strip())
        if target is None:
            continue  # PROCEDURE, FUNCTION, PROXY
        privileges = _privileges(found.group(1))
        database = (target.group(2) or "").replace("``", "`")
        table = (target.group(4) or "").replace("``", "`")
        if target.group(1) == "*":
            global_ |= privileges
        elif target.group(3) == "*":
            databases.append((database, privileges))
        else:
            tables.append((database, table, privileges))
    return Grants(frozenset(global_), tuple(databases), tuple(tables))


def check_commit_log(conn: Connection, server: Server, ctx: CheckContext) -> list[Finding]:
    """The commit log's version, and whether this user may create and use it."""
    from sqlsink.mariadb.schema import migrations, version

    newest = migrations()[-1][0]
    grants = read_grants(conn, server.mariadb)
    held = grants.on_database(LOG_DATABASE)
    out = []
    readable = True
    try:
        installed = version(conn)
    except Exception as exc:
        if errno(exc) not in (1044, 1142, 1143):
            raise
        readable, installed = False, None
        out.append(
            Finding(
                ERROR,
                "sqlsink schema",
                "not readable",
                "",
                f"{server.user} may not read the commit log (database {LOG_DATABASE}), so "
                f"neither may the sink as this user; the server says: {exc.args[-1]}",
            )
        )
    if not readable:
        pass
    elif installed is None:
        out.append(
            Finding(
                INFO,
                "sqlsink schema",
                "not installed",
                "",
                f"the commit log (database {LOG_DATABASE}) is not installed on this server; the "
                "sink's first run creates it",
                "start the query (as the sink's user)",
            )
        )
    elif installed > newest:
        out.append(
            Finding(
                ERROR,
                "sqlsink schema",
                f"version {installed}",
                "",
                f"the commit log is at version {installed}, newer than this sqlsink knows "
                f"({newest})",
                "upgrade sqlsink (pip install -U sqlsink) where the query and this tool run",
            )
        )
    elif installed < newest:
        out.append(
            Finding(
                INFO,
                "sqlsink schema",
                f"version {installed}",
                "",
                f"the commit log is at version {installed}; this sqlsink uses {newest} and "
                "migrates it at the sink's next start",
            )
        )
    else:
        out.append(
            Finding(OK, "sqlsink schema", f"version {installed}", "", "installed, up to date")
        )
    needed = ["SELECT", "INSERT", "UPDATE", "DELETE"]
    creates = readable and (installed is None or installed < newest)
    if creates:
        needed += ["CREATE", "TRIGGER"]
    lacking = [p for p in needed if p not in held]
    what = (
        "create and migrate the commit log (its tables and guard triggers), then read and write it"
        if creates
        else "read and write the commit log (REPLACE needs INSERT and DELETE)"
    )
    if lacking:
        out.append(
            Finding(
                ERROR,
                "sqlsink privileges",
                "missing " + ", ".join(lacking),
                f"user {server.user}",
                f"{server.user} lacks {', '.join(lacking)} on database {LOG_DATABASE}: the sink "
                f"must {what}",
                f"GRANT ALL PRIVILEGES ON `{LOG_DATABASE}`.* TO {server.account}",
            )
        )
    else:
        out.append(
            Finding(
                OK,
                "sqlsink privileges",
                "granted",
                f"user {server.user}",
                f"may {what} (database {LOG_DATABASE})",
            )
        )
    if creates:
        out += trigger_creators(server, grants)
    return out


def trigger_creators(server: Server, grants: Grants) -> list[Finding]:
    """With the binary log on, creating triggers needs SUPER or this setting."""
    log_bin = server.variables.get("log_bin")
    trust = server.variables.get("log_bin_trust_function_creators")
    if log_bin is None or not log_bin.on() or trust is None or trust.on():
        return []
    if "SUPER" in grants.global_:
        return []
    return [
        Finding(
            ERROR,
            trust.name,
            trust.value,
            trust.source,
            f"the commit log is not installed (or is older), and with the binary log on "
            f"{server.kind} lets a user without SUPER create its guard triggers only when "
            f"this is ON: the sink's first run fails",
            fix(server, trust, "ON") + "; or connect once as an administrator so that the "
            "commit log is created",
        )
    ]


def check_target(conn: Connection, server: Server, ctx: CheckContext) -> list[Finding]:
    """INSERT on the URL's database (the sink appends), CREATE for createTable."""
    database = server.database
    name = "target privileges"
    if not database:
        return [
            Finding(
                INFO,
                name,
                "no database",
                "",
                "the URL names no database: give it (mariadb://user@host:port/database) to "
                "check INSERT on the sink's tables",
            )
        ]
    grants = read_grants(conn, server.mariadb)
    held = grants.on_database(database)
    source = f"user {server.user}"
    if "INSERT" not in held:
        tables = grants.on_some_table(database, "INSERT")
        if tables:
            listed = ", ".join(f"`{t}`" for t in tables)
            return [
                Finding(
                    WARNING,
                    name,
                    f"INSERT on {len(tables)} table(s)",
                    source,
                    f"{server.user} may INSERT into {listed} of database {database} only: the "
                    "sink can append to those tables, no other (nor create one, createTable)",
                    f"GRANT INSERT ON `{database}`.* TO {server.account}",
                )
            ]
        return [
            Finding(
                ERROR,
                name,
                "missing INSERT",
                source,
                f"{server.user} lacks INSERT on database {database}: the sink appends with "
                "LOAD DATA, which needs it",
                f"GRANT INSERT ON `{database}`.* TO {server.account}",
            )
        ]
    if "CREATE" not in held:
        return [
            Finding(
                INFO,
                name,
                "INSERT",
                source,
                f"may append to the tables of database {database}; without CREATE there, the "
                "option createTable cannot create a table",
                f"GRANT CREATE ON `{database}`.* TO {server.account} (for createTable)",
            )
        ]
    return [
        Finding(
            OK,
            name,
            "INSERT, CREATE",
            source,
            f"may append to the tables of database {database}, and create them (createTable)",
        )
    ]


def run_checks(conn: Connection, ctx: CheckContext) -> list[Finding]:
    """``sqlsink check``'s findings for a MariaDB or MySQL server (see the module's doc)."""
    server = read_server(conn)
    out: list[Finding] = []
    for check in (
        check_version,
        check_local_infile,
        check_binary_log,
        check_durability,
        check_binlog_format,
        check_net_read,
        check_statement_time,
        check_lock_wait,
        check_wait_timeout,
    ):
        out += check(server, ctx)
    for with_conn in (
        check_read_only,
        check_connections,
        check_xa_recover,
        check_commit_log,
        check_target,
    ):
        out += with_conn(conn, server, ctx)
    return out
