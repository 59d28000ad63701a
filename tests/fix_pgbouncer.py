"""A real PgBouncer in front of the tests' PostgreSQL server, in a pooling mode of choice.

Not a plugin: a test opens ``pgbouncer(pg_url, "session")`` itself. The process is
Debian's ``pgbouncer`` (``scripts/ensure-pgbouncer.sh`` installs it when missing), run
in the foreground from a directory of its own, on 127.0.0.1 and a free port, with
``auth_type = trust`` (its user list holds the server's password, if the URL has one,
for PgBouncer's own login to the server). PgBouncer refuses to run as root: under root
it runs as the unprivileged user the embedded server uses. The pool is small
(``default_pool_size`` 5) so that in transaction mode one client's statements really
do go to different server sessions when the pool is busy. Every wait is bounded; the
process is stopped and its directory removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sqlsink.embedded import _unprivileged_user

ROOT = Path(__file__).resolve().parents[1]
ENSURE_SCRIPT = ROOT / "scripts" / "ensure-pgbouncer.sh"
INSTALL_TIMEOUT_S = 600.0  # apt-get update + install on a fresh machine
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
POOL_MODES = ("session", "transaction", "statement")


@dataclass
class Bouncer:
    """A running pgbouncer: ``url()`` names the same database and role as the server URL."""

    pool_mode: str
    port: int
    directory: Path
    server_url: str
    process: subprocess.Popen[bytes]

    def url(self, dbname: str | None = None) -> str:
        params: dict[str, Any] = dict(conninfo_to_dict(self.server_url))
        params.update(host="127.0.0.1", port=str(self.port))
        if dbname is not None:
            params["dbname"] = dbname
        return make_conninfo(**params)

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """A command on PgBouncer's admin console (``SHOW POOLS``, ``SHOW CONFIG``...)."""
        with psycopg.connect(
            self.url("pgbouncer"), autocommit=True, connect_timeout=5, prepare_threshold=None
        ) as conn:
            return conn.execute(command).fetchall()

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def pgbouncer_binary() -> str:
    """The pgbouncer binary, installed by ``scripts/ensure-pgbouncer.sh`` when missing."""
    try:
        done = subprocess.run(
            [str(ENSURE_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{ENSURE_SCRIPT.name} did not finish within {INSTALL_TIMEOUT_S:g} s"
        ) from None
    if done.returncode != 0:
        raise RuntimeError(
            f"{ENSURE_SCRIPT.name} failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    binary = shutil.which("pgbouncer", path=path)
    if binary is None:
        raise RuntimeError(f"{ENSURE_SCRIPT.name} succeeded but no pgbouncer is on {path}")
    return binary


@contextlib.contextmanager
def pgbouncer(
    server_url: str,
    pool_mode: str,
    *,
    pool_size: int = 5,
    max_client_conn: int = 100,
    round_robin: bool = False,
) -> Iterator[Bouncer]:
    """A pgbouncer in ``pool_mode`` in front of the server of ``server_url`` (any database)."""
    if pool_mode not in POOL_MODES:
        raise ValueError(f"pool_mode must be one of {POOL_MODES}, not {pool_mode!r}")
    binary = pgbouncer_binary()
    server = conninfo_to_dict(server_url)
    user = str(server.get("user") or "postgres")
    password = str(server.get("password") or "")
    run_as = _unprivileged_user()
    directory = Path(tempfile.mkdtemp(prefix="sqlsink-pgbouncer-"))
    try:
        if run_as:
            shutil.chown(directory, run_as)
        (directory / "userlist.txt").write_text(f'"{_quote(user)}" "{_quote(password)}"\n')
        os.chmod(directory / "userlist.txt", 0o600)
        if run_as:
            shutil.chown(directory / "userlist.txt", run_as)
        settings = {
            "listen_addr": "127.0.0.1",
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(directory / "userlist.txt"),
            "admin_users": user,
            "pool_mode": pool_mode,
            "max_client_conn": str(max_client_conn),
            "default_pool_size": str(pool_size),
            "server_round_robin": "1" if round_robin else "0",
            "query_wait_timeout": "30",  # a client queued for a server session gives up
            "logfile": str(directory / "pgbouncer.log"),
        }
        target = f"host={server.get('host') or '127.0.0.1'} port={server.get('port') or 5432}"
        bouncer = _start(binary, directory, settings, target, pool_mode, server_url, run_as)
        try:
            yield bouncer
        finally:
            _stop(bouncer.process)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _quote(value: str) -> str:
    return value.replace('"', '""')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(
    binary: str,
    directory: Path,
    settings: dict[str, str],
    target: str,
    pool_mode: str,
    server_url: str,
    run_as: str | None,
) -> Bouncer:
    """Start pgbouncer and wait until a query goes through it (a new port if it is taken)."""
    failures = []
    for _ in range(3):
        port = _free_port()
        ini = directory / "pgbouncer.ini"
        lines = [f"[databases]\n* = {target}\n", "[pgbouncer]\n"]
        lines += [
            f"{name} = {value}\n" for name, value in {**settings, "listen_port": port}.items()
        ]
        ini.write_text("".join(lines))
        if run_as:
            shutil.chown(ini, run_as)
        process = subprocess.Popen(
            [binary, str(ini)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=run_as,
            cwd=directory,
            start_new_session=True,
        )
        bouncer = Bouncer(pool_mode, port, directory, server_url, process)
        problem = _wait_ready(bouncer)
        if problem is None:
            return bouncer
        _stop(process)
        failures.append(problem)
        if "Address already in use" not in problem:
            break
    raise RuntimeError("pgbouncer did not start: " + "\n".join(failures))


def _wait_ready(bouncer: Bouncer) -> str | None:
    """None once a query goes through; else why not (within ``START_TIMEOUT_S``)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if bouncer.process.poll() is not None:
            return f"exited with {bouncer.process.returncode}: {bouncer.log()[-2000:]}"
        try:
            with psycopg.connect(
                bouncer.url(), autocommit=True, connect_timeout=2, prepare_threshold=None
            ) as conn:
                conn.execute("SELECT 1")
            return None
        except psycopg.OperationalError as exc:
            last = str(exc)
            time.sleep(0.05)
    return f"no query went through within {START_TIMEOUT_S:g} s ({last}): {bouncer.log()[-2000:]}"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (PgBouncer's immediate shutdown), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)
