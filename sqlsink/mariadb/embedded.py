"""A throw-away MariaDB server for the demo and the tests: MariaDB's counterpart of
``sqlsink.embedded``.

It runs Debian's server binaries (``mariadbd`` and ``mariadb-install-db``, the packages
``mariadb-server-core`` and ``mariadb-client-core``; the repository's
``scripts/ensure-mariadb.sh`` installs them): ``mariadb-install-db`` into a data
directory of its own, ``mariadbd`` on a free port of 127.0.0.1 and a unix socket in
that directory, with the binary log on (``log-bin``, ROW format), so that what runs
on it is XA with the binary log, as a replicated production server runs it. Never the
machine's own server (port 3306), whose configuration files are not read
(``--no-defaults``).

Grant tables are used (never ``--skip-grant-tables``): ``root`` (given a password at
the first start) administers, and the sink's role (``sink``) has only what the sink
needs: all on its databases (the target's and the commit log's, ``sqlsink``) and
FILE. The server is started in a session of its own (a Ctrl-C at the terminal
reaches its owner, which stops it in order) and, where ``setpriv`` is found, with a
parent-death signal: if its owner dies without stopping it, the kernel kills it, so
no ``mariadbd`` outlives the program that started it (start it from a thread that lives
as long as the server: the signal follows the thread that forked). Every wait is bounded.

It can be SIGKILLed (``kill``: a crash as far as MariaDB knows) and started again
on the same data directory: prepared XA branches must survive that, and the crash
tests rely on it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlsink.errors import ConfigError

MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = "mariadb-install-db"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
INSTALL_TIMEOUT_S = 120.0
INSTALL_HINT = (
    "as root: apt-get install mariadb-server-core mariadb-client-core "
    "(the repository's scripts/ensure-mariadb.sh, run by make setup, does it)"
)
SINK_USER, SINK_PASSWORD = "sink", "sink-pw"
ROOT_PASSWORD = "root-pw"
LOG_DATABASE = "sqlsink"  # the commit log's database (sqlsink/mariadb/connection.py)


def binaries_present() -> bool:
    """True when ``mariadbd`` and ``mariadb-install-db`` are installed."""
    return os.access(MARIADBD, os.X_OK) and shutil.which(INSTALL_DB) is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a mariadbd: SIGTERM (a clean shutdown), then SIGKILL after STOP_TIMEOUT_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


class EmbeddedMariaDB:
    """One MariaDB server in a directory of its own, on a free loopback port.

    ``databases``: created at the first start, the sink's role granted all on each
    (the commit log's ``sqlsink`` is always among them). ``base_dir``: where the data
    directory, the socket and the logs go (a new temporary directory when None,
    removed by ``destroy``)."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        databases: Sequence[str] = (),
        port: int | None = None,
        sink: tuple[str, str] = (SINK_USER, SINK_PASSWORD),
        root_password: str = ROOT_PASSWORD,
    ) -> None:
        self.owns_base_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="sqlsink-mariadb-"))
        self.data_dir = self.base_dir / "data"
        self.socket_path = str(self.base_dir.absolute() / "mariadb.sock")
        self._socket_dir: str | None = None
        if len(self.socket_path) > 100:  # a unix socket's path holds at most 107 bytes
            self._socket_dir = tempfile.mkdtemp(prefix="sqlsink-mdb-")
            self.socket_path = f"{self._socket_dir}/mariadb.sock"
        self.error_log = self.base_dir / "error.log"
        # its temporary files: not /tmp, where other servers' names may meet its own
        self.tmp_dir = self.base_dir / "tmp"
        self.host = "127.0.0.1"
        self.port = port or _free_port()
        self.sink = sink
        self.root = ("root", "")  # until the first start gives root its password
        self.root_password = root_password
        self.databases = list(dict.fromkeys([*databases, LOG_DATABASE]))
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0
        self._run_as = ["--user=root"] if os.geteuid() == 0 else []

    # -- where it is --------------------------------------------------------------------

    def url(self, database: str = LOG_DATABASE) -> str:
        """The sink's URL: ``mariadb://sink:…@127.0.0.1:port/database``."""
        user, password = self.sink
        return (
            f"mariadb://{urllib.parse.quote(user)}:{urllib.parse.quote(password)}"
            f"@{self.host}:{self.port}/{database}"
        )

    def connect(self, *, root: bool = False, database: str | None = None, **kw: Any) -> Any:
        """A PyMySQL session (autocommit) as the sink's role, or as root over the socket."""
        import pymysql

        user, password = self.root if root else self.sink
        where: dict[str, Any] = (
            {"unix_socket": self.socket_path} if root else {"host": self.host, "port": self.port}
        )
        kw.setdefault("autocommit", True)
        kw.setdefault("connect_timeout", 10)
        return pymysql.connect(user=user, password=password, database=database, **where, **kw)

    # -- life cycle ---------------------------------------------------------------------

    def args(self) -> list[str]:
        """The server's command line."""
        base, data = self.base_dir, self.data_dir
        return [
            MARIADBD, "--no-defaults", f"--datadir={data}", *self._run_as,
            f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.socket_path}",
            f"--pid-file={base / 'mariadbd.pid'}", f"--log-error={self.error_log}",
            f"--tmpdir={self.tmp_dir}",
            f"--log-bin={data / 'binlog'}", "--server-id=1", "--binlog-format=ROW",
            "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
            "--skip-name-resolve", "--max-connections=200", "--local-infile=1",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin",
            # the sink's role creates the commit log's triggers at first use: with the binary
            # log on, a user without SUPER may do so only with this (sqlsink/mariadb/schema.py)
            "--log-bin-trust-function-creators=1",
        ]  # fmt: skip

    def init(self) -> None:
        """``mariadb-install-db`` into the data directory, unless it holds a server's data."""
        if (self.data_dir / "mysql").is_dir():
            return
        if not binaries_present():
            raise ConfigError(
                f"no MariaDB server binaries ({MARIADBD}, {INSTALL_DB}): {INSTALL_HINT}"
            )
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                [
                    INSTALL_DB, "--no-defaults", f"--datadir={self.data_dir}", *self._run_as,
                    "--auth-root-authentication-method=normal", "--skip-test-db",
                    "--skip-name-resolve", f"--tmpdir={self.tmp_dir}",
                ],
                capture_output=True, timeout=INSTALL_TIMEOUT_S, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"embedded MariaDB: mariadb-install-db did not finish within "
                f"{INSTALL_TIMEOUT_S:.0f} s (data directory {self.data_dir})"
            ) from None
        if done.returncode != 0:
            raise ConfigError(
                f"embedded MariaDB: mariadb-install-db failed (exit {done.returncode}): "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )

    def start(self) -> EmbeddedMariaDB:
        """Start the server and wait (at most START_TIMEOUT_S) until it takes connections;
        at the first start give root its password and create the databases and the role."""
        if self.is_running():
            return self
        self.init()
        first = self.root == ("root", "")
        self.launch()
        if first:
            self._configure()
        return self

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after STOP_TIMEOUT_S."""
        if self.process is not None:
            stop_process(self.process)

    def kill(self) -> None:
        """SIGKILL the server: a crash as far as MariaDB knows."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def kill_and_restart(self) -> None:
        """SIGKILL the server and start it again on the same data directory."""
        self.kill()
        self.start()

    def destroy(self) -> None:
        """Stop the server; remove the base directory if this object made it."""
        self.stop()
        if self.owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        if self._socket_dir:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- inside -------------------------------------------------------------------------

    def launch(self, args: Sequence[str] | None = None) -> subprocess.Popen[bytes]:
        """Start mariadbd on the data directory as it is (``args``: another command line
        than ``args()``) and wait until it takes connections; ``self.process`` is set at
        once, so that a stop during the wait finds it."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        prefix: list[str] = []
        # killed with its owner, never an orphan; but the death signal fires when the
        # *thread* that started it ends, so only a start from the main thread asks for it
        # (a server a helper thread restarts must outlive that thread)
        main = threading.current_thread() is threading.main_thread()
        if main and (setpriv := shutil.which("setpriv")):
            prefix = [setpriv, "--pdeathsig", "KILL", "--"]
        with open(self.base_dir / "mariadbd.out", "ab") as out:
            proc = subprocess.Popen(
                [*prefix, *(self.args() if args is None else args)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the owner, which stops it
            )
        self.process = proc
        began = time.monotonic()
        deadline = began + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise ConfigError(
                    f"embedded MariaDB: mariadbd (data directory {self.data_dir}, port "
                    f"{self.port}) exited with {proc.returncode} at start; see {self.error_log}"
                )
            try:
                # read_timeout: a server that accepts but does not greet yet is asked again
                # (connect_timeout bounds only PyMySQL's TCP connect)
                self.connect(root=True, connect_timeout=2, read_timeout=2, write_timeout=2).close()
                break
            except Exception:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait(STOP_TIMEOUT_S)
                    raise ConfigError(
                        f"embedded MariaDB: mariadbd did not accept connections within "
                        f"{START_TIMEOUT_S:.0f} s; see {self.error_log}"
                    ) from None
                time.sleep(0.05)
        self.started_in_s = time.monotonic() - began
        return proc

    def _configure(self) -> None:
        """root gets a password; the sink's role gets what the sink needs: its databases
        (the commit log's among them), FILE (LOAD DATA), and XA RECOVER (MariaDB lists
        prepared branches to any user)."""
        user, password = self.sink
        conn = self.connect(root=True)
        try:
            with conn.cursor() as cur:
                cur.execute("ALTER USER 'root'@'localhost' IDENTIFIED BY %s", (self.root_password,))
                for host in ("%", "localhost"):
                    cur.execute(
                        "CREATE USER IF NOT EXISTS %s@%s IDENTIFIED BY %s", (user, host, password)
                    )
                    for db in self.databases:
                        name = db.replace("`", "``")
                        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
                        cur.execute(f"GRANT ALL PRIVILEGES ON `{name}`.* TO %s@%s", (user, host))
                    cur.execute("GRANT FILE ON *.* TO %s@%s", (user, host))
                cur.execute("FLUSH PRIVILEGES")
        finally:
            conn.close()
        self.root = ("root", self.root_password)
