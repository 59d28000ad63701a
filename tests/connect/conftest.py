"""A local Spark Connect server, started once for the tests that need it.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` from
the venv's PySpark (4.x ships the server's jar), on a free port, its Python workers
(the foreachBatch worker, the data source's workers, the tasks) running this venv's
python, where sqlsink is installed: as README "Spark Connect" says a deployment must.
The clients run in processes of their own (tests/connect/client_program.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import pyspark

    from sqlsink.spark.support import CONNECT, parse_version

    if parse_version(pyspark.__version__) < CONNECT:
        pytest.fail(f"the suite's PySpark {pyspark.__version__} ships no Connect server")
    home = Path(pyspark.__file__).parent
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("SQLSINK_FAULTS_FILE", None)
    command = [
        str(home / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.sql.session.timeZone=UTC",
    ]
    with open(log, "wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"the Spark Connect server did not listen on {port} within "
                    f"{START_TIMEOUT_S} s (exit {server.poll()}); its log: "
                    + log.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
