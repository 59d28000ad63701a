"""A replayable source of numbered records (JSON files, one per batch) and query helpers."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

SCHEMA = "id BIGINT, payload STRING, ts TIMESTAMP, amount DOUBLE"


def local_session(app: str, master: str = "local[2]", **conf: str) -> Any:
    """A local SparkSession as the tests use it, logging at ERROR, sqlsink registered where
    this PySpark has the data source API (4.1 and later; tests/spark_lines runs older lines).

    Its Python workers run this interpreter (the venv with pyarrow and psycopg):
    PYSPARK_PYTHON is set before the JVM starts. ``conf`` adds Spark settings.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import sqlsink

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from sqlsink.spark.support import DATA_SOURCE, parse_version

    if parse_version(spark.version) >= DATA_SOURCE:
        sqlsink.register(spark)
    return spark


def write_source(directory: Path, batches: Sequence[Iterable[int]]) -> None:
    """One file per batch; with maxFilesPerTrigger=1 each file is one micro-batch."""
    directory.mkdir(parents=True, exist_ok=True)
    for number, ids in enumerate(batches):
        lines = [
            json.dumps(
                {
                    "id": i,
                    "payload": f"record {i} ✓",
                    "ts": f"2026-01-01T00:00:{i % 60:02d}Z",
                    "amount": i / 4,
                }
            )
            for i in ids
        ]
        path = directory / f"part-{number:05d}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        _in_order(tmp, number)
        tmp.rename(path)


def write_records(directory: Path, batches: Sequence[Sequence[dict[str, Any]]]) -> None:
    """Explicit records, one file per batch, in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    for number, records in enumerate(batches):
        path = directory / f"part-{number:05d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        _in_order(path, number)


def _in_order(path: Path, number: int) -> None:
    """Spark's file source takes files in modification-time order, and files written in
    one go may share a (coarse) timestamp: give file N a later one than file N-1."""
    stamp = time.time_ns() + number * 1_000_000
    os.utime(path, ns=(stamp, stamp))


def start_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    options: dict[str, str],
    partitions: int | None = 2,
    schema: str = SCHEMA,
) -> Any:
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(source))
    if partitions:  # round-robin: a replay may regroup rows (invariant 7)
        events = events.repartition(partitions)
    writer = events.writeStream.format("sqlsink").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.trigger(availableNow=True).start()


def run_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    options: dict[str, str],
    partitions: int | None = 2,
    schema: str = SCHEMA,
) -> None:
    """Run until the source is drained; raise the query's error if it failed."""
    query = start_query(spark, source, checkpoint, options, partitions, schema)
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()


def run_foreach_batch(
    spark: Any, source: Path, checkpoint: Path, function: Any, partitions: int | None = None
) -> Any:
    """The source's files, one a batch, through ``foreachBatch(function)`` until drained
    (``repartition(partitions)`` first when given); raise the query's error if it failed,
    else return the query."""
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    if partitions:
        events = events.repartition(partitions)
    query = (
        events.writeStream.foreachBatch(function)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()
    return query


def keyed_table(url: str, table: str) -> None:
    """A table of SCHEMA's columns with ``id`` its primary key."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, payload text, ts timestamptz, "
                "amount float8)"
            ).format(sql.Identifier(table))
        )


def table_ids(url: str, table: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
        return [int(str(r[0])) for r in rows]


COMPLETE = "completed_at IS NOT NULL"


def commit_log(url: str, sink_id: str, *columns: str) -> dict[int, tuple[Any, ...]]:
    """batch -> the given columns (SQL expressions of ``sqlsink.decisions``) of its decision."""
    query = sql.SQL(
        "SELECT batch_id, {} FROM sqlsink.decisions WHERE sink_id = %s ORDER BY batch_id"
    ).format(sql.SQL(", ").join(map(sql.SQL, columns)))
    with psycopg.connect(url) as conn:
        rows = conn.execute(query, (sink_id,)).fetchall()
    return {int(row[0]): tuple(row[1:]) for row in rows}


def decided_batches(url: str, sink_id: str) -> dict[int, bool]:
    """batch -> complete, from the commit log."""
    return {batch: bool(row[0]) for batch, row in commit_log(url, sink_id, COMPLETE).items()}


def query_id(checkpoint: Path) -> str:
    return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])


# -- for tests/spark/test_soak.py and test_secrets.py: one more file, processes, sessions --


def add_source_file(directory: Path, number: int, ids: Iterable[int]) -> None:
    """File ``number`` of a source (as ``write_source`` writes them), appearing at once."""
    staging = directory.parent / f".staging-{directory.name}-{number}"
    write_source(staging, [ids])
    directory.mkdir(parents=True, exist_ok=True)
    (staging / "part-00000.json").rename(directory / f"part-{number:05d}.json")
    staging.rmdir()


def _parent_pids() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def python_workers(jvm_pid: int) -> dict[int, str]:
    """Spark's Python worker processes (daemons and their forks) under a JVM: pid -> cmdline."""
    parents = _parent_pids()
    found: dict[int, str] = {}
    frontier = {jvm_pid}
    while frontier:
        children = {p for p, parent in parents.items() if parent in frontier}
        frontier = set()
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
                found[pid] = cmdline.strip()
            frontier.add(pid)
    return found


MONITOR = "tests activity monitor"  # the application_name of ActivityMonitor's sessions
_ACTIVITY = """
SELECT application_name, query,
       CASE WHEN application_name = 'sqlsink idle' THEN 'idle'
            WHEN application_name LIKE 'sqlsink%%' THEN 'sink' ELSE 'other' END
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND application_name <> %s
"""


class ActivityMonitor:
    """Samples the test database's sessions and prepared transactions in the background.

    Everything seen (application names, statements, gids) is kept for greps; ``peak()``
    gives the most sink sessions (application_name 'sqlsink...') and most other sessions
    seen since the last call. Its own sessions are named ``MONITOR`` and never counted.
    Sessions the sink keeps between batches (``sqlsink idle``, sqlsink/postgres/sessions.py)
    are neither: ``idle`` is how many the last sample saw.
    """

    def __init__(self, url: str, interval: float = 0.05) -> None:
        self.url = url
        self.interval = interval
        self.application_names: set[str] = set()
        self.statements: set[str] = set()
        self.gids: set[str] = set()
        self.samples = 0
        self.idle = 0  # kept sessions in the last sample
        self._peak = (0, 0)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="activity-monitor", daemon=True)

    def __enter__(self) -> ActivityMonitor:
        self._conn = psycopg.connect(self.url, autocommit=True, application_name=MONITOR)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._conn.close()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name=MONITOR) as conn:
            while not self._stop.is_set():
                self._sample(conn)
                self._stop.wait(self.interval)

    def _sample(self, conn: psycopg.Connection[tuple[Any, ...]]) -> tuple[int, int]:
        sessions = conn.execute(_ACTIVITY, (MONITOR,)).fetchall()
        gids = [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
        sink = sum(1 for _, _, kind in sessions if kind == "sink")
        idle = sum(1 for _, _, kind in sessions if kind == "idle")
        with self._lock:
            self.samples += 1
            self.idle = idle
            self.application_names.update(str(name) for name, _, _ in sessions)
            self.statements.update(str(query) for _, query, _ in sessions)
            self.gids.update(gids)
            other = len(sessions) - sink - idle
            self._peak = (max(self._peak[0], sink), max(self._peak[1], other))
        return sink, other

    def now(self) -> tuple[int, int]:
        """(sink sessions, other sessions) of the test database at this moment."""
        with self._lock:  # psycopg connections are not for two threads at once
            return self._sample(self._conn)

    def peak(self) -> tuple[int, int]:
        """(most sink sessions, most other sessions) seen since the last call."""
        with self._lock:
            peak, self._peak = self._peak, (0, 0)
        return peak

    def settle(self, others: int, timeout: float = 5.0) -> tuple[int, int, float]:
        """Wait until no sink session is left and ``others`` other sessions remain (a
        closed session's server process needs a moment to leave pg_stat_activity);
        (sink sessions, other sessions, seconds waited) at the end."""
        start = time.monotonic()
        while True:
            sink, other = self.now()
            waited = time.monotonic() - start
            if (sink == 0 and other <= others) or waited > timeout:
                return sink, other, waited
            time.sleep(0.02)
