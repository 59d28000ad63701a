"""The PostgreSQL server the tests run against, and the prepared-transaction guard.

Where the server comes from, in order: ``SQLSINK_TEST_URL`` (must allow prepared
transactions); testcontainers when a Docker engine answers; else an embedded
server (``sqlsink.postgres.embedded``) started here with max_prepared_transactions.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from sqlsink.postgres.embedded import EmbeddedPostgres

TEST_DB = "sqlsink_test"
SERVER_SETTINGS = {"max_prepared_transactions": 64, "fsync": "off", "max_connections": 120}


@dataclass
class PgServer:
    admin_url: str  # the 'postgres' database, superuser
    url: str  # the test database
    embedded: EmbeddedPostgres | None = None

    def crash_and_restart(self) -> None:
        """Stop the server the way a crash does (-m immediate) and start it again."""
        if self.embedded is None:
            pytest.fail("only a server this run started can be crashed: use own_server")
        self.embedded.stop("immediate")
        self.embedded.start()

    def db_url(self, dbname: str) -> str:
        return psycopg.conninfo.make_conninfo(self.admin_url, dbname=dbname)

    @contextlib.contextmanager
    def database(self, prefix: str) -> Iterator[str]:
        """A new, empty database, dropped afterwards; its URL. For tests that read the
        whole commit log (every sink of a database): other tests' sinks stay out of it."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield self.db_url(name)
        finally:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _create_database(admin_url: str, dbname: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    if url := os.environ.get("SQLSINK_TEST_URL"):
        server = PgServer(admin_url=url, url=url)
        yield server
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None).with_command(
            "-c max_prepared_transactions=64"
        ) as container:
            admin = container.get_connection_url()
            _create_database(admin, TEST_DB)
            yield PgServer(admin, psycopg.conninfo.make_conninfo(admin, dbname=TEST_DB))
        return
    with _embedded_server(tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="session")
def own_server(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """A server this run started itself: it can be crashed (``crash_and_restart``) and it
    trusts local clients (any password). The session's server when it is embedded, else
    (``SQLSINK_TEST_URL``, testcontainers) a second, embedded one: tests that need these
    powers run everywhere instead of being skipped."""
    if pg_server.embedded is not None:
        yield pg_server
        return
    with _embedded_server(tmp_path_factory) as server:
        yield server


@contextlib.contextmanager
def _embedded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    embedded = EmbeddedPostgres(tmp_path_factory.mktemp("pg"), settings=SERVER_SETTINGS)
    embedded.start()
    try:
        _create_database(embedded.url(), TEST_DB)
        yield PgServer(embedded.url(), embedded.url(TEST_DB), embedded)
    finally:
        embedded.destroy()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_server.url


@pytest.fixture
def pg_conn(pg_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def table(pg_url: str) -> Iterator[str]:
    """A unique table name in the public schema, dropped after the test (unless a
    prepared transaction the test left still locks it: the guard below reports that,
    and the drop gives up after 5 s instead of waiting for it forever)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the server may have restarted
        conn.execute("SET lock_timeout = '5s'")
        with contextlib.suppress(psycopg.errors.LockNotAvailable):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("public", name)))


def forget_sink(url: str, sink_id: str) -> None:
    """Remove a sink's commit log (tests that leave data loss on purpose clean it up,
    so commands that read every sink of the database see only what they made)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT set_config('sqlsink.forget', %s, false)", (sink_id,))
        for name in ("markers", "decisions", "runs", "sinks"):
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE sink_id = %s").format(
                    sql.Identifier("sqlsink", name)
                ),
                (sink_id,),
            )


def prepared_transactions(url: str) -> list[tuple[str, str]]:
    """(gid, database) of every prepared transaction of the cluster."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT gid, database FROM pg_prepared_xacts ORDER BY gid").fetchall()
    return [(str(gid), str(db)) for gid, db in rows]


def prepared_in_test_db(server: PgServer) -> list[tuple[str, str]]:
    """Those in the test database: the guard never touches another database's, so a
    server shared through SQLSINK_TEST_URL keeps other users' transactions."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    return [t for t in prepared_transactions(server.url) if row and t[1] == row[0]]


def rollback_all_prepared(server: PgServer, only: list[tuple[str, str]] | None = None) -> None:
    for gid, database in only if only is not None else prepared_transactions(server.admin_url):
        with psycopg.connect(server.db_url(database), autocommit=True) as conn:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


@pytest.fixture(autouse=True)
def no_prepared_transaction_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a prepared transaction behind (and clear it)."""
    if "pg_server" not in request.fixturenames:
        yield
        return
    server: PgServer = request.getfixturevalue("pg_server")
    before = prepared_in_test_db(server)
    if before:
        rollback_all_prepared(server, before)
    yield
    left = prepared_in_test_db(server)
    if left:
        rollback_all_prepared(server, left)
        pytest.fail(f"the test left prepared transactions behind: {left}")
