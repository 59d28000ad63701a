"""Read-only queries for the command-line tool: the commit log, its runs (which are
live: ``commit_log.runs``), prepared transactions, the sessions and locks of a sink
(shown as evidence; liveness is the runs registry's), and the server checks.

Nothing here writes; the only state it takes is the sink's session advisory lock
(``try_sink_lock``/``wait_sink_lock``), the very lock the committer holds while it
decides and commits, so that ``sqlsink recover`` takes turns with a running sink.

Server checks are functions ``(conn, CheckContext) -> list[Finding]`` listed in
``CHECKS``; add a check by writing one more such function.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

import psycopg

from sqlsink.core.model import PreparedTransaction
from sqlsink.postgres import appnames, views
from sqlsink.postgres.checks import Finding, check_server
from sqlsink.postgres.commit_log import RunInfo, like_prefix, runs, visible_markers
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.locks import lock_ids, try_sink_lock, unlock_sink, wait_sink_lock
from sqlsink.postgres.schema import installed_version, latest_version, sql_dir

# the CLI calls these here until status.py is split (issue 17)
__all__ = ["RunInfo", "runs", "try_sink_lock", "unlock_sink", "visible_markers", "wait_sink_lock"]


# -- the commit log -----------------------------------------------------------------------


@dataclass(frozen=True)
class SinkRow:
    sink_id: str
    query_id: str | None
    created_at: datetime
    bound_at: datetime


@dataclass(frozen=True)
class DecisionRow:
    sink_id: str
    batch_id: int
    gids: tuple[str, ...]
    rows: int
    decided_at: datetime
    completed_at: datetime | None
    query_id: str | None
    run_id: str | None
    first_write_at: datetime | None = None
    commit_ms: float | None = None
    orphans: int | None = None

    def rows_per_second(self) -> float | None:
        """Throughput: rows over the time from the first write to the decision."""
        if self.first_write_at is None:
            return None
        seconds = (self.decided_at - self.first_write_at).total_seconds()
        return self.rows / seconds if seconds > 0 else None

    def lag_seconds(self) -> float | None:
        """From the batch's first write until all of it was visible (complete)."""
        if self.first_write_at is None or self.completed_at is None:
            return None
        return (self.completed_at - self.first_write_at).total_seconds()


@dataclass(frozen=True)
class BatchSummary:
    decisions: int
    first_decided: int | None
    last_decided: int | None
    last_complete: int | None
    incomplete: int


_DECISION_COLUMNS = (
    "sink_id, batch_id, gids, rows, decided_at, completed_at, query_id, run_id, "
    "first_write_at, commit_ms, orphans FROM sqlsink.decisions"
)


def _decision(row: tuple[object, ...]) -> DecisionRow:
    sink_id, batch_id, gids, rows, decided_at, completed_at, query_id, run_id = row[:8]
    first_write_at, commit_ms, orphans = row[8:]
    return DecisionRow(
        str(sink_id),
        int(str(batch_id)),
        tuple(str(g) for g in gids) if isinstance(gids, list) else (),
        int(str(rows)),
        decided_at,  # type: ignore[arg-type]
        completed_at,  # type: ignore[arg-type]
        None if query_id is None else str(query_id),
        None if run_id is None else str(run_id),
        first_write_at,  # type: ignore[arg-type]
        None if commit_ms is None else float(str(commit_ms)),
        None if orphans is None else int(str(orphans)),
    )


def schema_version(conn: Connection) -> int:
    """The installed version of the ``sqlsink`` schema; 0 when it is not installed."""
    return installed_version(conn)


def sinks(conn: Connection) -> dict[str, SinkRow]:
    rows = conn.execute(
        "SELECT sink_id, query_id, created_at, bound_at FROM sqlsink.sinks ORDER BY sink_id"
    ).fetchall()
    return {str(s): SinkRow(str(s), None if q is None else str(q), c, b) for s, q, c, b in rows}


def batch_summary(conn: Connection, sink_id: str) -> BatchSummary:
    row = conn.execute(
        "SELECT count(*), min(batch_id), max(batch_id), "
        "max(batch_id) FILTER (WHERE completed_at IS NOT NULL), "
        "count(*) FILTER (WHERE completed_at IS NULL) "
        "FROM sqlsink.decisions WHERE sink_id = %s",
        (sink_id,),
    ).fetchone()
    assert row is not None
    count, first, last, last_complete, incomplete = row
    return BatchSummary(
        int(str(count)),
        None if first is None else int(str(first)),
        None if last is None else int(str(last)),
        None if last_complete is None else int(str(last_complete)),
        int(str(incomplete)),
    )


def recent_decisions(conn: Connection, sink_id: str, limit: int) -> list[DecisionRow]:
    rows = conn.execute(
        f"SELECT {_DECISION_COLUMNS} WHERE sink_id = %s ORDER BY batch_id DESC LIMIT %s",
        (sink_id, limit),
    ).fetchall()
    return [_decision(r) for r in rows]


def decisions_from(conn: Connection, sink_id: str, first_batch: int) -> dict[int, DecisionRow]:
    rows = conn.execute(
        f"SELECT {_DECISION_COLUMNS} WHERE sink_id = %s AND batch_id >= %s ORDER BY batch_id",
        (sink_id, first_batch),
    ).fetchall()
    return {d.batch_id: d for d in map(_decision, rows)}


def incomplete_decisions(conn: Connection, sink_id: str | None = None) -> list[DecisionRow]:
    rows = conn.execute(
        f"SELECT {_DECISION_COLUMNS} WHERE completed_at IS NULL "
        "AND (%s::text IS NULL OR sink_id = %s::text) ORDER BY sink_id, batch_id",
        (sink_id, sink_id),
    ).fetchall()
    return [_decision(r) for r in rows]


# -- prepared transactions ----------------------------------------------------------------


def server_now(conn: Connection) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def all_prepared(conn: Connection) -> list[PreparedTransaction]:
    """Every prepared transaction of the cluster (all databases, every application)."""
    rows = conn.execute(
        "SELECT gid, database, owner, prepared FROM pg_prepared_xacts ORDER BY prepared, gid"
    ).fetchall()
    return [PreparedTransaction(str(g), str(d), str(o), p) for g, d, o, p in rows]


def still_prepared(conn: Connection, gids: Collection[str]) -> set[str]:
    if not gids:
        return set()
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE gid = ANY(%s) AND database = current_database()",
        (list(gids),),
    ).fetchall()
    return {str(r[0]) for r in rows}


def confirm_lost(conn: Connection, candidates: Collection[str]) -> set[str]:
    """Of decided gids seen neither prepared nor with a marker, those still so now.

    Without the sink lock a gid can be prepared and decided between two reads; read
    again, prepared first and markers second: a gid committed in between shows its
    marker, so what remains was rolled back.
    """
    if not candidates:
        return set()
    prepared = still_prepared(conn, candidates)
    rest = set(candidates) - prepared
    rest -= visible_markers(conn, rest)
    if not rest:
        return set()
    # a batch completed meanwhile has had its markers pruned: its gids were committed
    rows = conn.execute(
        "SELECT g FROM sqlsink.decisions d, unnest(d.gids) AS g "
        "WHERE g = ANY(%s) AND d.completed_at IS NOT NULL",
        (list(rest),),
    ).fetchall()
    return rest - {str(r[0]) for r in rows}


# -- who is live --------------------------------------------------------------------------


@dataclass(frozen=True)
class Session:
    pid: int
    application_name: str
    user: str | None
    client: str | None
    state: str | None
    backend_start: datetime | None
    xact_start: datetime | None

    def describe(self) -> str:
        where = f" from {self.client}" if self.client else ""
        since = (
            f", connected {self.backend_start:%Y-%m-%d %H:%M:%S%z}" if self.backend_start else ""
        )
        return (
            f"pid {self.pid} {self.application_name!r} (role {self.user}{where}, "
            f"{self.state or 'unknown state'}{since})"
        )


_SESSION_COLUMNS = (
    "a.pid, a.application_name, a.usename::text, host(a.client_addr), a.state, "
    "a.backend_start, a.xact_start"
)


def _session(row: tuple[object, ...]) -> Session:
    pid, app, user, client, state, started, xact = row
    return Session(
        int(str(pid)),
        str(app or ""),
        None if user is None else str(user),
        None if client is None else str(client),
        None if state is None else str(state),
        started,  # type: ignore[arg-type]
        xact,  # type: ignore[arg-type]
    )


def sqlsink_sessions(conn: Connection) -> list[Session]:
    """Other sessions of this database whose application_name is one of sqlsink's."""
    rows = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM pg_stat_activity a "
        "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
        "AND a.application_name LIKE %s ORDER BY a.pid",
        (like_prefix(appnames.PREFIX),),
    ).fetchall()
    return [_session(r) for r in rows]


def sink_sessions(sessions: Collection[Session], sink_id: str) -> list[Session]:
    """The sink's connected partition tasks and committer: evidence that it runs, never
    proof that it does not (between a batch's PREPAREs and its commit nothing of it may
    be connected; liveness is the runs registry's)."""
    return [s for s in sessions if appnames.of_sink(s.application_name, sink_id)]


def lock_holders(conn: Connection, sink_id: str) -> list[Session]:
    """Other sessions holding the sink's advisory lock (the committer while it commits)."""
    classid, objid = lock_ids(conn, sink_id)
    rows = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.pid <> pg_backend_pid() "
        "ORDER BY a.pid",
        (classid, objid),
    ).fetchall()
    return [_session(r) for r in rows]


# -- who am I -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RoleInfo:
    role: str
    superuser: bool
    database: str
    server_version: str
    server_version_num: int


def role_info(conn: Connection) -> RoleInfo:
    row = conn.execute(
        "SELECT current_user::text, current_setting('is_superuser') = 'on', current_database(), "
        "current_setting('server_version'), current_setting('server_version_num')::int"
    ).fetchone()
    assert row is not None
    role, superuser, database, version, version_num = row
    return RoleInfo(str(role), bool(superuser), str(database), str(version), int(str(version_num)))


# -- server checks ------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckContext:
    trigger_interval_s: float | None = None  # the query's trigger interval, when given


def readable_version(conn: Connection) -> int | None:
    """The schema's version; 0 when not installed, None when this role may not read it."""
    try:
        return installed_version(conn)
    except psycopg.errors.InsufficientPrivilege:
        return None


def check_schema(conn: Connection, ctx: CheckContext) -> list[Finding]:
    installed, latest = readable_version(conn), latest_version()
    if installed is None:
        return [
            Finding(
                "error",
                "sqlsink schema",
                "not readable",
                "",
                "the commit log (schema sqlsink) exists but this role may not read it",
                "connect as the sink's role (the schema's owner), or GRANT USAGE ON SCHEMA "
                "sqlsink and the table privileges to this role",
            )
        ]
    if installed == 0:
        return [
            Finding(
                "info",
                "sqlsink schema",
                "not installed",
                "",
                "the commit log (schema sqlsink) is not installed in this database; the "
                "sink's first run creates it (its role needs CREATE on the database)",
                f"start the query, or run {sql_dir() / '001_commit_log.sql'} (and the "
                f"later files there) as the sink's role; {sql_dir() / 'setup_role.sql'} "
                "creates a least-privilege role",
            )
        ]
    if installed < latest:
        return [
            Finding(
                "info",
                "sqlsink schema",
                f"version {installed}",
                "",
                f"the commit log is at version {installed}; this sqlsink uses {latest} and "
                "migrates it at the sink's next start (a step that alters sqlsink.markers "
                "waits until no prepared transaction holds it: sqlsink recover finishes "
                "leftovers)",
            )
        ]
    if installed > latest:
        return [
            Finding(
                "error",
                "sqlsink schema",
                f"version {installed}",
                "",
                f"the commit log is at version {installed}, newer than this sqlsink knows "
                f"({latest})",
                "upgrade sqlsink (pip install -U sqlsink) where the query and this tool run",
            )
        ]
    return [Finding("ok", "sqlsink schema", f"version {installed}", "", "installed, up to date")]


def check_privileges(conn: Connection, ctx: CheckContext) -> list[Finding]:
    me = role_info(conn)
    out: list[Finding] = []
    if me.superuser:
        out.append(
            Finding("ok", "role", me.role, "", "superuser: may finish any prepared transaction")
        )
    else:
        out.append(
            Finding(
                "info",
                "role",
                me.role,
                "",
                "not a superuser: COMMIT/ROLLBACK PREPARED works only on transactions this "
                "role prepared (membership in the preparing role is not enough); run "
                "'sqlsink recover' as the sink's role or as a superuser",
            )
        )
    installed = readable_version(conn) != 0
    row = conn.execute("SELECT has_database_privilege(current_database(), 'CREATE')").fetchone()
    can_create = bool(row and row[0])
    if not installed:
        if can_create or me.superuser:
            out.append(
                Finding(
                    "ok",
                    "CREATE on database",
                    "granted",
                    "",
                    "the sink can create its commit log (schema sqlsink)",
                )
            )
        else:
            out.append(
                Finding(
                    "error",
                    "CREATE on database",
                    "not granted",
                    "",
                    f"role {me.role} cannot create the sqlsink schema, and it is not installed: "
                    "the sink fails at its first batch",
                    f"GRANT CREATE ON DATABASE {me.database} TO {me.role}; or run "
                    f"{sql_dir() / 'setup_role.sql'} as a superuser",
                )
            )
    else:
        needed = {
            "sqlsink.sinks": "SELECT,INSERT,UPDATE",
            "sqlsink.decisions": "SELECT,INSERT,UPDATE",
            "sqlsink.markers": "SELECT,INSERT,DELETE",
            "sqlsink.schema_version": "SELECT",
        }
        missing = []
        for table, privileges in needed.items():
            # has_table_privilege with a list is true if ANY is held: ask one at a time
            lacking = [
                p
                for p in privileges.split(",")
                if not _true(conn, _TABLE_PRIVILEGE, (p, table.split(".")[1]))
            ]
            if lacking:
                missing.append(f"{','.join(lacking)} ON {table}")
        if not _true(conn, "SELECT has_schema_privilege('sqlsink', 'USAGE')", ()):
            missing.insert(0, "USAGE ON SCHEMA sqlsink")
        if missing:
            out.append(
                Finding(
                    "error",
                    "sqlsink privileges",
                    "missing",
                    "",
                    f"role {me.role} lacks {'; '.join(missing)}: the sink cannot keep its "
                    "commit log",
                    f"connect as the schema's owner, or GRANT USAGE ON SCHEMA sqlsink TO "
                    f"{me.role} and the table privileges listed",
                )
            )
        else:
            out.append(
                Finding(
                    "ok", "sqlsink privileges", "granted", "", "can read and write the commit log"
                )
            )
    if not me.superuser:
        rows = conn.execute(
            "SELECT owner::text, count(*) FROM pg_prepared_xacts "
            "WHERE database = current_database() AND gid LIKE 'sqlsink\\_%%' "
            "AND owner <> current_user GROUP BY owner ORDER BY owner"
        ).fetchall()
        for owner, count in rows:
            out.append(
                Finding(
                    "warning",
                    "prepared transaction owner",
                    str(owner),
                    "",
                    f"{count} sqlsink prepared transaction(s) here were prepared by role {owner}; "
                    f"role {me.role} cannot commit or roll them back",
                    f"run 'sqlsink recover' connected as {owner} or as a superuser",
                )
            )
    return out


# by oid: a name lookup needs USAGE on the schema, which may be what is missing
_TABLE_PRIVILEGE = (
    "SELECT coalesce(bool_and(has_table_privilege(c.oid, %s)), false) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'sqlsink' AND c.relname = %s"
)


def _true(conn: Connection, query: str, params: tuple[object, ...]) -> bool:
    row = conn.execute(query, params).fetchone()
    return bool(row and row[0])


def check_settings(conn: Connection, ctx: CheckContext) -> list[Finding]:
    """max_prepared_transactions and the timeouts: see sqlsink.postgres.checks."""
    return check_server(conn, trigger_interval_s=ctx.trigger_interval_s)


def check_consistent_views(conn: Connection, ctx: CheckContext) -> list[Finding]:
    """Each consistent view (option consistentView) reads the table and sqlsink.markers
    with its owner's rights, and shows a batch once its markers are deleted: its owner
    (the sink's role) needs SELECT on both and DELETE on the markers."""
    if (readable_version(conn) or 0) < views.SCHEMA_VERSION:
        return []
    out = []
    for view in views.find_views(conn):
        needs = {"sqlsink.markers": ("SELECT", "DELETE"), view.table: ("SELECT",)}
        lacking = [
            f"{privilege} ON {table}"
            for table, privileges in needs.items()
            for privilege in privileges
            if not _true(
                conn,
                "SELECT to_regclass(%s) IS NOT NULL AND has_table_privilege(%s, %s, %s)",
                (table, view.owner, table, privilege),
            )
        ]
        name = f"consistent view {view.view}"
        if lacking:
            out.append(
                Finding(
                    "error",
                    name,
                    f"sink {view.sink_id}",
                    "",
                    f"its owner {view.owner} lacks {'; '.join(lacking)}: the view fails for "
                    "its readers, or (without DELETE) hides complete batches for good",
                    f"GRANT {', '.join(lacking)} TO {view.owner}",
                )
            )
        else:
            out.append(
                Finding(
                    "ok",
                    name,
                    f"sink {view.sink_id}",
                    "",
                    f"shows whole batches of {view.table}; readers need SELECT on the view "
                    f"and USAGE on schema {view.view.schema} only (it reads as {view.owner})",
                )
            )
    return out


CHECKS: list[Callable[[Connection, CheckContext], list[Finding]]] = [
    check_settings,
    check_schema,
    check_privileges,
    check_consistent_views,
]


def run_checks(conn: Connection, ctx: CheckContext) -> list[Finding]:
    out: list[Finding] = []
    for check in CHECKS:
        out += check(conn, ctx)
    return out
