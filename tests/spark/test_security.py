"""Least privilege, missing privileges, and names that try SQL injection."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.embedded import find_bindir
from tests.fix_pg import PgServer, prepared_transactions

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_db(pg_server: PgServer) -> Iterator[str]:
    """A database of its own (no sqlsink schema yet); its admin URL."""
    with pg_server.database("sec") as url:
        yield url
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        for role in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'sec\\_%%'"):
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(str(role[0]))))


def as_role(admin_url: str, role: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_url, user=role)


def save(spark: Any, url: str, table: str, ids: range = range(0, 100), **options: str) -> None:
    df = spark.range(ids.start, ids.stop, 1, 2).selectExpr("id", "concat('r', id) AS payload")
    writer = df.write.format("sqlsink").mode("append").option("url", url).option("table", table)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return int(str(row.fetchone()[0]))  # type: ignore[index]


def test_least_privilege_role_from_setup_script(
    spark: Any, fresh_db: str, pg_server: PgServer
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, payload text)")
        conn.execute("CREATE TABLE secrets (x int)")
    psql = subprocess.run(
        [
            str(find_bindir() / "psql"),
            fresh_db,
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "role=sec_writer",
            "-v",
            "password='change-me'",
            "-v",
            "target=public.events",
            "-f",
            str(REPO / "sql" / "setup_role.sql"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert psql.returncode == 0, psql.stderr
    writer = as_role(fresh_db, "sec_writer")
    save(spark, writer, "events")  # installs the commit log in its own schema, prepares, commits
    assert count(fresh_db, "events") == 100
    with psycopg.connect(writer) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM secrets")  # and nothing more
    assert prepared_transactions(pg_server.admin_url) == []


def test_read_only_role_gets_one_clear_message(spark: Any, fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, payload text)")
        conn.execute("CREATE ROLE sec_reader LOGIN")
        conn.execute("GRANT SELECT ON events TO sec_reader")
    with pytest.raises(
        Exception, match=r"cannot create the sqlsink schema.*GRANT CREATE ON DATABASE"
    ):
        save(spark, as_role(fresh_db, "sec_reader"), "events")
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # the schema exists, not theirs
        conn.execute("CREATE SCHEMA sqlsink")
    with pytest.raises(Exception, match=r"role sec_reader lacks a privilege.*setup_role\.sql"):
        save(spark, as_role(fresh_db, "sec_reader"), "events")
    assert count(fresh_db, "events") == 0


def test_injection_in_table_and_column_names_only_touches_the_target(
    spark: Any, pg_url: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS keep_me (x int)")
    evil_table = "t; drop table keep_me; --"
    df = spark.range(0, 10, 1, 2).selectExpr("id", "'v' AS `a\"; DROP TABLE keep_me; --`")
    writer = df.write.format("sqlsink").mode("append").option("url", pg_url)
    writer.option("table", evil_table).option("createTable", "true").save()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.keep_me')").fetchone() != (None,)
        rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(evil_table)))
        assert rows.fetchone() == (10,)
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(evil_table)))
    with pytest.raises(Exception, match="invalid table name"):  # an unbalanced quote: refused
        save(spark, pg_url, 'x"; DROP TABLE keep_me; --', createTable="true")
    with pytest.raises(Exception, match="invalid sinkId"):
        save(spark, pg_url, "keep_me", sinkId="a'; DROP TABLE keep_me; --")
