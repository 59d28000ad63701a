"""The MariaDB server the tests run against: a private ``mariadbd`` started once per
session (a pytest plugin, registered in pyproject's addopts; its fixtures start the
server only when a test asks for one).

Where the server comes from, in order: ``SQLSINK_TEST_MARIADB_URL``
(``mariadb://user:password@host:port/``; that user must create databases and users,
and serves as both the sink's role and root); else Debian's binaries
(``scripts/ensure-mariadb.sh``): ``mariadb-install-db`` into a data directory under the
session's temp dir, ``mariadbd`` on a free port of 127.0.0.1 and a unix socket in that
directory, with the binary log on (``log-bin``, ROW format), so that what the tests
see is XA with the binary log, as a replicated production server runs it. Grant
tables are used (never ``--skip-grant-tables``): ``root`` (a password) administers,
and the sink's role ``sink`` has only what the sink needs. The server is stopped at
the session's end (SIGTERM, then SIGKILL after a bounded wait). Never the machine's
own server on port 3306.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

MARIADBD = "/usr/sbin/mariadbd"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
SINK_USER, SINK_PASSWORD = "sink", "sink-pw"
ROOT_PASSWORD = "root-pw"
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
    args: list[str] = field(default_factory=list)
    started_in_s: float = 0.0

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], server: MariaServer) -> subprocess.Popen[bytes]:
    assert server.datadir is not None
    log = open(server.datadir.parent / "mariadbd.out", "ab")  # noqa: SIM115 (the child's)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    began = time.monotonic()
    deadline = began + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"mariadbd exited with {proc.returncode} at start; see "
                f"{server.datadir.parent / 'error.log'}"
            )
        try:
            conn = server.connect(root=True, connect_timeout=2)
            conn.close()
            break
        except Exception:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(
                    f"mariadbd did not accept connections within {START_TIMEOUT_S:.0f} s; "
                    f"see {server.datadir.parent / 'error.log'}"
                ) from None
            time.sleep(0.05)
    server.started_in_s = time.monotonic() - began
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


def _setup_databases(server: MariaServer) -> None:
    conn = server.connect(root=True)
    try:
        with conn.cursor() as cur:
            for db in (TARGET_DB, LOG_DB):
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    finally:
        conn.close()


def _setup_roles(server: MariaServer) -> None:
    """root gets a password; the sink's role gets what the sink needs: its tables, the
    commit log's database, XA RECOVER (MariaDB lists prepared branches to any user)."""
    conn = server.connect(root=True)
    try:
        with conn.cursor() as cur:
            for statement in (
                f"CREATE DATABASE IF NOT EXISTS `{TARGET_DB}`",
                f"CREATE DATABASE IF NOT EXISTS `{LOG_DB}`",
                f"CREATE USER IF NOT EXISTS '{SINK_USER}'@'%' IDENTIFIED BY '{SINK_PASSWORD}'",
                f"CREATE USER IF NOT EXISTS '{SINK_USER}'@'localhost' "
                f"IDENTIFIED BY '{SINK_PASSWORD}'",
            ):
                cur.execute(statement)
            for host in ("%", "localhost"):
                for db in (TARGET_DB, LOG_DB):
                    cur.execute(f"GRANT ALL PRIVILEGES ON `{db}`.* TO '{SINK_USER}'@'{host}'")
                cur.execute(f"GRANT FILE ON *.* TO '{SINK_USER}'@'{host}'")
            cur.execute("FLUSH PRIVILEGES")
    finally:
        conn.close()


def _own_server(base: Path) -> Iterator[MariaServer]:
    if not (os.access(MARIADBD, os.X_OK) and shutil.which("mariadb-install-db")):
        # the project's own script installs them (make setup runs it): never a skip
        subprocess.run(
            ["bash", str(REPO / "scripts" / "ensure-mariadb.sh")], check=False, timeout=900
        )
    if not (os.access(MARIADBD, os.X_OK) and shutil.which("mariadb-install-db")):
        pytest.fail("no MariaDB server binaries: scripts/ensure-mariadb.sh (as root) installs them")
    datadir = base / "data"
    run_as = ["--user=root"] if os.geteuid() == 0 else []
    install = subprocess.run(
        [
            "mariadb-install-db", "--no-defaults", f"--datadir={datadir}", *run_as,
            "--auth-root-authentication-method=normal", "--skip-test-db",
            "--skip-name-resolve",
        ],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    if install.returncode != 0:
        raise RuntimeError(f"mariadb-install-db failed: {install.stderr.decode()[-2000:]}")
    port = _free_port()
    sock = str(base / "mariadb.sock")
    server = MariaServer(
        "127.0.0.1", port, sock, ("root", ""), (SINK_USER, SINK_PASSWORD), datadir=datadir
    )
    server.args = [
        MARIADBD, "--no-defaults", f"--datadir={datadir}", *run_as,
        f"--port={port}", "--bind-address=127.0.0.1", f"--socket={sock}",
        f"--pid-file={base / 'mariadbd.pid'}", f"--log-error={base / 'error.log'}",
        f"--log-bin={datadir / 'binlog'}", "--server-id=1", "--binlog-format=ROW",
        "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
        "--skip-name-resolve", "--max-connections=200", "--local-infile=1",
        "--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin",
        # the sink's role creates the commit log's triggers at first use: with the binary
        # log on, a user without SUPER may do so only with this (sqlsink/mariadb/schema.py)
        "--log-bin-trust-function-creators=1",
    ]  # fmt: skip
    server.process = _start(server.args, server)
    try:
        conn = server.connect(root=True)
        with conn.cursor() as cur:
            cur.execute(f"ALTER USER 'root'@'localhost' IDENTIFIED BY '{ROOT_PASSWORD}'")
        conn.close()
        server.root = ("root", ROOT_PASSWORD)
        _setup_roles(server)
        yield server
    finally:
        if server.process is not None:
            _stop(server.process)


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
