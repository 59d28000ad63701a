"""No password anywhere: errors, logs, Spark's plans and UI, the commit log, the server.

Passwords are given three ways at once: in the URL (``postgresql://user:SECRET@...``,
with characters that must be percent-encoded), in a ``key=value`` conninfo, and in
the ``password`` option (``own_server`` trusts every local connection, so any
password works). ``test_stream.py::test_password_never_appears_in_errors_or_plans``
covers a planning error and a stream's progress; here everything is searched:

- a Spark driver in a process of its own (``python -m tests.spark.test_secrets CONFIG``)
  runs a good stream, failing streams (bad data, a missing table, a wrong port), a good
  and two failing batch writes, with Spark's log at INFO and Python's logging at DEBUG
  in the driver *and* in Spark's Python workers (a ``sitecustomize`` on PYTHONPATH):
  all its output is searched, with what it reports of each failure (``str``, the
  chained ``traceback.format_exception``, the JVM's stack trace and causes), of each
  query (``recentProgress``, ``lastProgress``, ``status``, ``exception()``, explain),
  of the DataFrames' plans, and of what Spark's UI would show (jobs, stages, task
  errors, SQL executions with their plans);
- meanwhile this process samples ``pg_stat_activity`` (application names, statements)
  and ``pg_prepared_xacts`` (gids); afterwards every row of every table of the
  ``sqlsink`` schema, the checkpoints and the server's log are searched;
- the CLI (``status``, ``check``, ``recover``, human and ``--json``, reachable or not);
- in this process, a failing batch write with ``caplog`` at DEBUG.

py4j logs every command it sends to the JVM at DEBUG, option values included: that is
py4j's, not the sink's, and its logger is kept at INFO here (see the report).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer, prepared_transactions
from tests.programs import REPO, run_program
from tests.spark.streams import (
    ActivityMonitor,
    local_session,
    start_query,
    write_records,
    write_source,
)

pytestmark = pytest.mark.spark

URL_SECRET = "uRL/S3cr:t@pw"  # in the URL percent-encoded: uRL%2FS3cr%3At%40pw
KEYWORD_SECRET = "kwS3cretPW"  # in a key=value conninfo
OPTION_SECRET = "opt-S3cret-PW"  # the password option
SECRETS = (URL_SECRET, quote(URL_SECRET, safe=""), KEYWORD_SECRET, OPTION_SECRET)

SITECUSTOMIZE = """\
import logging, sys
logging.basicConfig(
    level=logging.DEBUG, stream=sys.stderr,
    format="python pid=%(process)d %(name)s %(levelname)s %(message)s",
)
logging.getLogger("py4j").setLevel(logging.INFO)  # py4j logs each command it sends at DEBUG
"""


def leaks(texts: Iterable[str]) -> list[str]:
    """Each place a secret shows up: the secret and some text around it."""
    found = []
    for text in texts:
        for secret in SECRETS:
            at = text.find(secret)
            if at >= 0:
                found.append(f"{secret!r} in ...{text[max(0, at - 200) : at + 100]!r}...")
    return found


def secret_urls(pg_url: str) -> tuple[str, str]:
    """The test database's URL with the URL secret, and as key=value with the other one."""
    info = psycopg.conninfo.conninfo_to_dict(pg_url)
    host, port, db = info.get("host", "127.0.0.1"), info.get("port", "5432"), info["dbname"]
    user = info.get("user", "postgres")
    uri = f"postgresql://{user}:{quote(URL_SECRET, safe='')}@{host}:{port}/{db}"
    keywords = f"host={host} port={port} dbname={db} user={user} password={KEYWORD_SECRET}"
    return uri, keywords


def with_port(url: str, port: int) -> str:
    """The same URL or conninfo with another port (one where no server listens)."""
    old = psycopg.conninfo.conninfo_to_dict(url).get("port", "5432")
    if "://" in url:
        return url.replace(f":{old}/", f":{port}/")
    return url.replace(f"port={old}", f"port={port}")


# -- the driver: runs in a process of its own ---------------------------------------------


class Driver:
    """Runs the scenarios and keeps every string Spark and Python give back about them."""

    def __init__(self, spark: Any, config: dict[str, Any]) -> None:
        self.spark = spark
        self.config = config
        self.work = Path(config["work"])
        self.report: dict[str, Any] = {"errors": {}, "queries": {}, "plans": {}, "sinks": {}}

    def describe(self, exc: BaseException) -> dict[str, str]:
        """Everything an exception says: its text, the chained traceback, the JVM's side."""
        texts = {
            "type": type(exc).__name__,
            "str": str(exc),
            "repr": repr(exc),
            "traceback": "".join(traceback.format_exception(exc)),
        }
        for attr in ("desc", "stackTrace", "_desc", "_stackTrace"):
            if isinstance(getattr(exc, attr, None), str):
                texts[attr] = getattr(exc, attr)
        for method in ("getMessage", "getMessageParameters", "getQueryContext"):  # PySpark's
            if callable(call := getattr(exc, method, None)):
                texts[method] = json.dumps(call(), default=str)
        origin = getattr(exc, "_origin", None)
        if origin is not None:  # the Java exception with every cause, as the JVM logs it
            texts["jvm"] = self.spark._jvm.org.apache.spark.util.Utils.exceptionString(origin)
        cause = getattr(exc, "_cause", None)
        if isinstance(cause, BaseException):
            texts["cause"] = json.dumps(self.describe(cause))
        return texts

    def expect_error(self, name: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:
            self.report["errors"][name] = self.describe(exc)
        else:
            self.report["errors"][name] = {"str": "NO ERROR"}

    def stream(self, name: str, source: Path, options: dict[str, str]) -> None:
        query = start_query(self.spark, source, self.work / f"chk-{name}", options)
        try:
            query.awaitTermination()
        except Exception as exc:
            self.report["errors"][name] = self.describe(exc)
        explained = io.StringIO()
        with contextlib.redirect_stdout(explained):
            query.explain(True)
        failure = query.exception()
        self.report["queries"][name] = {
            "id": str(query.id),
            "recentProgress": json.dumps(query.recentProgress, default=str),
            "lastProgress": json.dumps(query.lastProgress, default=str),
            "status": json.dumps(query.status, default=str),
            "exception": json.dumps(self.describe(failure)) if failure is not None else None,
            "explain": explained.getvalue(),
        }
        self.report["sinks"][name] = str(query.id)

    def save(self, df: Any, url: str, table: str, **options: str) -> None:
        writer = df.write.format("sqlsink").mode("append").option("url", url)
        writer = writer.option("table", table).option("password", OPTION_SECRET)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.save()

    def run(self) -> dict[str, Any]:
        spark, work, prefix = self.spark, self.work, self.config["prefix"]
        uri, keywords = self.config["uri"], self.config["keywords"]
        plain = self.config["url"]
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id bigint, payload varchar(12), ts timestamptz, "
                    "amount double precision)"
                ).format(sql.Identifier(f"{prefix}_short"))
            )
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint CHECK (id <> 7), payload text)").format(
                    sql.Identifier(f"{prefix}_check")
                )
            )
        both = {"url": uri, "password": OPTION_SECRET}
        write_source(work / "src", [range(0, 20), range(20, 50)])
        self.stream("ok", work / "src", {**both, "table": f"{prefix}_ok", "createTable": "true"})
        # every partition of batch 1 fails: a partition that prepares while the job fails
        # would stay prepared until the query restarts (the README's limits), and the
        # CLI runs below would find it
        records = [
            [{"id": i, "payload": f"ok {i}"} for i in range(0, 10)],
            [{"id": i, "payload": f"far too long a payload {i}"} for i in range(10, 20)],
        ]
        write_records(work / "bad", records)
        self.stream("bad_data", work / "bad", {**both, "table": f"{prefix}_short"})
        self.stream("missing_table", work / "src", {**both, "table": f"{prefix}_missing"})
        self.stream(
            "wrong_port",
            work / "src",
            {"url": with_port(uri, 1), "password": OPTION_SECRET, "table": f"{prefix}_ok"},
        )
        events = spark.readStream.schema("id BIGINT").json(str(work / "src"))
        self.report["plans"]["stream"] = events._jdf.queryExecution().toString()

        df = spark.range(0, 100, 1, 2).selectExpr("id", "concat('r', id) AS payload")
        self.report["plans"]["batch"] = df._jdf.queryExecution().toString()
        self.save(df, keywords, f"{prefix}_batch", createTable="true")
        self.save(df, uri, f"{prefix}_batch", sinkId=f"{prefix.replace('_', '-')}-load")
        self.expect_error("batch_bad_data", lambda: self.save(df, keywords, f"{prefix}_check"))
        self.expect_error(
            "batch_wrong_port", lambda: self.save(df, with_port(keywords, 1), f"{prefix}_batch")
        )
        self.report["ui"] = self.ui_strings()
        self.report["local_properties"] = {
            key: spark.sparkContext.getLocalProperty(key)
            for key in (
                "spark.job.description",
                "spark.jobGroup.id",
                "callSite.short",
                "callSite.long",
                "spark.sql.execution.id",
            )
        }
        return self.report

    def ui_strings(self) -> dict[str, list[str]]:
        """What Spark's UI shows (it reads the same status stores, UI on or off)."""
        jvm, sc = self.spark._jvm, self.spark.sparkContext
        store = sc._jsc.sc().statusStore()

        def items(seq: Any) -> list[Any]:
            return [seq.apply(i) for i in range(seq.size())]

        ui: dict[str, list[str]] = {"jobs": [], "stages": [], "tasks": [], "sql": []}
        for job in items(store.jobsList(None)):
            ui["jobs"] += [str(job.name()), str(job.description())]
        no_quantiles = sc._gateway.new_array(jvm.double, 0)
        for stage in items(store.stageList(None, False, False, no_quantiles, None)):
            ui["stages"] += [str(stage.name()), str(stage.details()), str(stage.failureReason())]
            for task in items(store.taskList(stage.stageId(), stage.attemptId(), 1_000_000)):
                ui["tasks"].append(str(task.errorMessage()))
        sql_store = self.spark._jsparkSession.sharedState().statusStore()
        for execution in items(sql_store.executionsList()):
            ui["sql"] += [
                str(execution.description()),
                str(execution.details()),
                str(execution.physicalPlanDescription()),
                str(execution.errorMessage()),
            ]
        return ui


def driver_main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    spark = local_session("sqlsink-secrets-driver")
    # INFO: Spark filters a shell's console at WARN until the level changes (the
    # session is left at ERROR, so this is a change)
    spark.sparkContext.setLogLevel("INFO")
    report = Driver(spark, config).run()
    Path(config["report"]).write_text(json.dumps(report, indent=1, ensure_ascii=False))
    spark.stop()
    return 0


# -- the tests ----------------------------------------------------------------------------


def sqlsink_rows(url: str) -> list[str]:
    """Every row of every table of the sqlsink schema, as text."""
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'sqlsink'"
        ).fetchall()
        rows = []
        for (name,) in tables:
            query = sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier("sqlsink", name))
            rows += [f"sqlsink.{name}: {r[0]}" for r in conn.execute(query)]
    assert {"sinks", "decisions", "markers"} <= {str(t[0]) for t in tables}
    return rows


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sqlsink", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "SQLSINK_URL")},
    )


@pytest.fixture
def secrets_db(own_server: PgServer) -> Iterator[str]:
    """A database of its own on a server that trusts local clients (so the made-up
    passwords are accepted): the CLI runs below read every sink of the database, and
    other tests leave sinks behind on purpose (data loss, for one)."""
    with own_server.database("secrets") as url:
        yield url


def test_no_secret_in_any_output_of_a_driver_the_commit_log_the_server_or_the_cli(
    tmp_path: Path, own_server: PgServer, secrets_db: str, table: str
) -> None:
    pg_url = secrets_db
    uri, keywords = secret_urls(pg_url)
    prefix = table  # every table this test creates starts with it
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    config = {
        "url": pg_url,
        "uri": uri,
        "keywords": keywords,
        "prefix": prefix,
        "work": str(tmp_path / "work"),
        "report": str(tmp_path / "report.json"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert own_server.embedded is not None
    server_log = own_server.embedded.log_file
    log_start = server_log.stat().st_size if server_log.exists() else 0
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    started = time.monotonic()
    with ActivityMonitor(pg_url, interval=0.02) as monitor:
        driver = run_program(
            "-m",
            "tests.spark.test_secrets",
            str(tmp_path / "config.json"),
            timeout=400,
            env=env,
            log=tmp_path / "driver.log",
        )
    driver_seconds = time.monotonic() - started
    output = driver.stdout + driver.stderr
    report = json.loads((tmp_path / "report.json").read_text())

    # the capture is real: Spark's INFO log, the sink's own log lines from the Python
    # worker that commits, the sink's sessions seen on the server
    assert " INFO SparkContext: " in output
    assert any(name.startswith("sqlsink ") for name in monitor.application_names)
    assert any(
        "sqlsink INFO sqlsink " in line and "batch 1:" in line for line in output.splitlines()
    )
    # the errors still say what went wrong, and where
    errors = {name: texts["str"] for name, texts in report["errors"].items()}
    assert {"bad_data", "missing_table", "wrong_port"} <= errors.keys(), errors
    assert all(
        word in errors["bad_data"]
        for word in ("batch 1, partition", f"public.{prefix}_short", "'payload'", "too long")
    ), errors["bad_data"]
    assert f"{prefix}_missing" in errors["missing_table"]
    assert "does not exist" in errors["missing_table"]
    assert "cannot connect to PostgreSQL at postgresql://postgres:***@" in errors["wrong_port"]
    assert "batch 0, partition" in errors["batch_bad_data"]
    assert "violates check constraint" in errors["batch_bad_data"]
    assert "cannot connect to PostgreSQL at host=" in errors["batch_wrong_port"]
    assert report["ui"]["sql"] and report["ui"]["tasks"], report["ui"]

    # the CLI on the commit log the driver left, with the secret URL
    checkpoint = tmp_path / "work" / "chk-ok"
    sink = report["sinks"]["ok"]
    closed = with_port(uri, 1)
    runs = [
        cli("status", "--url", uri),
        cli("status", "--url", keywords, "--sink-id", sink, "--json"),
        cli("check", "--url", uri, "--json"),
        cli("check", "--url", keywords),
        cli("recover", "--url", uri, "--sink-id", sink, "--checkpoint", str(checkpoint)),
        cli("recover", "--url", keywords, "--dry-run", "--json"),
        cli("status", "--url", closed),
        cli("recover", "--url", closed, "--json"),
        cli("check", "--url", with_port(keywords, 1), "--json"),
    ]
    results = [(run.args, run.returncode, *run.communicate(timeout=120)) for run in runs]
    codes = [run.returncode for run in runs]
    # the whole database's status may warn (exit 1) about other tests' sinks in the shared
    # database (a sink whose newest run failed is not "all well"); the rest is this sink's
    assert codes[0] in (0, 1) and codes[1:6] == [0, 0, 0, 0, 0], results
    assert codes[6:] == [2, 2, 2], results
    assert sink in results[1][2] and "cannot connect" in results[6][3]
    assert "cannot connect" in json.loads(results[7][2])["error"]["message"]

    texts = [
        output,
        json.dumps(report, ensure_ascii=False),
        *sqlsink_rows(pg_url),
        *monitor.application_names,
        *monitor.statements,
        *monitor.gids,
        *(out + err for _, _, out, err in results),
        *(p.read_text(errors="replace") for p in (tmp_path / "work").rglob("*") if p.is_file()),
    ]
    with server_log.open(errors="replace") as log:  # what the server logged meanwhile
        log.seek(log_start)
        server_text = log.read()
    assert "value too long for type character varying(12)" in server_text
    texts.append(server_text)
    assert leaks(texts) == []
    print(
        f"\nsecrets: driver {driver_seconds:.1f} s, {len(output):,} characters of output, "
        f"{monitor.samples} samples of pg_stat_activity, "
        f"{len(monitor.application_names)} application names, {len(monitor.gids)} gids, "
        f"{len(results)} CLI runs"
    )
    database = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    assert [gid for gid, db in prepared_transactions(pg_url) if db == database] == []


def test_no_secret_in_python_logs_or_exceptions_of_a_failing_batch_write(
    spark: Any, own_server: PgServer, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    pg_url = own_server.url  # it trusts local clients: the made-up passwords are accepted
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="sqlsink")
    uri, keywords = secret_urls(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint CHECK (id <> 7), payload text)").format(
                sql.Identifier(table)
            )
        )
    df = spark.range(0, 20, 1, 2).selectExpr("id", "concat('p', id) AS payload")
    failures = []
    for url in (keywords, with_port(uri, 1)):
        writer = df.write.format("sqlsink").mode("append").option("url", url)
        with pytest.raises(Exception) as err:
            writer.option("table", table).option("password", OPTION_SECRET).save()
        failures.append(err.value)
    texts = ["".join(traceback.format_exception(e)) for e in failures]
    assert "batch 0, partition" in texts[0] and "violates check constraint" in texts[0]
    assert "cannot connect to PostgreSQL at postgresql://postgres:***@" in texts[1]
    # py4j's DEBUG records carry every command sent to the JVM, option values included
    records = [caplog.handler.format(r) for r in caplog.records if not r.name.startswith("py4j")]
    assert any(r.levelno == logging.DEBUG for r in caplog.records)  # the capture works
    assert leaks([*texts, *records]) == []


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        # a password with a raw '%' that was never percent-encoded:
        #   invalid percent-encoded token: "Pa%zzopt-S3cret-PW"
        ("postgresql://postgres:Pa%zz{secret}@127.0.0.1:{port}/db", OPTION_SECRET),
        # a password with a space, unquoted: password=*** opt-S3cret-PW ... after "opt-S3..."
        ("host=127.0.0.1 port={port} password=half {secret}", OPTION_SECRET),
    ],
    ids=["raw-percent-in-url", "space-in-keyword-password"],
)
def test_an_unparsable_url_does_not_echo_its_password(
    spark: Any, pg_url: str, table: str, url: str, secret: str
) -> None:
    from sqlsink.errors import ConfigError
    from sqlsink.postgres.connection import conninfo

    bad = url.format(secret=secret, port=psycopg.conninfo.conninfo_to_dict(pg_url)["port"])
    with pytest.raises(ConfigError, match="invalid url") as err:
        conninfo(bad)
    texts = [str(err.value)]
    for command in ("status", "check --json"):
        run = cli(*command.split(), "--url", bad)
        out, errors = run.communicate(timeout=60)
        assert run.returncode == 2
        texts.append(out + errors)
    df = spark.range(0, 3, 1, 1).selectExpr("id")
    with pytest.raises(Exception, match="invalid url") as failed:
        df.write.format("sqlsink").mode("append").option("url", bad).option("table", table).save()
    texts.append("".join(traceback.format_exception(failed.value)))
    assert leaks(texts) == []


if __name__ == "__main__":
    sys.exit(driver_main(sys.argv[1]))
