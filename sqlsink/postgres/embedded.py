"""A throw-away PostgreSQL server for the demo and the tests.

It runs the server binaries of the ``pgserver`` wheel (PostgreSQL 16) when that
package is installed, else the machine's own (``pg_config --bindir`` or
``/usr/lib/postgresql/*/bin``). PostgreSQL refuses to run as root, so under root
the server runs as an unprivileged system user.

The server can be stopped the hard way (``stop("immediate")``, a crash as far as
PostgreSQL knows) and started again on the same data directory: prepared
transactions must survive that, and the crash tests rely on it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sqlsink.errors import ConfigError

_BINARIES = ("initdb", "pg_ctl", "postgres")
_SYSTEM_USER = "sqlsink-pg"


def find_bindir() -> Path:
    """Where the server binaries are: ``$SQLSINK_PG_BINDIR``, pgserver's, or the machine's."""
    candidates: list[Path] = []
    if env := os.environ.get("SQLSINK_PG_BINDIR"):
        candidates.append(Path(env))
    # find_spec, not import: importing pgserver starts its own machinery and warns
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    if pg_config := shutil.which("pg_config"):
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for bindir in candidates:
        if all((bindir / name).is_file() for name in _BINARIES):
            return bindir
    raise ConfigError(
        "no PostgreSQL server binaries found for the embedded server: "
        "install the 'pgserver' wheel (pip install 'sqlsink[embedded]') or PostgreSQL's "
        "server package, or set SQLSINK_PG_BINDIR"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unprivileged_user() -> str | None:
    """None when we may run the server ourselves; else the user to run it as."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", _SYSTEM_USER):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", _SYSTEM_USER], check=True, capture_output=True
    )
    return _SYSTEM_USER


def _reachable_by_others(path: Path) -> bool:
    """True if every existing ancestor of ``path`` lets other users through."""
    for ancestor in path.absolute().parents:
        if ancestor.exists() and not ancestor.stat().st_mode & 0o001:
            return False
    return True


class EmbeddedPostgres:
    """One PostgreSQL cluster in a directory of its own, on a free loopback port."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        settings: Mapping[str, str | int] | None = None,
        port: int | None = None,
    ) -> None:
        self.bindir = find_bindir()
        self.user = _unprivileged_user()
        if base_dir is None or (self.user and not _reachable_by_others(Path(base_dir))):
            # under root the server runs as another user, who must reach the directory
            base_dir = Path(tempfile.mkdtemp(prefix="sqlsink-pg-"))
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "server.log"
        self.port = port or _free_port()
        self.settings: dict[str, str | int] = {
            "max_prepared_transactions": 64,
            "max_connections": 100,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.base_dir}'",
            "port": self.port,
            **(settings or {}),
        }

    # -- life cycle -------------------------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def init(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o755)
        if self.user:
            shutil.chown(self.base_dir, self.user)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        self.configure(self.settings)

    def configure(self, settings: Mapping[str, str | int]) -> None:
        """Append settings to postgresql.conf (they take effect at the next start)."""
        lines = "".join(f"{name} = {value}\n" for name, value in settings.items())
        with open(self.data_dir / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(lines)

    def start(self) -> EmbeddedPostgres:
        self.init()
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; mode 'immediate' is a crash as far as PostgreSQL knows."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        status = self._run("pg_ctl", "-D", str(self.data_dir), "status", check=False)
        return status.returncode == 0

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _run(self, binary: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bindir / binary), *args],
            capture_output=True,
            text=True,
            user=self.user,
            cwd=self.base_dir if self.base_dir.exists() else None,
            check=False,
        )
        if check and result.returncode != 0:
            log = (
                self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            )
            raise ConfigError(
                f"embedded PostgreSQL: '{binary} {' '.join(args[:1])}' failed "
                f"(exit {result.returncode}): {result.stderr.strip()[-1000:]}\n{log}"
            )
        return result
