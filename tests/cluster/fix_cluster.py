"""A real Spark standalone cluster on this machine, with workers on distinct "hosts".

Spark never places a speculative copy of a task on a host that already runs an
attempt of it (TaskSetManager), and local mode is one host. Every address in
127.0.0.0/8 is this machine, so a Master on 127.0.0.1 and one Worker on each of
127.0.0.2 and 127.0.0.3 make two hosts for the scheduler. Everything is started
from the pip package's SPARK_HOME with ``bin/spark-class``, each daemon in a
process group of its own (its executors are its children, in the same group),
with its logs and work directories under the given directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlsink.core.faults import ENV as FAULTS_ENV

MASTER_HOST = "127.0.0.1"
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
START_TIMEOUT_S = 120.0
# daemons do little: a small heap, and no C2 compiler to warm up on a 2-core machine
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port(host: str = MASTER_HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class StandaloneCluster:
    directory: Path
    master_port: int = 0
    ui_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    def state(self) -> dict[str, Any]:
        """The Master's JSON status page."""
        url = f"http://{MASTER_HOST}:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return dict(json.load(answer))

    def log(self, name: str, tail: int = 3000) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {name}.log ---\n{self.log(name)}" for name in self.processes)

    # -- start -------------------------------------------------------------------------

    def _env(self, host: str, work: Path | None = None) -> dict[str, str]:
        env = {
            **{k: v for k, v in os.environ.items() if k != FAULTS_ENV},  # the app's, per run
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self.directory / "conf"),  # empty: no stray defaults
            "SPARK_LOG_DIR": str(self.directory / "logs"),
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTS,
            # the REST submission server would take the fixed port 6066
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        if work is not None:
            env["SPARK_WORKER_DIR"] = str(work)
            env["SPARK_LOCAL_DIRS"] = str(work / "local")
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        with open(self.directory / f"{name}.log", "wb") as log:
            self.processes[name] = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own: torn down with its executors
            )

    def start(self) -> None:
        for sub in ("conf", "logs"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        self.master_port, self.ui_port = free_port(), free_port()
        self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                MASTER_HOST,
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.ui_port),
            ],
            self._env(MASTER_HOST),
        )
        # a worker that registers before the master is elected leader is ignored and
        # retries only 5-15 s later: start the workers once the master is ALIVE
        self._wait("the master to be ALIVE", lambda s: s.get("status") == "ALIVE")
        for number, host in enumerate(WORKER_HOSTS, start=1):
            work = self.directory / f"worker{number}"
            (work / "local").mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker{number}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    host,
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(work),
                    self.master_url,
                ],
                self._env(host, work),
            )
        self._wait("both workers to register", self._workers_alive)

    def _workers_alive(self, state: dict[str, Any]) -> bool:
        hosts = sorted(w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE")
        return hosts == sorted(WORKER_HOSTS)

    def _wait(self, what: str, ready: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"spark {name} exited ({process.returncode}) while waiting for "
                        f"{what}:\n{self.logs()}"
                    )
            with contextlib.suppress(OSError, ValueError):
                if ready(self.state()):
                    return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    # -- stop --------------------------------------------------------------------------

    def stop(self) -> None:
        """SIGTERM every group (workers first: they stop their executors), then SIGKILL."""
        order = sorted(self.processes, key=lambda name: name == "master")
        for name in order:
            _signal_group(self.processes[name], signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name in order:
            process = self.processes[name]
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            _signal_group(process, signal.SIGKILL)  # stragglers of the group (executors)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)  # start_new_session: the group id is the pid


@contextlib.contextmanager
def standalone_cluster(directory: Path) -> Iterator[StandaloneCluster]:
    """A running Master and two Workers; torn down on exit, also when starting fails."""
    cluster = StandaloneCluster(directory)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def run_in_group(
    command: list[str], *, cwd: Path, env: dict[str, str], log_path: Path, timeout_s: float
) -> int | None:
    """Run a driver in a process group of its own, its output to ``log_path``; kill the
    group (its JVM, its Python workers) whatever happens. The exit code, None on timeout."""
    with open(log_path, "wb") as log:
        driver = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return driver.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


def executor_logs(cluster: StandaloneCluster) -> str:
    """The end of every executor's stderr (in the workers' work directories)."""
    return "\n".join(
        f"--- {path} ---\n{path.read_text(errors='replace')[-3000:]}"
        for path in sorted(cluster.directory.glob("worker*/app-*/*/stderr"))
    )
