"""The server's refusals met at planning, in the sink's words: the raw driver error of a
read-only server, a missing schema, a missing privilege becomes a ConfigError that says
what is wrong and the statement or setting that fixes it (the planner raises it before
anything is written). And what the server would refuse only when the tasks write, checked
at planning: a view as the target (``check_target_kind``), a role without the privileges
the write's mode needs (``check_privileges``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from psycopg import errors, sql

from sqlsink.conninfo import shown
from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection
from sqlsink.tablename import TableName


def _quoted(conn: Connection, *names: str) -> str:
    return sql.Identifier(*names).as_string(conn)


@contextmanager
def in_sinks_words(conn: Connection, url: str, table: TableName, create: bool) -> Iterator[None]:
    """Planning of ``table`` on ``conn`` (``create``: with the option createTable)."""
    try:
        yield
    except errors.ReadOnlySqlTransaction as exc:
        raise ConfigError(
            f"the server at {shown(url)} is read-only (a standby, or "
            "default_transaction_read_only is on for this database or role): the sink writes "
            f"its commit log and table {table} there, and nothing was written. Fix: give the "
            "primary's URL (with several hosts in the URL, add "
            "target_session_attrs=read-write), or turn default_transaction_read_only off "
            "for the sink's role"
        ) from exc
    except errors.InvalidSchemaName as exc:
        raise ConfigError(
            f"schema {table.schema} of table {table} does not exist"
            + (" (option createTable creates the table, not its schema)" if create else "")
            + f"; nothing was written. Fix: CREATE SCHEMA {_quoted(conn, table.schema)} "
            f"(as a role allowed to), or name an existing schema in the option table"
        ) from exc
    except errors.InsufficientPrivilege as exc:
        role = conn.info.user
        what = f"create table {table}" if create else f"plan its write into table {table}"
        grant = (
            f"GRANT CREATE ON SCHEMA {_quoted(conn, table.schema)} TO {_quoted(conn, role)}"
            if create
            else f"GRANT INSERT ON {_quoted(conn, table.schema, table.name)} TO "
            f"{_quoted(conn, role)}"
        )
        reason = exc.diag.message_primary or str(exc).splitlines()[0]
        raise ConfigError(
            f"role {role} may not {what} ({reason}); nothing was written. Fix: {grant}"
            + (", or create the table beforehand and drop createTable" if create else "")
            + " (sqlsink check --url URL lists what the sink's role needs)"
        ) from exc


_KIND = """
SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""
# the tables a view or materialized view reads (its rewrite rule's dependencies)
_READS = """
SELECT DISTINCT n.nspname, c.relname FROM pg_rewrite r
JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
    AND d.refclassid = 'pg_class'::regclass
JOIN pg_class c ON c.oid = d.refobjid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE r.ev_class = %s AND c.oid <> %s AND c.relkind IN ('r', 'p')
ORDER BY 1, 2
"""
# an INSTEAD OF INSERT row trigger (pg_trigger.h: TRIGGER_TYPE_INSTEAD 64, _INSERT 4)
_INSTEAD_OF_INSERT = (
    "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s AND tgtype & 68 = 68)"
)


def check_target_kind(conn: Connection, table: TableName, upsert: bool) -> None:
    """Refuse a view or a materialized view as the target, naming the tables it reads:
    COPY, which every write uses, writes into tables only (and into a view only through an
    INSTEAD OF INSERT trigger, which an append may use; an upsert's ON CONFLICT never)."""
    row = conn.execute(_KIND.encode(), (table.schema, table.name)).fetchone()
    if row is None or row[1] not in ("v", "m"):
        return
    oid, relkind = row
    if relkind == "v" and not upsert:
        instead = conn.execute(_INSTEAD_OF_INSERT.encode(), (oid,)).fetchone()
        if instead is not None and instead[0]:
            return
    what = "a view" if relkind == "v" else "a materialized view"
    bases = [str(TableName(s, n)) for s, n in conn.execute(_READS.encode(), (oid, oid))]
    if len(bases) == 1:
        fix = f"write to its base table {bases[0]} (option table={bases[0]})"
    elif bases:
        fix = f"write to the table it shows rows of, one of {', '.join(bases)}"
    else:
        fix = "write to a table"
    how = "the sink writes rows into a table (COPY"
    how += ", an upsert's INSERT ... ON CONFLICT)" if upsert else ")"
    raise ConfigError(
        f"table {table} is {what}: {how}, and nothing was written. Fix: {fix}"
        + (
            "; a view takes an append only through an INSTEAD OF INSERT trigger"
            if relkind == "v"
            else ""
        )
    )


_MISSING = """
SELECT DISTINCT p FROM unnest(%s::text[], %s::text[]) AS w(p, col)
WHERE NOT CASE WHEN col IS NULL THEN has_table_privilege(%s::regclass, p)
               ELSE has_column_privilege(%s::regclass, col, p) END
"""


def check_privileges(
    conn: Connection,
    table: TableName,
    mode: str,
    written: Sequence[str],
    keys: Sequence[str] = (),
    delete: bool = False,
) -> None:
    """Refuse, with the GRANT that fixes it, a target the sink's role may not write as
    ``mode`` does (``written``: the table's columns the write names; ``keys``: an upsert's
    key; ``delete``: an upsert with a delete column): an append INSERTs the written columns
    (a column grant is enough); an upsert also SELECTs its key and the updated columns
    and UPDATEs those (INSERT ... ON CONFLICT DO UPDATE SET c = EXCLUDED.c), and DELETEs
    with a delete column; a replace DELETEs every row first."""
    wanted: list[tuple[str, str | None]] = [("INSERT", c) for c in written]
    updated = [c for c in written if c not in keys]
    if mode == "upsert":
        wanted += [("SELECT", c) for c in (*keys, *updated)]
        wanted += [("UPDATE", c) for c in updated]
        if delete:
            wanted.append(("DELETE", None))
    elif mode == "replace":
        wanted.append(("DELETE", None))
    if not wanted:
        return
    regclass = table.identifier().as_string(conn)
    args = ([p for p, _ in wanted], [c for _, c in wanted], regclass, regclass)
    missing = {str(row[0]) for row in conn.execute(_MISSING.encode(), args)}
    if not missing:
        return
    order = ("INSERT", "UPDATE", "SELECT", "DELETE")
    privileges = ", ".join(p for p in order if p in missing)
    current = conn.execute(b"SELECT current_user").fetchone()
    role = str(current[0]) if current else conn.info.user
    why = {
        "upsert": " (mode=upsert: INSERT ... ON CONFLICT DO UPDATE reads the key and the "
        "updated columns and updates them" + (", and deletes rows" if delete else "") + ")",
        "replace": " (mode=replace: the batch deletes the table's rows, then inserts)",
    }.get(mode, "")
    raise ConfigError(
        f"role {role} lacks {privileges} on table {table}{why}; nothing "
        f"was written. Fix: GRANT {privileges} ON {_quoted(conn, table.schema, table.name)} "
        f"TO {_quoted(conn, role)} (sqlsink check --url URL lists what the sink's role needs)"
    )
