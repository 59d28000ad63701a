"""The first errors of planning, in the sink's words (what the first-contact trial met
as raw driver classes): a read-only server, ``createTable`` into a schema that does not
exist, ``createTable`` without the right to create; a view as the target and a role
without INSERT (or, for an upsert, UPDATE and SELECT), which the tasks met before. Each
is a ConfigError naming what is wrong and the fix, raised by the planner before anything
is written."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions
from sqlsink.spark.plan import plan_write
from tests.fix_pg import PgServer

SCHEMA = StructType([StructField("id", LongType()), StructField("payload", StringType())])


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@pytest.fixture
def role(pg_server: PgServer) -> Iterator[str]:
    """A login role that may use the sink's commit log but creates nothing else (since
    PostgreSQL 15, PUBLIC has no CREATE on schema public: nothing to revoke)."""
    name = f"planner_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA sqlsink TO {}").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA sqlsink TO {}").format(sql.Identifier(name))
        )
    yield name
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def plan(url: str, table: str, **more: str) -> None:
    options = SinkOptions.parse({"url": url, "table": table, "sinkId": "plan-errors", **more})
    plan_write(options, SCHEMA, "test")


def ensure_log(url: str) -> None:
    from sqlsink.postgres.schema import ensure_schema

    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]


def test_create_table_in_a_schema_that_does_not_exist(pg_url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        plan(pg_url, "nosuch_schema.events", createTable="true")
    text = str(refused.value)
    assert text.startswith("schema nosuch_schema of table nosuch_schema.events does not exist")
    assert 'CREATE SCHEMA "nosuch_schema"' in text


def test_create_table_without_the_right_to_create(
    pg_url: str, pg_server: PgServer, role: str
) -> None:
    ensure_log(pg_url)
    table = f"t_{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigError) as refused:
        plan(as_role(pg_url, role), table, createTable="true")
    text = str(refused.value)
    assert f"role {role} may not create table public.{table}" in text, text
    assert f'GRANT CREATE ON SCHEMA "public" TO "{role}"' in text, text
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"public.{table}",)).fetchone() == (None,)


def test_a_read_only_server(pg_url: str, role: str, table: str) -> None:
    ensure_log(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(
                sql.Identifier(role)
            )
        )
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
    with pytest.raises(ConfigError) as refused:
        plan(as_role(pg_url, role), table, createTable="true")
    text = str(refused.value)
    assert "is read-only" in text and "primary" in text, text
    assert "target_session_attrs=read-write" in text, text


def run(url: str, *statements: str | sql.Composed) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def base_table(url: str, table: str) -> None:
    ddl = "CREATE TABLE {} (id bigint PRIMARY KEY, payload text)"
    run(url, sql.SQL(ddl).format(sql.Identifier(table)))


@pytest.fixture
def view(pg_url: str, table: str) -> Iterator[str]:
    """A view over ``table`` (dropped before the table fixture drops the table)."""
    name = f"v_{table[2:]}"
    yield name
    for kind in ("VIEW", "MATERIALIZED VIEW"):
        with contextlib.suppress(psycopg.errors.WrongObjectType):
            drop = sql.SQL("DROP " + kind + " IF EXISTS {}")  # kind: a constant
            run(pg_url, drop.format(sql.Identifier(name)))


@pytest.mark.parametrize("kind", ["VIEW", "MATERIALIZED VIEW"])
def test_a_view_as_the_target(pg_url: str, table: str, view: str, kind: str) -> None:
    base_table(pg_url, table)
    ddl = sql.SQL("CREATE " + kind + " {} AS SELECT id, payload FROM {}")  # kind: a constant
    run(pg_url, ddl.format(sql.Identifier(view), sql.Identifier(table)))
    with pytest.raises(ConfigError) as refused:
        plan(pg_url, view)
    text = str(refused.value)
    what = "a view" if kind == "VIEW" else "a materialized view"
    assert text.startswith(f"table public.{view} is {what}"), text
    assert f"write to its base table public.{table}" in text, text


def test_upsert_into_a_view(pg_url: str, table: str, view: str) -> None:
    base_table(pg_url, table)
    ddl = sql.SQL("CREATE VIEW {} AS SELECT id, payload FROM {}")
    run(pg_url, ddl.format(sql.Identifier(view), sql.Identifier(table)))
    with pytest.raises(ConfigError, match=rf"^table public.{view} is a view"):
        plan(pg_url, view, mode="upsert", keyColumns="id")


def test_no_insert_grant(pg_url: str, role: str, table: str) -> None:
    ensure_log(pg_url)
    base_table(pg_url, table)
    run(pg_url, sql.SQL("GRANT SELECT ON {} TO {}").format(*map(sql.Identifier, (table, role))))
    with pytest.raises(ConfigError) as refused:
        plan(as_role(pg_url, role), table)
    text = str(refused.value)
    assert text.startswith(f"role {role} lacks INSERT on table public.{table}"), text
    assert f'Fix: GRANT INSERT ON "public"."{table}" TO "{role}"' in text, text


def test_an_insert_grant_on_the_written_columns_is_enough(
    pg_url: str, role: str, table: str
) -> None:
    ensure_log(pg_url)
    base_table(pg_url, table)
    grant = "GRANT INSERT (id, payload) ON {} TO {}"
    run(pg_url, sql.SQL(grant).format(*map(sql.Identifier, (table, role))))
    plan(as_role(pg_url, role), table)


def test_upsert_needs_update_and_select(pg_url: str, role: str, table: str) -> None:
    ensure_log(pg_url)
    base_table(pg_url, table)
    run(pg_url, sql.SQL("GRANT INSERT ON {} TO {}").format(*map(sql.Identifier, (table, role))))
    with pytest.raises(ConfigError) as refused:
        plan(as_role(pg_url, role), table, mode="upsert")
    text = str(refused.value)
    assert text.startswith(
        f"role {role} lacks UPDATE, SELECT on table public.{table} (mode=upsert"
    ), text
    assert f'Fix: GRANT UPDATE, SELECT ON "public"."{table}" TO "{role}"' in text, text
    run(
        pg_url,
        sql.SQL("GRANT UPDATE, SELECT ON {} TO {}").format(*map(sql.Identifier, (table, role))),
    )
    plan(as_role(pg_url, role), table, mode="upsert")


def test_a_view_with_an_instead_of_insert_trigger_takes_an_append(
    pg_url: str, table: str, view: str
) -> None:
    base_table(pg_url, table)
    ddl = sql.SQL("CREATE VIEW {} AS SELECT id, payload FROM {}")
    function = sql.SQL(
        "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN INSERT INTO {} VALUES (NEW.id, NEW.payload); RETURN NEW; END$$"
    )
    trigger = sql.SQL(
        "CREATE TRIGGER ins INSTEAD OF INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
    )
    name = sql.Identifier(f"f_{view}")
    run(
        pg_url,
        ddl.format(sql.Identifier(view), sql.Identifier(table)),
        function.format(name, sql.Identifier(table)),
        trigger.format(sql.Identifier(view), name),
    )
    try:
        plan(pg_url, view)  # COPY writes through the trigger: not refused
        with pytest.raises(ConfigError, match=rf"^table public.{view} is a view"):
            plan(pg_url, view, mode="upsert", keyColumns="id")  # ON CONFLICT: never
    finally:
        run(pg_url, sql.SQL("DROP VIEW {}").format(sql.Identifier(view)))
        run(pg_url, sql.SQL("DROP FUNCTION {}()").format(name))


def test_replace_needs_delete(pg_url: str, role: str, table: str) -> None:
    ensure_log(pg_url)
    base_table(pg_url, table)
    run(pg_url, sql.SQL("GRANT INSERT ON {} TO {}").format(*map(sql.Identifier, (table, role))))
    with pytest.raises(ConfigError) as refused:
        plan(as_role(pg_url, role), table, mode="replace")
    text = str(refused.value)
    assert text.startswith(f"role {role} lacks DELETE on table public.{table} (mode=replace"), text
    assert f'Fix: GRANT DELETE ON "public"."{table}" TO "{role}"' in text, text
