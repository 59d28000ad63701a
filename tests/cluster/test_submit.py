"""README "Running on a cluster", followed literally: ``spark-submit`` of a Python
application that writes with ``format("sqlsink")`` onto a standalone cluster, its
Python environment shipped with ``--archives``.

The environment is built the README's way: the sink's wheel installed with
``--no-deps`` into a fresh venv, its dependencies but not pyspark added, packed
by ``venv-pack``. The archive is cached under ``.cache/submit-env/`` in the
repository, keyed by pyproject.toml, the wheel's contents, the recipe and the
Python, so a warm machine reuses it. The application (``submit_app.py``) is
submitted in client mode from a directory holding the same archive unpacked as
``environment/`` (the driver runs Python there too: a Python data source is
planned and committed in Python workers of the driver, started with the same
``./environment/bin/python`` as the executors').

Neither the workers nor the driver see this repository's venv: its Python is
taken off their PATH and out of PYSPARK_PYTHON, and the application records
where its Python ran: the driver, and tasks on both executors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.cluster.fix_cluster import (
    WORKER_HOSTS,
    StandaloneCluster,
    executor_logs,
    run_in_group,
    spark_home,
)
from tests.fix_pg import PgServer, prepared_in_test_db
from tests.spark.streams import COMPLETE, commit_log, query_id, write_source

pytestmark = [pytest.mark.spark, pytest.mark.crash]
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "submit-env"
VENV_BIN = str(Path(sys.executable).parent)

# docs/deployment/index.md "Running on a cluster", line by line (test_the_readme_holds_this_recipe)
WHEEL = "sqlsink-0.1.0-py3-none-any.whl"
BUILD = [
    "pip wheel --no-deps -w dist .",
    "python3 -m venv sqlsink-env",
    f"sqlsink-env/bin/pip install --no-deps dist/{WHEEL}",
    "sqlsink-env/bin/pip install 'psycopg[binary]>=3.2' 'sqlalchemy>=2.0' 'pyarrow>=15' "
    "'numpy>=1.24' 'pandas>=2.0,<3'",
    "pip install venv-pack",
    "venv-pack -p sqlsink-env -o sqlsink-env.tar.gz",
]
UNPACK = "mkdir environment && tar -xzf sqlsink-env.tar.gz -C environment"
PYTHON = "PYSPARK_PYTHON=./environment/bin/python"
SUBMIT = "--archives sqlsink-env.tar.gz#environment app.py"

BATCHES = [range(0, 30), range(30, 70), range(70, 100)]
SUBMIT_TIMEOUT_S = 240
# test-only settings: the cluster's addresses, and small JVMs on a 2-core machine
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.cores.max": "2",
    "spark.driver.extraJavaOptions": QUICK_JVM,
    "spark.executor.extraJavaOptions": QUICK_JVM,
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.locality.wait": "0s",
}


def without_this_venv(env: dict[str, str]) -> dict[str, str]:
    """The environment less everything that points at this repository's venv."""
    env = {
        k: v
        for k, v in env.items()
        if k not in {"PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH"}
        and k not in {"PYTHONHOME", "SQLSINK_FAULTS_FILE"}
    }
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in path if p and p != VENV_BIN)
    return env


class BareCluster(StandaloneCluster):
    """Workers whose environment names no Python with the sink's packages."""

    def _env(self, host: str, work: Path | None = None) -> dict[str, str]:
        return without_this_venv(super()._env(host, work))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    running = BareCluster(tmp_path_factory.mktemp("cluster"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


# -- the environment, built as the README says -------------------------------------------


def run(command: list[str], cwd: Path, timeout: float = 300) -> None:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{shlex.join(command)} failed:\n{done.stdout}\n{done.stderr}"


def argv(line: str, build: Path) -> list[str]:
    """A README command as this test runs it: ``pip``, ``python3`` and ``venv-pack``
    are this interpreter's, ``sqlsink-env/bin/pip`` the new venv's, paths under
    ``build`` (the wheel is built from this repository)."""
    words = shlex.split(line)
    if words[0] == "pip":
        words = [sys.executable, "-m", "pip", *words[1:]]
    elif words[0] == "python3":
        words = [sys.executable, *words[1:]]
    elif words[0] == "venv-pack":
        words = [sys.executable, "-m", "venv_pack", *words[1:]]
    elif words[0] == "sqlsink-env/bin/pip":
        words = [str(build / "sqlsink-env" / "bin" / "python"), "-m", "pip", *words[1:]]
    return words


def wheel_digest(path: Path) -> str:
    """The wheel's contents (names and bytes, not the zip's timestamps)."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as wheel:
        for name in sorted(wheel.namelist()):
            digest.update(name.encode() + b"\0" + wheel.read(name) + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Environment:
    archive: Path
    built_in_s: float | None  # None: taken from the cache


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """sqlsink-env.tar.gz: from the cache, else built by the README's commands."""
    build = tmp_path_factory.mktemp("build")
    start = time.monotonic()
    pip_wheel, *rest = BUILD
    # in the repository ("."), the wheel into the build directory
    run([*argv(pip_wheel, build)[:-2], str(build / "dist"), "."], cwd=REPO)
    wheel = build / "dist" / WHEEL
    assert wheel.exists(), sorted(p.name for p in (build / "dist").iterdir())
    key = hashlib.sha256(
        "\n".join(
            [
                hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest(),
                wheel_digest(wheel),
                *BUILD,
                sys.version,
                os.path.realpath(sys._base_executable),  # type: ignore[attr-defined]
            ]
        ).encode()
    ).hexdigest()[:16]
    cached = CACHE / key / "sqlsink-env.tar.gz"
    if cached.exists():
        return Environment(cached, None)
    for line in rest:
        if line == "pip install venv-pack":  # a test dependency of this venv already
            continue
        run(argv(line, build), cwd=build)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f".{uuid.uuid4().hex}.partial")
    shutil.move(build / "sqlsink-env.tar.gz", partial)
    os.replace(partial, cached)  # whole or not at all, also with two runs at once
    shutil.rmtree(build / "sqlsink-env")
    return Environment(cached, time.monotonic() - start)


# -- the submission -----------------------------------------------------------------------


@dataclass
class Submitted:
    directory: Path
    table: str
    sink_id: str
    out: dict[str, Any]
    prepared_after: list[tuple[str, str]]
    seconds: float


@pytest.fixture(scope="module")
def submitted(
    cluster: StandaloneCluster,
    environment: Environment,
    pg_server: PgServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Submitted]:
    directory = tmp_path_factory.mktemp("submit")
    # the directory spark-submit runs in: the archive, its unpacked copy, the app
    shutil.copy(environment.archive, directory / "sqlsink-env.tar.gz")
    subprocess.run(["bash", "-c", UNPACK], cwd=directory, check=True)
    shutil.copy(Path(__file__).with_name("submit_app.py"), directory / "app.py")
    source, checkpoint = directory / "src", directory / "chk"
    write_source(source, BATCHES)
    table = f"t_submit_{uuid.uuid4().hex[:10]}"
    out = directory / "out.json"
    (directory / "conf").mkdir()  # SPARK_CONF_DIR: no stray defaults

    env = without_this_venv(dict(os.environ))
    name, value = PYTHON.split("=", 1)
    env[name] = value
    env.update(
        SPARK_HOME=str(spark_home()),  # the cluster's: one Spark version
        SPARK_CONF_DIR=str(directory / "conf"),
        SPARK_LOCAL_IP="127.0.0.1",
    )
    confs = [arg for key, value in CONF.items() for arg in ("--conf", f"{key}={value}")]
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        *["--master", cluster.master_url, "--deploy-mode", "client", *confs],
        *shlex.split(SUBMIT),
        *[str(source), str(checkpoint), pg_server.url, table, str(out)],
    ]
    start = time.monotonic()
    log_path = directory / "submit.log"
    try:
        code = run_in_group(
            command, cwd=directory, env=env, log_path=log_path, timeout_s=SUBMIT_TIMEOUT_S
        )
        seconds = time.monotonic() - start
        assert code == 0, (
            f"spark-submit failed (exit {code}):\n{log_path.read_text(errors='replace')[-6000:]}"
            f"\n{executor_logs(cluster)}"
        )
        yield Submitted(
            directory,
            table,
            query_id(checkpoint),
            json.loads(out.read_text()),
            prepared_in_test_db(pg_server),  # before the per-test guard clears any
            seconds,
        )
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


# -- the tests ----------------------------------------------------------------------------


def test_the_readme_holds_this_recipe() -> None:
    readme = (REPO / "docs" / "deployment" / "index.md").read_text()
    section = readme.split("## Running on a cluster", 1)[1].split("\n## ", 1)[0]
    lines = {line.strip().rstrip("\\").strip() for line in section.splitlines()}
    for line in [*BUILD, UNPACK]:
        assert line in lines, line
    assert any(PYTHON in line and "spark-submit" in line for line in lines), PYTHON
    assert SUBMIT in lines, SUBMIT


def test_the_shipped_environment_has_the_dependencies_but_pyspark() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {re.sub(r"\s*#.*", "", d).replace(" ", "") for d in project["dependencies"]}
    shipped = set(shlex.split(BUILD[3])[2:])
    assert shipped == {d for d in wanted if not d.startswith("pyspark")}


def test_submit_writes_every_record_exactly_once(submitted: Submitted, pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(
                sql.Identifier(submitted.table)
            )
        ).fetchall()
    assert rows == [(i, f"record {i} ✓") for ids in BATCHES for i in ids]
    assert submitted.prepared_after == []
    log = commit_log(pg_url, submitted.sink_id, COMPLETE)
    assert log == {batch: (True,) for batch in range(len(BATCHES))}


def test_the_executors_ran_the_shipped_environment(
    submitted: Submitted, cluster: StandaloneCluster
) -> None:
    tasks = submitted.out["tasks"]
    assert len(tasks) == 8
    workers = set()
    for task in tasks:
        cwd = Path(task["cwd"])
        # an executor's directory in a worker's work directory: worker<N>/app-<id>/<n>
        assert cwd.parent.parent.parent == cluster.directory, task
        workers.add(cwd.parent.parent.name)
        shipped = cwd / "environment"
        assert task["executable"] == str(shipped / "bin" / "python"), task
        assert Path(task["prefix"]) == shipped, task
        assert task["sqlsink"].startswith(f"{shipped}/lib/"), task
        # the cluster's pyspark (SPARK_HOME/python/lib/pyspark.zip): none was shipped
        assert task["pyspark"].startswith(f"{spark_home()}/python/lib/pyspark.zip/"), task
    assert workers == {f"worker{n}" for n in range(1, len(WORKER_HOSTS) + 1)}


def test_the_driver_ran_the_unpacked_copy(submitted: Submitted) -> None:
    driver = submitted.out["driver"]
    unpacked = submitted.directory / "environment"
    assert driver["executable"] == str(unpacked / "bin" / "python"), driver
    assert driver["sqlsink"].startswith(f"{unpacked}/lib/"), driver
    assert driver["pyspark"].startswith(f"{spark_home()}/python/lib/pyspark.zip/"), driver
    assert driver["version"] == list(sys.version_info[:3])


def test_the_packed_environment_is_small(environment: Environment) -> None:
    """Without pyspark (~490 MB of it jars) the archive stays small."""
    size = environment.archive.stat().st_size
    print(f"\nsqlsink-env.tar.gz: {size / 1e6:.0f} MB, built in {environment.built_in_s} s")
    assert size < 200e6
