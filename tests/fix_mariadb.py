"""The MariaDB server the tests run against: a private ``mariadbd`` started once per
session (a pytest plugin, registered in pyproject's addopts; its fixtures start the
server only when a test asks for one).

Where the server comes from, in order: ``SQLSINK_TEST_MARIADB_URL``
(``mariadb://user:password@host:port/``; that user must create databases and users,
and serves as both the sink's role and root); else Debian's binaries
(``scripts/ensure-mariadb.sh``), started by ``sqlsink.mariadb.embedded`` (the demo's
starter too): ``mariadb-install-db`` into a data directory under the session's temp
dir, ``mariadbd`` on a free port of 127.0.0.1 and a unix socket in that directory,
with the binary log on (``log-bin``, ROW format), so that what the tests see is XA
with the binary log, as a replicated production server runs it. Grant tables are used
(never ``--skip-grant-tables``): ``root`` (a password) administers, and the sink's
role ``sink`` has only what the sink needs. The server is stopped at the session's end
(SIGTERM, then SIGKILL after a bounded wait). Never the machine's own server on port
3306.
"""

from __future__ import annotations

import os
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sqlsink.mariadb.embedded import (
    MARIADBD,
    ROOT_PASSWORD,
    SINK_PASSWORD,
    SINK_USER,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    EmbeddedMariaDB,
    binaries_present,
    stop_process,
)

REPO = Path(__file__).resolve().parents[1]

# the starter's names, as the tests and benchmarks import them from here
__all__ = [
    "LOG_DB", "MARIADBD", "ROOT_PASSWORD", "SINK_PASSWORD", "SINK_USER", "START_TIMEOUT_S",
    "STOP_TIMEOUT_S", "TARGET_DB", "MariaServer",
]  # fmt: skip
TARGET_DB = "sqlsink_test"  # the tests' tables
LOG_DB = "sqlsink"  # the commit log (sqlsink/mariadb)


@dataclass
class MariaServer:
    host: str
    port: int
    socket_path: str | None
    root: tuple[str, str]  # user, password
    sink: tuple[str, str]
    datadir: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    args: list[str] = field(default_factory=list)  # mariadbd's command line
    started_in_s: float = 0.0
    own: EmbeddedMariaDB | None = None  # the starter of the server this run started

    def connect(self, *, root: bool = False, database: str | None = None, **kw: Any) -> Any:
        import pymysql

        user, password = self.root if root else self.sink
        where: dict[str, Any] = (
            {"unix_socket": self.socket_path}
            if self.socket_path
            else {"host": self.host, "port": self.port}
        )
        kw.setdefault("autocommit", True)
        kw.setdefault("connect_timeout", 10)
        return pymysql.connect(user=user, password=password, database=database, **where, **kw)

    def url(self, database: str = TARGET_DB) -> str:
        user, password = self.sink
        return (
            f"mariadb://{urllib.parse.quote(user)}:{urllib.parse.quote(password)}"
            f"@{self.host}:{self.port}/{database}"
        )

    def kill_and_restart(self) -> None:
        """SIGKILL the server (a crash) and start it again on the same data directory."""
        if self.process is None:
            pytest.fail("only a server this run started can be crashed")
        self.process.kill()
        self.process.wait(STOP_TIMEOUT_S)
        self.process = _start(self.args, self)


def _start(args: list[str], server: MariaServer) -> subprocess.Popen[bytes]:
    """mariadbd with this command line on the server's data directory, taking
    connections (sqlsink.mariadb.embedded's wait)."""
    assert server.own is not None
    proc = server.own.launch(args)
    server.started_in_s = server.own.started_in_s
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc)


def _setup_databases(server: MariaServer) -> None:
    conn = server.connect(root=True)
    try:
        with conn.cursor() as cur:
            for db in (TARGET_DB, LOG_DB):
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    finally:
        conn.close()


def _own_server(base: Path) -> Iterator[MariaServer]:
    if not binaries_present():
        # the project's own script installs them (make setup runs it): never a skip
        subprocess.run(
            ["bash", str(REPO / "scripts" / "ensure-mariadb.sh")], check=False, timeout=900
        )
    if not binaries_present():
        pytest.fail("no MariaDB server binaries: scripts/ensure-mariadb.sh (as root) installs them")
    own = EmbeddedMariaDB(base, databases=(TARGET_DB, LOG_DB))
    server = MariaServer(
        own.host, own.port, own.socket_path, own.root, own.sink, own.data_dir, own=own
    )
    try:
        own.start()
        server.root, server.process, server.args = own.root, own.process, own.args()
        server.started_in_s = own.started_in_s
        yield server
    finally:
        if server.process is not None:
            _stop(server.process)
        own.stop()


@pytest.fixture(scope="session")
def mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaServer]:
    given = os.environ.get("SQLSINK_TEST_MARIADB_URL")
    if given:
        parts = urllib.parse.urlsplit(given)
        user = urllib.parse.unquote(parts.username or "root")
        password = urllib.parse.unquote(parts.password or "")
        server = MariaServer(
            parts.hostname or "127.0.0.1", parts.port or 3306, None, (user, password),
            (user, password),
        )  # fmt: skip
        _setup_databases(server)
        yield server
        return
    yield from _own_server(tmp_path_factory.mktemp("mariadb"))


def pytest_report_header(config: pytest.Config) -> str | None:
    if os.environ.get("SQLSINK_TEST_MARIADB_URL"):
        return "mariadb: SQLSINK_TEST_MARIADB_URL"
    return None
