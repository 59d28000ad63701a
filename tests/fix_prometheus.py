"""A real Prometheus server scraping ``sqlsink metrics``, and the exporter itself.

Not a plugin: a test opens ``exporter(url)`` and ``prometheus(target)`` itself. The
server is Debian's ``prometheus`` (``scripts/ensure-prometheus.sh`` installs it, and
``promtool``, when missing), run in the foreground with a configuration of its own that
scrapes one target every second, a temporary storage directory and a free port on
127.0.0.1; the machine's own Prometheus service, if any, is never used. The exporter is
``python -m sqlsink metrics --listen 127.0.0.1:0``, a process of its own, whose port is
read from the line it prints at start. Every wait is bounded; both processes are
stopped (SIGTERM, then SIGKILL) and the directory removed afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENSURE_SCRIPT = ROOT / "scripts" / "ensure-prometheus.sh"
INSTALL_TIMEOUT_S = 600.0  # apt-get update + install on a fresh machine
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
LISTEN_ANY = ("--listen", "127.0.0.1:0")  # the exporter says which port it took
SERVING = re.compile(r"serving http://127\.0\.0\.1:(\d+)/metrics")


def binary(name: str) -> str:
    """``prometheus`` or ``promtool``, installed by the ensure script when missing."""
    try:
        done = subprocess.run(
            ["bash", str(ENSURE_SCRIPT)],
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
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{ENSURE_SCRIPT.name} succeeded but no {name} is on PATH")
    return found


@dataclass
class Exporter:
    process: subprocess.Popen[str]
    port: int
    stderr_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def get(self) -> str:
        with urllib.request.urlopen(self.url, timeout=30) as answer:
            return str(answer.read().decode())


@contextlib.contextmanager
def exporter(url: str, *extra: str) -> Iterator[Exporter]:
    """``sqlsink metrics --url URL --listen 127.0.0.1:0`` in a process of its own."""
    directory = Path(tempfile.mkdtemp(prefix="sqlsink-metrics-"))
    stderr_path = directory / "stderr"
    try:
        with stderr_path.open("w") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "sqlsink", "metrics", "--url", url, *LISTEN_ANY, *extra],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        try:
            port = _wait_for(lambda: _port(stderr_path, process), "the exporter's port")
            yield Exporter(process, port, stderr_path)
        finally:
            stop(process)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _port(stderr_path: Path, process: subprocess.Popen[str]) -> int | None:
    text = stderr_path.read_text(errors="replace")
    if process.poll() is not None:
        raise RuntimeError(f"sqlsink metrics exited ({process.returncode}): {text}")
    match = SERVING.search(text)
    return int(match.group(1)) if match else None


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    port: int
    directory: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        address = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        with urllib.request.urlopen(address, timeout=10) as answer:
            doc = json.loads(answer.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: each series' labels and value."""
        data = self.api("query", query=expr)
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def wait_for_value(self, expr: str, expected: float, timeout_s: float = 30.0) -> None:
        """Until the query's one series has the value (bounded); else fail with what
        it had and the server's log."""
        deadline = time.monotonic() + timeout_s
        found: list[tuple[dict[str, str], float]] = []
        while time.monotonic() < deadline:
            found = self.query(expr)
            if len(found) == 1 and found[0][1] == expected:
                return
            time.sleep(0.2)
        raise AssertionError(
            f"{expr}: {found} after {timeout_s:g} s, not {expected}; {self.log()[-1500:]}"
        )

    def target_health(self) -> str | None:
        targets = self.api("targets")["activeTargets"]
        return str(targets[0]["health"]) if targets else None

    def log(self) -> str:
        path = self.directory / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def prometheus(target: str) -> Iterator[Prometheus]:
    """A Prometheus scraping ``target`` (host:port) every second, up and scraping."""
    program = binary("prometheus")
    directory = Path(tempfile.mkdtemp(prefix="sqlsink-prometheus-"))
    try:
        config = directory / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: sqlsink\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        server = _start(program, directory, config)
        try:
            yield server
        finally:
            stop(server.process)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _start(program: str, directory: Path, config: Path) -> Prometheus:
    """Start it on a free port; a new port if that one was taken meanwhile."""
    failures = []
    for _ in range(3):
        port = _free_port()
        with (directory / "prometheus.log").open("w") as log:
            process = subprocess.Popen(
                [
                    program,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=directory,
                start_new_session=True,
            )
        server = Prometheus(process, port, directory)
        try:
            _wait_for(functools.partial(_ready, server), "Prometheus to answer")
            return server
        except RuntimeError as exc:
            stop(process)
            failures.append(f"{exc}: {server.log()[-2000:]}")
            if "address already in use" not in server.log():
                break
    raise RuntimeError("prometheus did not start: " + "\n".join(failures))


def _ready(server: Prometheus) -> bool | None:
    if server.process.poll() is not None:
        raise RuntimeError(f"prometheus exited ({server.process.returncode})")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/-/ready", timeout=2):
            return True
    except OSError:
        return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(probe: Any, what: str, timeout_s: float = START_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"waited {timeout_s:g} s for {what}")


def stop(process: subprocess.Popen[Any]) -> int | None:
    """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
    return process.returncode
