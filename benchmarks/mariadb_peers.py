"""MariaDB: sqlsink against the peers a user would otherwise pick, in one run, on the same rows.

The rows: the PostgreSQL benchmarks' (``workload.make_rows``: bigint key, a timestamp, an
int, a double, a ~42-character string), ``--rows`` of them as ``--files`` Parquet files
under ``benchmarks/work/data`` (generated once, never timed). The target, created afresh
before every run::

    CREATE TABLE peer_rows (id BIGINT PRIMARY KEY, ts DATETIME(6) NOT NULL,
        n INT NOT NULL, x DOUBLE NOT NULL, s VARCHAR(100) NOT NULL) ENGINE=InnoDB

Append, into the empty table:

* **the floor**: one ``LOAD DATA LOCAL INFILE`` of all rows and ``COMMIT``, from one
  process, no Spark; the file (tab-separated, written beforehand with the sink's own
  encoder, not timed) sent by MariaDB's command-line client (C), and by PyMySQL (the
  client the sink uses). The faster of the two is the floor. Beside it (not a floor), two
  ``mariadb`` clients at once, each loading half the keys in its own transaction: what
  two concurrent writers, like the sink's two partitions, cost the server without Spark;
* **sqlsink** ``exactly_once`` append: ``readStream`` of the Parquet files (Spark's own
  file partitions), ``trigger(availableNow=True)``, ``writeStream.format("sqlsink")``, a
  fresh checkpoint (so a fresh sink id) per run: each partition an XA branch loaded by
  ``LOAD DATA LOCAL INFILE`` from a pipe, ``XA PREPARE``, the driver's decision in the
  commit log, ``XA COMMIT``;
* **Spark's JDBC writer** called from ``foreachBatch`` on the same stream:
  ``df.write.format("jdbc").mode("append")`` with MariaDB Connector/J (Debian's
  ``libmariadb-java``), ``rewriteBatchedStatements=true`` (a batch of ``INSERT``s sent as
  multi-row ``INSERT``s), ``batchsize`` ``--jdbc-batch`` (10,000);
* Spark's ``noop`` sink on the same stream: Spark's own floor (no ratio).

Upsert, into the table pre-filled (untimed) with every other row (``n = -1``: half the
rows update one, half insert one):

* **sqlsink** ``exactly_once`` with ``mode=upsert`` (refused by a sink without MariaDB
  upsert: the refusal is recorded, not a number);
* **the hand-written foreachBatch upsert** a data engineer writes: ``foreachPartition``
  with one PyMySQL connection and transaction per partition, ``executemany`` of
  ``INSERT ... ON DUPLICATE KEY UPDATE`` per 1,000 rows (PyMySQL sends each as one
  multi-row ``INSERT``), one ``COMMIT`` per partition.

Every run is checked (the table holds every row once, with the source's ``n``; after an
upsert no ``n = -1`` is left), else it is an error, not a number. The runs go round-robin
(every method once per round, ``--repeat`` rounds): medians with min and max. Per run the
CPU seconds of each process group (``cpu.CpuMeter``: this driver and its clients, the JVM,
Spark's Python workers; mariadbd read from its own process) and Spark's ``durationMs`` of
the batch. A private mariadbd (tests/fix_mariadb.py's: Debian's binaries, the binary log
on, ``innodb_flush_log_at_trx_commit = 1``) restarted with a 1 GB buffer pool and a 512 MB
redo log, and one ``local[2]`` SparkSession with both JDBC jars. Before measuring, one small
run of every Spark method starts the Python workers and the JIT (not timed).

Run from the repository's root (``scripts/ensure-jdbc.sh`` installs Connector/J)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/mariadb_peers.py --rows 2000000 --repeat 3 \\
        --out benchmarks/results/mariadb_peers.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

from batch_split import drain_source  # noqa: E402
from cpu import CpuMeter  # noqa: E402
from streaming import (  # noqa: E402
    Sink,
    read_stream,
    run_available_now,
    run_foreach_batch_available_now,
)
from workload import Dataset, ensure_dataset  # noqa: E402

from sqlsink.mariadb import encoding  # noqa: E402
from tests.fix_mariadb import MariaServer, _own_server, _start, _stop  # noqa: E402

TABLE = "peer_rows"
DDL = (
    "CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, ts DATETIME(6) NOT NULL, "
    "n INT NOT NULL, x DOUBLE NOT NULL, s VARCHAR(100) NOT NULL) ENGINE=InnoDB"
)
COLUMNS = ("id", "ts", "n", "x", "s")
FIRST_ID = 7_000_000_000  # disjoint from the PostgreSQL benchmarks' data sets
WARM_FIRST_ID = 7_900_000_000
MARIADB_JAR = Path("/usr/share/java/mariadb-java-client.jar")
POSTGRES_JAR = Path("/usr/share/java/postgresql.jar")
SERVER_SETTINGS = {"innodb-buffer-pool-size": "1G", "innodb-log-file-size": "512M"}
HAND_PAGE = 1_000
FLOOR_CLIENT = "LOAD DATA LOCAL INFILE, mariadb client (C), 1 process"
FLOOR_PYMYSQL = "LOAD DATA LOCAL INFILE, PyMySQL, 1 process"
TWO_CLIENTS = "LOAD DATA LOCAL INFILE, mariadb client (C), 2 processes at once, half the keys each"
SINK_APPEND = 'sqlsink exactly_once append (format("sqlsink"))'
JDBC = "Spark JDBC via foreachBatch, Connector/J, rewriteBatchedStatements"
NOOP = "Spark noop sink (Spark's own floor)"
DRAIN = "drain: a Python data source that reads its rows, writes nothing"
SINK_UPSERT = 'sqlsink exactly_once upsert (format("sqlsink"), mode=upsert)'
HAND_UPSERT = f"hand-written foreachBatch upsert (PyMySQL executemany, {HAND_PAGE:,} rows)"


def say(message: str) -> None:
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {message}", flush=True)


@dataclass(frozen=True)
class Files:
    """The rows as LOAD DATA reads them (the sink's encoding), written beforehand."""

    rows: Path
    prefill: Path
    halves: tuple[Path, Path]  # the lower and the upper half of the keys
    encode_s: float  # what encoding every row took (the sink pays it inside its load)


def write_files(data: Dataset, place: Path) -> Files:
    table = pq.read_table(data.path).sort_by("id").select(list(COLUMNS))
    began = time.perf_counter()
    with (place / "rows.tsv").open("wb") as out:
        for batch in table.to_batches(max_chunksize=10_000):
            out.write(encoding.encode(batch))
    encode_s = time.perf_counter() - began
    even = table.filter(pc.equal(pc.bit_wise_and(table["id"], 1), 0))
    stale = even.set_column(2, "n", pa.array([-1] * even.num_rows, pa.int32()))
    with (place / "prefill.tsv").open("wb") as out:
        for batch in stale.to_batches(max_chunksize=10_000):
            out.write(encoding.encode(batch))
    half = table.num_rows // 2
    for name, part in (("lower.tsv", table.slice(0, half)), ("upper.tsv", table.slice(half))):
        with (place / name).open("wb") as out:
            for batch in part.to_batches(max_chunksize=10_000):
                out.write(encoding.encode(batch))
    halves = (place / "lower.tsv", place / "upper.tsv")
    return Files(place / "rows.tsv", place / "prefill.tsv", halves, encode_s)


class Server:
    """The private mariadbd, its sink user's sessions and its CPU seconds."""

    def __init__(self, server: MariaServer) -> None:
        self.server = server
        self.url = server.url()

    def connect(self, **kw: Any) -> Any:
        """The sink user's session over TCP, as the sink's and the JDBC writer's."""
        import pymysql

        user, password = self.server.sink
        kw.setdefault("autocommit", True)
        return pymysql.connect(
            host=self.server.host,
            port=self.server.port,
            user=user,
            password=password,
            database="sqlsink_test",
            charset="utf8mb4",
            local_infile=True,
            **kw,
        )

    def cpu_s(self) -> float:
        assert self.server.process is not None
        times = psutil.Process(self.server.process.pid).cpu_times()
        return float(times.user + times.system)

    def sql(self, *statements: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                return list(cur.fetchall())
        finally:
            conn.close()

    def reset(self) -> None:
        self.sql(f"DROP TABLE IF EXISTS `{TABLE}`", DDL.format(table=TABLE))

    def load_pymysql(self, path: Path) -> None:
        statement, args = encoding.load_statement(f"`{TABLE}`", COLUMNS, str(path))
        conn = self.connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                cur.execute(statement, args)
            conn.commit()
        finally:
            conn.close()

    def load_client(self, *paths: Path) -> None:
        """One ``mariadb`` client process per file, all at once, each one transaction."""
        running = [subprocess.Popen(self.client_command(path)) for path in paths]
        for process in running:
            if process.wait(timeout=3600) != 0:
                raise RuntimeError(f"the mariadb client exited with {process.returncode}")

    def client_command(self, path: Path) -> list[str]:
        statement, _ = encoding.load_statement(f"`{TABLE}`", COLUMNS, "PATH")
        statement = statement.replace("%s", "'" + str(path).replace("'", "''") + "'")
        user, password = self.server.sink
        return [
            "mariadb",
            "--no-defaults",
            "--local-infile=1",
            "--protocol=TCP",
            f"--host={self.server.host}",
            f"--port={self.server.port}",
            f"--user={user}",
            f"--password={password}",
            "sqlsink_test",
            "-e",
            f"START TRANSACTION; {statement}; COMMIT",
        ]

    def check(self, rows: int, first: int, sum_n: int) -> None:
        got = self.sql(
            f"SELECT count(*), count(DISTINCT id), min(id), max(id), sum(n), "
            f"sum(n = -1) FROM `{TABLE}`"
        )[0]
        count, distinct, low, high, total, stale = (int(v or 0) for v in got)
        want = (rows, rows, first, first + rows - 1, sum_n, 0)
        if (count, distinct, low, high, total, stale) != want:
            raise AssertionError(
                f"{TABLE} holds (count, distinct ids, min, max, sum(n), stale rows) = "
                f"{(count, distinct, low, high, total, stale)}, not {want}"
            )

    def prepared_branches(self) -> list[Any]:
        conn = self.server.connect(root=True)
        try:
            with conn.cursor() as cur:
                cur.execute("XA RECOVER")
                return list(cur.fetchall())
        finally:
            conn.close()


KINDS = (
    "LOAD DATA",
    "XA START",
    "XA END",
    "XA PREPARE",
    "XA COMMIT",
    "XA ROLLBACK",
    "XA RECOVER",
    "INSERT",
    "SELECT",
    "UPDATE",
    "DELETE",
    "REPLACE",
    "CREATE",
    "DROP",
    "SET",
    "COMMIT",
    "START TRANSACTION",
    "BEGIN",
    "ROLLBACK",
    "SHOW",
)


def statement_kind(text: str) -> str:
    head = " ".join(text.split()[:3]).upper()
    for kind in KINDS:
        if head.startswith(kind):
            return kind
    return head.split(" ")[0] if head else "(empty)"


def slow_entries(text: str) -> Iterator[tuple[str, str, float, str]]:
    """(user, thread id, Query_time, statement) of every entry of a slow log."""
    user = thread = ""
    seconds = 0.0
    statement: list[str] | None = None
    for line in [*text.splitlines(), "# User@Host: [end]"]:
        if line.startswith("# User@Host: "):
            if statement is not None:
                yield user, thread, seconds, "\n".join(statement)
            user, statement = line[len("# User@Host: ") :].split("[", 1)[0].strip(), None
        elif line.startswith("# Thread_id: "):
            thread = line.split()[2]
        elif line.startswith("# Query_time: "):
            seconds = float(line.split()[2])
        elif line.startswith("SET timestamp="):
            statement = []
        elif statement is not None and not line.startswith("# Time: "):
            statement.append(line)


def slow_log_profile(text: str, user: str) -> dict[str, Any]:
    """Per kind of statement of ``user``'s sessions: count and the server's seconds
    (Query_time); per session its statements' total and its LOAD DATA's."""
    kinds: dict[str, dict[str, float]] = {}
    sessions: dict[str, dict[str, float]] = {}
    for who, thread, seconds, text_ in slow_entries(text):
        if who != user:
            continue
        kind = statement_kind(text_)
        slot = kinds.setdefault(kind, {"count": 0, "seconds": 0.0})
        slot["count"] += 1
        slot["seconds"] += seconds
        session = sessions.setdefault(thread, {"statements": 0, "seconds": 0.0})
        session["statements"] += 1
        session["seconds"] += seconds
        if kind in ("LOAD DATA", "INSERT"):
            session[kind] = session.get(kind, 0.0) + seconds
    return {
        "by_kind": {
            k: {"count": int(v["count"]), "seconds": round(v["seconds"], 3)}
            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["seconds"])
        },
        "sessions": len(sessions),
        "statements": sum(int(s["statements"]) for s in sessions.values()),
        "busiest_sessions": sorted(
            ({k: round(v, 3) for k, v in s.items()} for s in sessions.values()),
            key=lambda s: -s["seconds"],
        )[:4],
    }


def start_server(base: Path) -> tuple[Generator[MariaServer, None, None], Server]:
    """tests/fix_mariadb's server, restarted with a buffer pool and a redo log sized for a
    benchmark (the tests' 64 MB / 16 MB would measure checkpoints)."""
    servers = _own_server(base)
    server = next(servers)
    assert server.process is not None
    _stop(server.process)
    args = [a for a in server.args if not a.startswith(tuple(f"--{k}=" for k in SERVER_SETTINGS))]
    server.args = [*args, *(f"--{k}={v}" for k, v in SERVER_SETTINGS.items())]
    server.process = _start(server.args, server)
    return servers, Server(server)


def start_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import sqlsink

    jars = [str(j) for j in (MARIADB_JAR, POSTGRES_JAR) if j.is_file()]
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlsink-bench-mariadb")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.jars", ",".join(jars))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sqlsink.register(spark)
    spark.dataSource.register(drain_source())
    return spark


def jdbc_each_batch(server: MariaServer, batchsize: int) -> Callable[[Any, int], None]:
    user, password = server.sink
    # jdbc:mysql: so that Spark picks its MySQL dialect (backquoted names; with jdbc:mariadb:
    # it quotes with '"', a syntax error for MariaDB); Connector/J 2.x takes either scheme
    options = {
        "url": f"jdbc:mysql://{server.host}:{server.port}/sqlsink_test"
        "?rewriteBatchedStatements=true",
        "dbtable": TABLE,
        "driver": "org.mariadb.jdbc.Driver",
        "user": user,
        "password": password,
        "batchsize": str(batchsize),
    }

    def each_batch(frame: Any, batch_id: int) -> None:
        frame.write.format("jdbc").mode("append").options(**options).save()

    return each_batch


def hand_upsert(server: MariaServer, table: str, page: int) -> Callable[[Any, int], None]:
    """The foreachBatch function a data engineer writes. Everything the executors run is
    inside it (pickled by value: this script is ``__main__``)."""
    user, password = server.sink
    where = {"host": server.host, "port": server.port}
    statement = (
        f"INSERT INTO `{table}` (id, ts, n, x, s) VALUES (%s, %s, %s, %s, %s) "
        "ON DUPLICATE KEY UPDATE ts = VALUES(ts), n = VALUES(n), x = VALUES(x), s = VALUES(s)"
    )

    def write_partition(rows: Any) -> None:
        import pymysql

        conn = pymysql.connect(
            user=user,
            password=password,
            database="sqlsink_test",
            charset="utf8mb4",
            autocommit=False,
            **where,
        )
        try:
            with conn.cursor() as cur:
                chunk: list[tuple[Any, ...]] = []
                for row in rows:
                    chunk.append(tuple(row))
                    if len(chunk) == page:
                        cur.executemany(statement, chunk)
                        chunk = []
                if chunk:
                    cur.executemany(statement, chunk)
            conn.commit()
        finally:
            conn.close()

    def each_batch(frame: Any, batch_id: int) -> None:
        frame.foreachPartition(write_partition)

    return each_batch


def batch_facts(progress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "batches": len(progress),
        "input_rows": sum(int(p.get("numInputRows", 0)) for p in progress),
        "duration_ms": [dict(p.get("durationMs", {})) for p in progress],
    }


class Bench:
    def __init__(
        self,
        args: argparse.Namespace,
        server: Server,
        spark: Any,
        data: Dataset,
        files: Files,
        work: Path,
    ) -> None:
        self.args, self.server, self.spark, self.data = args, server, spark, data
        self.files, self.work = files, work
        self.root: Any = None  # a root session while profiling (the slow log)
        table = pq.read_table(data.path, columns=["n"])
        self.sum_n = int(pc.sum(table["n"]).as_py())

    def timed(
        self, prefill: bool, run: Callable[[], dict[str, Any]], checked: bool = True
    ) -> dict[str, Any]:
        self.server.reset()
        if prefill:
            self.server.load_pymysql(self.files.prefill)
        load_before = os.getloadavg()[0]
        cpu_before = self.server.cpu_s()
        if self.root is not None:
            self.slow_log(True)
        with CpuMeter() as meter:
            began = time.perf_counter()
            facts = run()
            seconds = time.perf_counter() - began
        if self.root is not None:
            self.slow_log(False)
        mariadbd = self.server.cpu_s() - cpu_before
        if checked:
            self.server.check(self.data.rows, self.data.first, self.sum_n)
        branches = self.server.prepared_branches()
        if branches:
            raise AssertionError(f"prepared XA branches left after the run: {branches}")
        split = dict(meter.split or {})
        split["mariadbd"] = round(mariadbd, 2)
        split["other_children"] = round(split.get("other_children", 0.0) - mariadbd, 2)
        return {"seconds": seconds, "cpu_s": split, "load_1m_before": load_before, **facts}

    def streamed(
        self, target: Sink | Callable[[Any, int], None], name: str, data: Dataset | None = None
    ) -> dict[str, Any]:
        frame = read_stream(self.spark, (data or self.data).path)
        if isinstance(target, Sink):
            run = run_available_now(frame, target, self.work / "checkpoints")
        else:
            run = run_foreach_batch_available_now(frame, target, self.work / "checkpoints", name)
        return batch_facts(run.progress)

    def methods(self) -> dict[str, tuple[str, Callable[[], dict[str, Any]]]]:
        srv, url = self.server, self.server.url
        sink_append = Sink.sqlsink(url, TABLE, "exactly_once")
        sink_upsert = Sink.sqlsink(url, TABLE, "exactly_once", mode="upsert")
        jdbc = jdbc_each_batch(srv.server, self.args.jdbc_batch)
        hand = hand_upsert(srv.server, TABLE, HAND_PAGE)

        def client() -> dict[str, Any]:
            srv.load_client(self.files.rows)
            return {}

        def two_clients() -> dict[str, Any]:
            srv.load_client(*self.files.halves)
            return {}

        def pymysql_load() -> dict[str, Any]:
            srv.load_pymysql(self.files.rows)
            return {}

        out: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
            FLOOR_CLIENT: ("floor", lambda: self.timed(False, client)),
            FLOOR_PYMYSQL: ("floor", lambda: self.timed(False, pymysql_load)),
            TWO_CLIENTS: ("floor", lambda: self.timed(False, two_clients)),
            SINK_APPEND: (
                "append",
                lambda: self.timed(False, lambda: self.streamed(sink_append, "sink")),
            ),
        }
        if MARIADB_JAR.is_file():
            out[JDBC] = ("append", lambda: self.timed(False, lambda: self.streamed(jdbc, "jdbc")))
        out[NOOP] = (
            "spark",
            lambda: self.timed(False, lambda: self.streamed(Sink.noop(), "noop"), checked=False),
        )
        out[DRAIN] = (
            "spark",
            lambda: self.timed(
                False, lambda: self.streamed(Sink("bench_drain", {}), "drain"), checked=False
            ),
        )
        out[SINK_UPSERT] = (
            "upsert",
            lambda: self.timed(True, lambda: self.streamed(sink_upsert, "sink-upsert")),
        )
        out[HAND_UPSERT] = (
            "upsert",
            lambda: self.timed(True, lambda: self.streamed(hand, "hand-upsert")),
        )
        return {name: m for name, m in out.items() if m[0] in self.args.only}

    def warm_up(self, data: Dataset) -> None:
        """One small run of every Spark method: Python workers, the JIT, the JDBC driver."""
        say(f"warm-up on {data.rows:,} rows")
        targets: list[Sink | Callable[[Any, int], None]] = [
            Sink.noop(),
            Sink("bench_drain", {}),
            Sink.sqlsink(self.server.url, TABLE, "exactly_once"),
        ]
        if MARIADB_JAR.is_file():
            targets.append(jdbc_each_batch(self.server.server, self.args.jdbc_batch))
        targets.append(hand_upsert(self.server.server, TABLE, HAND_PAGE))
        for target in targets:
            self.server.reset()
            self.streamed(target, "warm", data)

    def slow_log(self, on: bool) -> None:
        """Every statement into the slow log (a fresh file) from now, or no more."""
        assert self.root is not None
        with self.root.cursor() as cur:
            cur.execute("SET GLOBAL slow_query_log = OFF")
            if on:
                (self.work / "slow.log").unlink(missing_ok=True)
                cur.execute("SET GLOBAL slow_query_log_file = %s", (str(self.work / "slow.log"),))
                cur.execute("SET GLOBAL long_query_time = 0")
                cur.execute("FLUSH SLOW LOGS")
                cur.execute("SET GLOBAL slow_query_log = ON")

    def profile(
        self, methods: dict[str, tuple[str, Callable[[], dict[str, Any]]]]
    ) -> dict[str, Any]:
        """One more run of each writer with every statement it sends in the slow log
        (``long_query_time = 0``, on from just before the run to just after it): the
        server's time per kind of statement, the sessions. Not in the medians."""
        self.root = self.server.server.connect(root=True)
        out: dict[str, Any] = {}
        try:
            for name, (kind, run) in methods.items():
                if kind == "spark":
                    continue
                say(f"profile: {name}")
                try:
                    got = run()
                except Exception as exc:
                    out[name] = {"error": describe(exc)}
                    continue
                log = self.work / "slow.log"
                text = log.read_text(errors="replace") if log.exists() else ""
                out[name] = {
                    "seconds": round(got["seconds"], 3),
                    "duration_ms": got.get("duration_ms"),
                    **slow_log_profile(text, self.server.server.sink[0]),
                }
        finally:
            self.slow_log(False)
            self.root.close()
            self.root = None
        return out

    def run(self) -> dict[str, Any]:
        methods = self.methods()
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
        errors: dict[str, str] = {}
        for round_number in range(1, self.args.repeat + 1):
            for name, (_, run) in methods.items():
                if name in errors and name == SINK_UPSERT:
                    continue  # refused once: not retried every round
                say(f"{name} (round {round_number}/{self.args.repeat})")
                try:
                    got = run()
                except Exception as exc:  # recorded and shown: not a number
                    errors[name] = describe(exc)
                    say(f"  failed: {errors[name][:400]}")
                    continue
                runs[name].append(got)
                say(f"  {got['seconds']:.2f} s, {self.data.rows / got['seconds']:,.0f} rows/s")
        results = []
        for name, found in runs.items():
            if not found:
                continue
            seconds = [r["seconds"] for r in found]
            groups = sorted({g for r in found for g in r["cpu_s"]})
            results.append(
                {
                    "method": name,
                    "kind": methods[name][0],
                    "seconds": spread(seconds),
                    "rows_per_s": self.data.rows / statistics.median(seconds),
                    "cpu_s_per_m_rows": {
                        g: round(
                            statistics.median(r["cpu_s"].get(g, 0.0) for r in found)
                            * 1e6
                            / self.data.rows,
                            3,
                        )
                        for g in groups
                    },
                    "runs": found,
                }
            )
        live = {k: v for k, v in methods.items() if not (k == SINK_UPSERT and k in errors)}
        profile: dict[str, Any] = {}
        if self.args.profile:
            try:
                profile = self.profile(live)
            except Exception as exc:  # the medians are kept; the profile says what failed
                profile = {"error": describe(exc)}
                say(f"profile failed: {profile['error'][:400]}")
        return {"methods": results, "errors": errors, "ratios": ratios(results), "profile": profile}


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 4000 else text[:4000] + " ..."


def spread(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "runs": values,
    }


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """sqlsink's rows/s over each peer's (higher = sqlsink faster): against the faster
    floor (target >= 0.6), against the JDBC writer (>= 1.5), the upserts (>= 2)."""
    rate = {r["method"]: r["rows_per_s"] for r in results}
    out: dict[str, float] = {}
    floors = [m for m in (FLOOR_CLIENT, FLOOR_PYMYSQL) if m in rate]
    if SINK_APPEND in rate:
        for floor in floors:
            out[f"sink append / {floor}"] = rate[SINK_APPEND] / rate[floor]
        if floors:
            out["sink append / the floor (the faster LOAD DATA)"] = rate[SINK_APPEND] / max(
                rate[f] for f in floors
            )
        if TWO_CLIENTS in rate:
            out["sink append / 2 LOAD DATA processes at once"] = (
                rate[SINK_APPEND] / rate[TWO_CLIENTS]
            )
        if JDBC in rate:
            out["sink append / Spark JDBC"] = rate[SINK_APPEND] / rate[JDBC]
        for floor in (NOOP, DRAIN):
            if floor in rate:
                out[f"sink append / {floor.split(':')[0]}"] = rate[SINK_APPEND] / rate[floor]
    if SINK_UPSERT in rate and HAND_UPSERT in rate:
        out["sink upsert / hand-written upsert"] = rate[SINK_UPSERT] / rate[HAND_UPSERT]
    return {k: round(v, 3) for k, v in out.items()}


def facts(server: Server, spark: Any) -> dict[str, Any]:
    version = server.sql("SELECT VERSION()")[0][0]
    settings = dict(
        server.sql(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('innodb_buffer_pool_size', "
            "'innodb_log_file_size', 'innodb_flush_log_at_trx_commit', 'sync_binlog', "
            "'log_bin', 'binlog_format', 'max_allowed_packet')"
        )
    )
    import pymysql

    spark_facts: dict[str, Any] = {"spark": None}
    if spark is not None:
        jvm = spark.sparkContext._jvm
        spark_facts = {
            "spark": spark.version,
            "java": str(jvm.System.getProperty("java.version")),
            "master": spark.sparkContext.master,
        }
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mariadb": version,
        "mariadb_settings": settings,
        **spark_facts,
        "connector_j": MARIADB_JAR.resolve().name if MARIADB_JAR.is_file() else None,
        "pymysql": pymysql.__version__,
        "pyarrow": pa.__version__,
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_start": os.getloadavg(),
    }


def table(results: dict[str, Any], rows: int) -> str:
    """The results as a Markdown table."""
    lines = [
        "| method | s, median (min–max) | rows/s | CPU-s per M rows: mariadbd / JVM / "
        "Python workers / driver+clients / machine |",
        "|---|---|---:|---|",
    ]
    for r in results["methods"]:
        s, c = r["seconds"], r["cpu_s_per_m_rows"]
        workers = c.get("python_workers", 0) + c.get("python_workers_reaped", 0)
        driver = c.get("driver", 0) + c.get("reaped_children", 0)
        lines.append(
            f"| {r['method']} | {s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f}) | "
            f"{rows / s['median']:,.0f} | {c.get('mariadbd', 0):.2f} / {c.get('jvm', 0):.2f} / "
            f"{workers:.2f} / {driver:.2f} / {c.get('machine_total', 0):.2f} |"
        )
    lines.append("")
    for name, value in results["ratios"].items():
        lines.append(f"- {name}: {value:.2f}")
    for name, error in results["errors"].items():
        lines.append(f"- {name}: FAILED: {error[:300]}")
    return "\n".join(lines)


def plot(results: dict[str, Any], rows: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    names = [m["method"] for m in methods]
    rates = [m["rows_per_s"] for m in methods]
    colours = {"floor": "#888888", "append": "#1f77b4", "spark": "#bbbbbb", "upsert": "#ff7f0e"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    y = list(range(len(names)))[::-1]
    left.barh(y, rates, color=[colours[m["kind"]] for m in methods])
    for yy, m in zip(y, methods, strict=True):
        s = m["seconds"]
        left.errorbar(
            rows / s["median"],
            yy,
            xerr=[[rows / s["median"] - rows / s["max"]], [rows / s["min"] - rows / s["median"]]],
            color="black",
            capsize=3,
        )
    left.set_yticks(y, [n.replace(" (", "\n(", 1) for n in names], fontsize=7)
    left.set_xlabel("rows/s (median, min–max)")
    left.set_title(f"MariaDB, {rows:,} rows, one run")
    groups = ("mariadbd", "jvm", "python_workers", "driver", "rest")
    bottom = [0.0] * len(methods)
    for group in groups:
        values = []
        for m in methods:
            c = m["cpu_s_per_m_rows"]
            if group == "python_workers":
                values.append(c.get(group, 0) + c.get("python_workers_reaped", 0))
            elif group == "driver":
                values.append(c.get(group, 0) + c.get("reaped_children", 0))
            else:
                values.append(c.get(group, 0))
        right.barh(y, values, left=bottom, label=group)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_yticks(y, ["" for _ in names])
    right.set_xlabel("CPU-seconds per million rows (median run)")
    right.set_title("where the CPU went")
    right.legend(fontsize=8)
    text = "; ".join(f"{k}: {v:.2f}" for k, v in results["ratios"].items())
    fig.text(0.01, 0.01, text, fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jdbc-batch", type=int, default=10_000)
    parser.add_argument("--warm-rows", type=int, default=20_000)
    parser.add_argument("--out", type=Path, help="the JSON (and beside it the plot, .png)")
    parser.add_argument(
        "--only",
        type=lambda text: set(text.split(",")),
        default={"floor", "append", "spark", "upsert"},
        help="the kinds of method to run, comma-separated: floor (LOAD DATA), append (the "
        "sink, the JDBC writer), spark (noop, drain), upsert (the sink's, the hand-written)",
    )
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="skip the extra runs with every statement in the slow log",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data_root = HERE / "work" / "data"
    data = ensure_dataset(data_root, "mariadb", FIRST_ID, args.rows, args.files)
    warm = ensure_dataset(data_root, "mariadb-warm", WARM_FIRST_ID, args.warm_rows, 2)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-mariadb-peers-") as base:
        work = Path(base)
        servers, server = start_server(work / "server")
        spark = None
        try:
            files = write_files(data, work)
            say(f"{args.rows:,} rows encoded for LOAD DATA in {files.encode_s:.2f} s (not timed)")
            if args.only - {"floor"}:
                spark = start_session()
            about = facts(server, spark)
            bench = Bench(args, server, spark, data, files, work)
            if spark is not None:
                frame = spark.read.parquet(str(data.path))
                about["spark_partitions"] = frame.rdd.getNumPartitions()
                bench.warm_up(warm)
            results = bench.run()
        finally:
            if spark is not None:
                spark.stop()
            servers.close()
            shutil.rmtree(work / "checkpoints", ignore_errors=True)
    about["load_average_end"] = os.getloadavg()
    about["took_s"] = round(time.perf_counter() - began, 1)
    out = {
        "rows": args.rows,
        "files": args.files,
        "repeat": args.repeat,
        "jdbc_batchsize": args.jdbc_batch,
        "hand_upsert_page": HAND_PAGE,
        "encode_s": files.encode_s,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": about,
        **results,
    }
    print(table(results, args.rows))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
        if not args.no_plot:
            plot(results, args.rows, args.out.with_suffix(".png"))
    return 1 if not results["methods"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(2)
