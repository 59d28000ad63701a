"""The checks of ``sqlsink check``: server settings, the schema, privileges, views.

Each is a function ``(conn, CheckContext) -> list[Finding]`` listed in ``CHECKS``; add
a check by writing one more such function."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from sqlsink.core.admin import CheckContext, RoleInfo
from sqlsink.postgres import views
from sqlsink.postgres.checks import Finding, check_server
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.schema import installed_version, latest_version, sql_dir
from sqlsink.postgres.survey.roles import role_info


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
    """The role, then what it may do with the commit log (create it, or use it), then
    leftovers it cannot finish."""
    me = role_info(conn)
    out = [_role_finding(me)]
    if readable_version(conn) == 0:
        out.append(_create_finding(conn, me))
    else:
        out.append(_commit_log_finding(conn, me))
    if not me.superuser:
        out += _foreign_owner_findings(conn, me)
    return out


def _role_finding(me: RoleInfo) -> Finding:
    if me.superuser:
        return Finding("ok", "role", me.role, "", "superuser: may finish any prepared transaction")
    return Finding(
        "info",
        "role",
        me.role,
        "",
        "not a superuser: COMMIT/ROLLBACK PREPARED works only on transactions this "
        "role prepared (membership in the preparing role is not enough); run "
        "'sqlsink recover' as the sink's role or as a superuser",
    )


def _create_finding(conn: Connection, me: RoleInfo) -> Finding:
    """The commit log is not installed: may this role create it?"""
    row = conn.execute("SELECT has_database_privilege(current_database(), 'CREATE')").fetchone()
    if bool(row and row[0]) or me.superuser:
        return Finding(
            "ok",
            "CREATE on database",
            "granted",
            "",
            "the sink can create its commit log (schema sqlsink)",
        )
    return Finding(
        "error",
        "CREATE on database",
        "not granted",
        "",
        f"role {me.role} cannot create the sqlsink schema, and it is not installed: "
        "the sink fails at its first batch",
        f"GRANT CREATE ON DATABASE {me.database} TO {me.role}; or run "
        f"{sql_dir() / 'setup_role.sql'} as a superuser",
    )


_NEEDED = {
    "sqlsink.sinks": "SELECT,INSERT,UPDATE",
    "sqlsink.decisions": "SELECT,INSERT,UPDATE",
    "sqlsink.markers": "SELECT,INSERT,DELETE",
    "sqlsink.schema_version": "SELECT",
}
# tables a later version adds: needed once present (the foreachBatch writer's check reads
# and writes sqlsink.handovers before each stream batch); grants given before the upgrade
# ("ON ALL TABLES IN SCHEMA sqlsink") do not cover them
_NEEDED_ONCE_PRESENT = {"sqlsink.handovers": "SELECT,INSERT,UPDATE"}
_PRESENT = (
    "SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = 'sqlsink' AND c.relname = %s)"
)


def _commit_log_finding(conn: Connection, me: RoleInfo) -> Finding:
    """The commit log is installed: may this role read and write it?"""
    missing = []
    needed = dict(_NEEDED)
    needed.update(
        (t, p) for t, p in _NEEDED_ONCE_PRESENT.items() if _true(conn, _PRESENT, (t.split(".")[1],))
    )
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
    if not missing:
        return Finding(
            "ok", "sqlsink privileges", "granted", "", "can read and write the commit log"
        )
    return Finding(
        "error",
        "sqlsink privileges",
        "missing",
        "",
        f"role {me.role} lacks {'; '.join(missing)}: the sink cannot keep its commit log",
        f"connect as the schema's owner, or GRANT USAGE ON SCHEMA sqlsink TO "
        f"{me.role} and the table privileges listed",
    )


def _foreign_owner_findings(conn: Connection, me: RoleInfo) -> list[Finding]:
    """sqlsink leftovers here that another role prepared: this one cannot finish them."""
    rows = conn.execute(
        "SELECT owner::text, count(*) FROM pg_prepared_xacts "
        "WHERE database = current_database() AND gid LIKE 'sqlsink\\_%%' "
        "AND owner <> current_user GROUP BY owner ORDER BY owner"
    ).fetchall()
    return [
        Finding(
            "warning",
            "prepared transaction owner",
            str(owner),
            "",
            f"{count} sqlsink prepared transaction(s) here were prepared by role {owner}; "
            f"role {me.role} cannot commit or roll them back",
            f"run 'sqlsink recover' connected as {owner} or as a superuser",
        )
        for owner, count in rows
    ]


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
    return check_server(conn, trigger_interval_s=ctx.trigger_interval_s, partitions=ctx.partitions)


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
