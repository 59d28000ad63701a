"""Issue 27's steady-state append, measured so that the machine's noise does not hide a change.

The workload: a table with a bigint primary key (bigint, timestamptz, int, double, 40-character
text); ``rows`` rows (2,000,000) generated once as 8 Parquet files of increasing keys under
``benchmarks/work/data``; ``spark.readStream.parquet(dir)`` with ``maxFilesPerTrigger = 2``
(4 batches, 2 partitions each, no shuffle) into ``format("sqlsink")``, ``exactly_once``,
append, ``trigger(availableNow=True)``, a fresh checkpoint, sink id and table per run. Beside
it, per round: one binary COPY of the same rows from one process (``throughput.copy_tuples``,
tuples built beforehand) and Spark's ``noop`` sink on the same streaming shape (Spark's
floor). The three run in a rotating order (sink copy noop, copy noop sink, ...).

The server is the benchmark's own (``run.py`` starts it with ``shared_buffers = 1GB``, see
SERVER_OVERRIDES; with ``--url`` it is whatever that server has: the figure is recorded).
While the measure runs, every statement is logged with its duration
(``log_min_duration_statement = 0``, ``log_line_prefix`` with ``%m`` and ``%p``, set by
``ALTER SYSTEM`` and reset after); the log gives, for any version of the package:

* the per-partition write time: from the start of the partition session's transaction (its
  ``BEGIN``; else its first statement after its previous transaction) to the end of its
  ``PREPARE TRANSACTION``; also as seconds per million rows;
* the sink's rate counted from the server: the rows of every batch after the first over the
  time from the first batch's last ``COMMIT PREPARED`` to the last batch's.

Per run also: CPU seconds per million rows of each process group (``cpu.CpuMeter``: the
driver's Python, Spark's JVM, its Python workers, reaped ones included, PostgreSQL, the rest
of the machine); where the driver's time goes per batch (Spark's ``durationMs`` per batch,
the commit log's ``commit_ms``, the gap between one batch's end and the next one's start);
and the ratios of the sink's rate to the same round's COPY and ``noop`` (the ``noop`` rate
counted the same way from Spark's batch ends). Per measure over the runs: median, min, max
and relative spread ((max - min) / median).
"""

from __future__ import annotations

import datetime
import itertools
import re
import statistics
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from batch_cost import count_statements, run_query, server_log, summarize
from copyload import reset
from cpu import REAPED_WORKERS, CpuMeter, postgres_s, watch_postgres
from psycopg import sql
from server import TABLE, check_rows
from streaming import Sink, read_stream, run_available_now
from throughput import copy_tuples
from workload import TABLE_DDL, Dataset, ensure_dataset, load_tuples

FIRST_ID = 6_000_000_000  # disjoint from run.py's other data sets
FILES = 8
FILES_PER_TRIGGER = 2
SHARED_BUFFERS = "1GB"
SERVER_OVERRIDES: dict[str, str | int] = {"shared_buffers": f"'{SHARED_BUFFERS}'"}
LOG_SETTINGS = {"log_min_duration_statement": "0", "log_line_prefix": "'%m [%p] app=%a: '"}
KINDS = ("sink", "copy", "noop")
LOG_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) (?P<tz>\S+) \[(?P<pid>\d+)\] app=.*?: "
    r"LOG:\s+duration: (?P<ms>[\d.]+) ms\s+(?:statement|parse|bind|execute)[^:]*: (?P<sql>.*)$"
)
COMMIT_PREPARED = re.compile(r"COMMIT PREPARED '([^']+)'", re.IGNORECASE)
PREPARE = re.compile(r"^\s*PREPARE TRANSACTION '([^']+)'", re.IGNORECASE)
BEGIN = re.compile(r"^\s*(BEGIN|START TRANSACTION)\b", re.IGNORECASE)
ENDS = re.compile(r"^\s*(COMMIT|ROLLBACK|END|ABORT)\s*(;|$)", re.IGNORECASE)
DRIVER_KEYS = (
    "triggerExecution",
    "addBatch",
    "latestOffset",
    "queryPlanning",
    "getBatch",
    "walCommit",
    "commitOffsets",
)


@dataclass(frozen=True)
class Statement:
    """One statement of the server's log: its session and when it ran (epoch seconds)."""

    pid: int
    start: float
    end: float
    text: str


def set_logging(url: str, settings: dict[str, str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)  # the postmaster signals its backends; new sessions read it at once


def reset_logging(url: str, names: Iterable[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            conn.execute(f"ALTER SYSTEM RESET {name}")
        conn.execute("SELECT pg_reload_conf()")


def read_log(log: Path, offset: int) -> list[Statement]:
    """The statements logged (with their duration) after ``offset``, in the log's order."""
    time.sleep(0.3)  # the last lines reach the file
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    out = []
    for line in text.splitlines():
        match = LOG_LINE.match(line)
        if match is None:
            continue
        end = datetime.datetime.strptime(match["ts"], "%Y-%m-%d %H:%M:%S.%f")
        end_s = end.replace(tzinfo=datetime.UTC).timestamp()  # the embedded server logs UTC
        if match["tz"] not in ("UTC", "GMT"):
            end_s = datetime.datetime.strptime(
                f"{match['ts']} {match['tz']}", "%Y-%m-%d %H:%M:%S.%f %Z"
            ).timestamp()
        start_s = end_s - float(match["ms"]) / 1000
        out.append(Statement(int(match["pid"]), start_s, end_s, match["sql"]))
    return out


def gid_batch_partition(gid: str, sink_id: str) -> tuple[int, int] | None:
    """(batch, partition) of a gid of this sink: ``sqlsink_<sink id>_<batch>_<partition>_...``"""
    prefix = f"sqlsink_{sink_id}_"
    if not gid.startswith(prefix):
        return None
    parts = gid[len(prefix) :].split("_")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def partition_writes(statements: list[Statement], sink_id: str) -> list[dict[str, Any]]:
    """Per PREPARE TRANSACTION of the sink: its batch, partition and ms from its transaction's
    start (its BEGIN, else the session's first statement after its last transaction) to the
    end of the PREPARE."""
    began: dict[int, float] = {}
    first_since: dict[int, float] = {}
    out = []
    for stmt in statements:
        first_since.setdefault(stmt.pid, stmt.start)
        prepared = PREPARE.match(stmt.text)
        if BEGIN.match(stmt.text):
            began[stmt.pid] = stmt.start
        elif prepared is not None:
            where = gid_batch_partition(prepared.group(1), sink_id)
            start = began.pop(stmt.pid, first_since[stmt.pid])
            del first_since[stmt.pid]
            if where is not None:
                batch, partition = where
                out.append(
                    {"batch": batch, "partition": partition, "ms": (stmt.end - start) * 1000}
                )
        elif ENDS.match(stmt.text):
            began.pop(stmt.pid, None)
            first_since.pop(stmt.pid, None)
    return out


def batch_commits(statements: list[Statement], sink_id: str) -> dict[int, float]:
    """Per batch of the sink: when its last COMMIT PREPARED ended (epoch seconds)."""
    out: dict[int, float] = {}
    for stmt in statements:
        for gid in COMMIT_PREPARED.findall(stmt.text):
            where = gid_batch_partition(gid, sink_id)
            if where is not None:
                out[where[0]] = max(stmt.end, out.get(where[0], stmt.end))
    return out


def progress_times(progress: list[dict[str, Any]]) -> list[tuple[int, float, float, int]]:
    """(batch, start, end, rows) per batch from Spark's progress (epoch seconds)."""
    out = []
    for p in sorted(progress, key=lambda p: int(p["batchId"])):
        start = datetime.datetime.fromisoformat(str(p["timestamp"]).replace("Z", "+00:00"))
        begun = start.timestamp()
        took = float(p["durationMs"].get("triggerExecution", 0)) / 1000
        out.append((int(p["batchId"]), begun, begun + took, int(p["numInputRows"])))
    return out


def rate_between(ends: dict[int, float], rows: dict[int, int]) -> float | None:
    """Rows of every batch after the first over the time from the first batch's end to the
    last one's."""
    batches = sorted(ends)
    if len(batches) < 2 or ends[batches[-1]] <= ends[batches[0]]:
        return None
    counted = sum(rows.get(b, 0) for b in batches[1:])
    return counted / (ends[batches[-1]] - ends[batches[0]])


def driver_split(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Median ms per batch after the first of each of Spark's durations, the first batch's
    triggerExecution, and the median gap from one batch's end to the next one's start."""
    ordered = sorted(progress, key=lambda p: int(p["batchId"]))
    steady = ordered[1:] or ordered
    out: dict[str, float] = {}
    keys = [k for k in DRIVER_KEYS if any(k in p["durationMs"] for p in ordered)]
    keys += sorted({k for p in ordered for k in p["durationMs"]} - set(keys))
    for key in keys:
        out[f"ms/batch: {key}"] = statistics.median(
            float(p["durationMs"].get(key, 0)) for p in steady
        )
    if ordered:
        out["first batch ms: triggerExecution"] = float(
            ordered[0]["durationMs"].get("triggerExecution", 0)
        )
    times = progress_times(ordered)
    gaps = [(b[1] - a[2]) * 1000 for a, b in itertools.pairwise(times)]
    if gaps:
        out["ms/batch: gap between batches"] = statistics.median(gaps)
    return out


def cpu_per_million(split: dict[str, float], rows: int) -> dict[str, float]:
    """CPU seconds per million rows of each process group (Python workers: live + reaped)."""
    groups = dict(split)
    groups["python_workers"] = groups.get("python_workers", 0.0) + groups.pop(REAPED_WORKERS, 0.0)
    return {f"cpu s/Mrow: {group}": seconds / rows * 1e6 for group, seconds in groups.items()}


def prepared_left(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
    return int(row[0]) if row else 0


def roll_back_left(url: str) -> list[str]:
    """Roll back the prepared transactions left in this database (gids returned). The guard
    stops a query with a 100 ms trigger, so a batch can be cancelled midway; an older
    package leaves that batch's prepared transactions for its next run to resolve, and
    their locks would hold the next measure's ``DROP TABLE`` for good."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
        for (gid,) in rows:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    return [str(gid) for (gid,) in rows]


def imported_from(spark: Any) -> dict[str, str]:
    """Which sqlsink the driver and a Python worker of a task imported (``__file__``)."""
    import sqlsink

    worker = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: __import__("sqlsink").__file__)
        .collect()[0]
    )
    return {"driver": str(Path(sqlsink.__file__).resolve()), "worker": str(Path(worker).resolve())}


class Steady:
    """One measure: the data set, the server's log, and the runs so far."""

    def __init__(self, spark: Any, url: str, data: Dataset, checkpoints: Path) -> None:
        self.spark, self.url, self.data, self.checkpoints = spark, url, data, checkpoints
        log = server_log(url)
        if log is None:
            raise RuntimeError("the server's log file is not readable here: the measure needs it")
        self.log = log
        self.tuples = load_tuples(data)  # once, not timed: the COPY's input

    def sink(self) -> dict[str, Any]:
        reset(self.url, TABLE, TABLE_DDL)
        sink_id = f"steady-{uuid.uuid4().hex[:12]}"
        options = {"url": self.url, "table": TABLE, "semantic": "exactly_once", "mode": "append"}
        sink = Sink("sqlsink", {**options, "sinkId": sink_id})
        frame = read_stream(self.spark, self.data.path, files_per_trigger=FILES_PER_TRIGGER)
        offset = self.log.stat().st_size
        with CpuMeter() as cpu:
            started = time.perf_counter()
            run = run_available_now(frame, sink, self.checkpoints)
            wall = time.perf_counter() - started
        statements = read_log(self.log, offset)
        check_rows(self.url, self.data.rows, "steady: sqlsink exactly_once")
        left = prepared_left(self.url)
        if left:
            raise RuntimeError(f"steady: {left} prepared transaction(s) left after the run")
        times = progress_times(run.progress)
        rows = {batch: count for batch, _, _, count in times}
        writes = partition_writes(statements, sink_id)
        if not writes:
            raise RuntimeError(f"steady: no PREPARE TRANSACTION of sink {sink_id} in the log")
        commits = batch_commits(statements, sink_id)
        with psycopg.connect(self.url) as conn:
            found = conn.execute(
                "SELECT commit_ms FROM sqlsink.decisions WHERE sink_id = %s ORDER BY batch_id",
                (sink_id,),
            ).fetchall()
        commit_ms = [float(r[0]) for r in found if r[0] is not None]
        write_ms = [w["ms"] for w in writes]
        measures: dict[str, float] = {
            **cpu_per_million(cpu.split or {}, self.data.rows),
            "partition write ms: median": statistics.median(write_ms),
            "partition write s/Mrow": sum(write_ms) / 1000 / self.data.rows * 1e6,
            **driver_split(run.progress),
            "wall s: start to end": wall,
        }
        if commit_ms:
            steady_ms = commit_ms[1:] or commit_ms
            measures["ms/batch: commit log commit_ms"] = statistics.median(steady_ms)
        server_rate = rate_between(commits, rows)
        if server_rate is not None:
            measures["rows/s: server, first to last commit"] = server_rate
        spark_rate = rate_between({b: end for b, _, end, _ in times}, rows)
        if spark_rate is not None:
            measures["rows/s: Spark, first to last batch end"] = spark_rate
        return {
            "kind": "sink",
            "sink_id": sink_id,
            "batches": len(times),
            "partitions_per_batch": len(writes) / max(len({w["batch"] for w in writes}), 1),
            "rows_in_table": self.data.rows,  # check_rows passed: exactly these, distinct
            "prepared_left": left,
            "cpu_s": cpu.split,
            "partition_writes": writes,
            "commit_ms": commit_ms,
            "progress_ms": [dict(p["durationMs"]) for p in run.progress],
            "measures": measures,
        }

    def copy(self) -> dict[str, Any]:
        reset(self.url, TABLE, TABLE_DDL)
        offset = self.log.stat().st_size
        with CpuMeter() as cpu:
            started = time.perf_counter()
            copy_tuples(self.url, self.tuples)
            wall = time.perf_counter() - started
        statements = read_log(self.log, offset)
        check_rows(self.url, self.data.rows, "steady: binary COPY")
        copies = [s for s in statements if s.text.lstrip().upper().startswith("COPY")]
        measures = {
            **cpu_per_million(cpu.split or {}, self.data.rows),
            "rows/s: COPY, wall": self.data.rows / wall,
        }
        if copies:
            measures["COPY statement s/Mrow"] = (
                sum(s.end - s.start for s in copies) / self.data.rows * 1e6
            )
        return {"kind": "copy", "cpu_s": cpu.split, "wall_s": wall, "measures": measures}

    def noop(self) -> dict[str, Any]:
        frame = read_stream(self.spark, self.data.path, files_per_trigger=FILES_PER_TRIGGER)
        with CpuMeter() as cpu:
            started = time.perf_counter()
            run = run_available_now(frame, Sink.noop(), self.checkpoints)
            wall = time.perf_counter() - started
        times = progress_times(run.progress)
        rows = {batch: count for batch, _, _, count in times}
        if sum(rows.values()) != self.data.rows:
            raise RuntimeError(f"steady: noop read {sum(rows.values())} of {self.data.rows} rows")
        measures = {
            **cpu_per_million(cpu.split or {}, self.data.rows),
            **driver_split(run.progress),
            "wall s: start to end": wall,
        }
        rate = rate_between({b: end for b, _, end, _ in times}, rows)
        if rate is not None:
            measures["rows/s: Spark, first to last batch end"] = rate
        return {"kind": "noop", "batches": len(times), "cpu_s": cpu.split, "measures": measures}


def round_ratios(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The sink's rate over the same round's COPY and noop."""
    sink = runs.get("sink", {}).get("measures", {})
    copy = runs.get("copy", {}).get("measures", {})
    noop = runs.get("noop", {}).get("measures", {})
    out = {}
    server = sink.get("rows/s: server, first to last commit")
    if server and copy.get("rows/s: COPY, wall"):
        out["sink (server) / COPY"] = server / copy["rows/s: COPY, wall"]
    spark_sink = sink.get("rows/s: Spark, first to last batch end")
    spark_noop = noop.get("rows/s: Spark, first to last batch end")
    if spark_noop and server:
        out["sink (server) / noop"] = server / spark_noop
    if spark_noop and spark_sink:
        out["sink (Spark) / noop"] = spark_sink / spark_noop
    return out


def spread(values: list[float]) -> dict[str, Any]:
    median = statistics.median(values)
    low, high = min(values), max(values)
    return {
        "n": len(values),
        "median": median,
        "min": low,
        "max": high,
        "spread": (high - low) / median if median else None,
        "values": values,
    }


def summarize_runs(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind (sink, copy, noop, ratio), per measure: median, min, max, relative spread."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for one in rounds:
        for kind, run in one["runs"].items():
            for name, value in run["measures"].items():
                pooled.setdefault(kind, {}).setdefault(name, []).append(float(value))
        for name, value in one["ratios"].items():
            pooled.setdefault("ratio", {}).setdefault(name, []).append(float(value))
    return {
        kind: {name: spread(values) for name, values in sorted(figures.items())}
        for kind, figures in pooled.items()
    }


def measure_steady(
    spark: Any,
    url: str,
    data_root: Path,
    checkpoints: Path,
    rows: int,
    repeat: int,
    attempt: Callable[[str, Callable[[], Any]], Any],
    warmup: int = 0,
) -> dict[str, Any]:
    """``warmup`` rounds first, not counted: a fresh JVM's CPU per row of the sink falls
    over its first full-size runs (the JIT): 1.99, 1.42, 1.58, 1.05, 1.03 s per million rows
    in one run of 2026-11-26 (the third on a busy machine), level from the fourth on."""
    data = ensure_dataset(data_root, "steady", FIRST_ID, rows, FILES)
    imported = imported_from(spark)
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW shared_buffers").fetchone()
        shared_buffers = str(row[0]) if row else None
        row = conn.execute("SHOW data_directory").fetchone()
    pid_file = Path(str(row[0])) / "postmaster.pid" if row else None
    if postgres_s() is None and pid_file is not None and pid_file.is_file():
        # a server on this machine run.py did not start (compare.py's): its CPU is read too
        watch_postgres(int(pid_file.read_text().split()[0]))
    steady = Steady(spark, url, data, checkpoints)
    set_logging(url, LOG_SETTINGS)
    rounds: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    try:
        for number in range(warmup):
            for kind in KINDS:
                name = f"steady: {kind} (warm-up {number + 1}/{warmup})"
                got = attempt(name, getattr(steady, kind))
                if got is not None:
                    warm.append({"round": number + 1, "kind": kind, "measures": got["measures"]})
        for number in range(repeat):
            order = KINDS[number % 3 :] + KINDS[: number % 3]
            runs: dict[str, dict[str, Any]] = {}
            for kind in order:
                got = attempt(
                    f"steady: {kind} (round {number + 1}/{repeat})", getattr(steady, kind)
                )
                if got is not None:
                    runs[kind] = got
            rounds.append({"round": number + 1, "order": list(order), "runs": runs})
            rounds[-1]["ratios"] = round_ratios(runs)
    finally:
        reset_logging(url, LOG_SETTINGS)
    return {
        "rows": rows,
        "files": FILES,
        "files_per_trigger": FILES_PER_TRIGGER,
        "table": TABLE,
        "shared_buffers": shared_buffers,
        "warmup_rounds": warmup,
        "warmup": warm,
        "sqlsink_imported": imported,
        "summary": summarize_runs(rounds),
        "rounds": rounds,
    }


def measure_guard_cost(
    spark: Any,
    url: str,
    checkpoints: Path,
    batches: int,
    warmup: int,
    counted_batches: int,
    attempt: Callable[[str, Callable[[], Any]], Any],
) -> dict[str, Any]:
    """The per-batch cost (``batch_cost``) cut to a guard's size: ``exactly_once`` through
    ``format("sqlsink")`` only (no foreachBatch writer: older packages have none), one query
    of ``warmup`` + ``batches`` 10-row batches, then the statements and connections per batch
    of ``counted_batches`` more. The same JSON shape as ``batch_cost``."""
    imported = imported_from(spark)
    got = attempt(
        "guard cost: exactly_once",
        lambda: run_query(spark, url, "exactly_once", batches, warmup, checkpoints),
    )
    figures = {k: summarize(v) for k, v in (got or {}).items() if isinstance(v, list)}
    left = roll_back_left(url)
    result: dict[str, Any] = {
        "rows_per_batch": 10,
        "sinks": {"exactly_once": figures},
        "sqlsink_imported": imported,
        "rolled_back_after_stop": left,
    }
    counted = attempt(
        "guard cost: statements per batch (log_statement = all)",
        lambda: count_statements(spark, url, counted_batches, checkpoints),
    )
    result["rolled_back_after_stop"] += roll_back_left(url)
    if counted is not None:
        result["statements"] = counted
    return result


def print_steady(result: dict[str, Any]) -> None:
    """Per kind and measure: median (min-max) and the relative spread over the runs."""
    print(
        f"\nsteady: {result['rows']:,} rows, {result['files']} files, "
        f"{result['files_per_trigger']} per batch, shared_buffers {result['shared_buffers']}"
    )
    print(f"{'measure':<58} {'runs':>4} {'median':>12} {'min':>12} {'max':>12} {'spread':>7}")
    for kind, figures in result["summary"].items():
        for name, s in figures.items():
            share = "-" if s["spread"] is None else f"{s['spread']:.1%}"
            print(
                f"{kind + ': ' + name:<58} {s['n']:>4} {s['median']:>12.4g} "
                f"{s['min']:>12.4g} {s['max']:>12.4g} {share:>7}"
            )
