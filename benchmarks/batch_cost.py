"""Measure 10: the per-batch cost, over hundreds of 10-row micro-batches.

Spark's ``rate-micro-batch`` source makes exactly 10 rows per batch (2 partitions), the query
triggers every 100 ms (``processingTime``); every row carries its batch's trigger time
(``current_timestamp()``, which Spark fixes per micro-batch) in ``ts``. While the query runs,
the benchmark polls ``max(id)`` of the table every 2 ms; a batch is *visible* at the first
poll that sees its last row. Per batch:

* ``trigger_to_visible_ms``: visible - ``ts`` (sqlsink only);
* ``trigger_ms`` / ``add_batch_ms``: Spark's ``triggerExecution`` / ``addBatch`` of the batch
  (for ``noop``, its ``triggerExecution`` is the batch from trigger to end: the floor);
* ``commit_ms`` (``exactly_once``): the commit log's time of the driver's commit.

``noop``, ``at_least_once`` and ``exactly_once`` (``format("sqlsink")``), then the same two
semantics through the foreachBatch writer (``fb_``: its commit runs in the driver's
process right after the batch's job) run in turn, ``rounds`` times over, each query
``warmup`` + ``batches`` batches, the warm-up ones left out: ``rounds · batches`` batches per
sink. Medians with their 95% interval (order statistics).

Then, not timed, one more ``exactly_once`` query of ``counted_batches`` batches with
``log_statement = all`` and ``log_connections = on`` on the benchmark's own server: its log
gives the statements (each one round trip, unless pipelined) and the connections per batch,
by session: the driver's commit session, the planner, the partitions' sessions.
"""

from __future__ import annotations

import bisect
import re
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from copyload import reset
from overhead import commit_ms
from pgstats import median_interval
from streaming import Sink
from workload import TABLE_DDL

TABLE = "cost_rows"
ROWS_PER_BATCH = 10
PARTITIONS = 2
TRIGGER = {"processingTime": "100 milliseconds"}
# format("sqlsink") with each semantic, and the foreachBatch writer ("fb_"), whose commit
# runs in the driver's own process right after the batch's job (the data source's runs
# in a Python worker Spark calls after the tasks)
SINKS = ("noop", "at_least_once", "exactly_once", "fb_at_least_once", "fb_exactly_once")


def cost_frame(spark: Any) -> Any:
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", PARTITIONS)
        .load()
    )
    return source.select(
        F.col("value").alias("id"),
        F.current_timestamp().alias("ts"),
        (F.col("value") % 100_000).cast("int").alias("n"),
        F.lit(0.5).alias("x"),
        F.format_string("customer-%010d/batch-cost", F.col("value")).alias("s"),
    )


def start(frame: Any, sink: Sink, checkpoints: Path) -> Any:
    checkpoint = checkpoints / f"cost-{sink.format}-{uuid.uuid4().hex[:12]}"
    writer = frame.writeStream.format(sink.format).option("checkpointLocation", str(checkpoint))
    for key, value in sink.options.items():
        writer = writer.option(key, value)
    return writer.trigger(**TRIGGER).start()


def start_foreach_batch(frame: Any, url: str, semantic: str, checkpoints: Path) -> tuple[Any, str]:
    """The foreachBatch writer into TABLE (its defaults: rows sorted by the key within
    each partition); the query and the sink id."""
    import sqlsink

    sink_id = f"cost-fb-{uuid.uuid4().hex[:12]}"
    writer = sqlsink.ForeachBatchWriter(url=url, sink_id=sink_id, semantic=semantic)
    checkpoint = checkpoints / f"cost-{sink_id}"
    query = (
        frame.writeStream.foreachBatch(writer.to(TABLE))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**TRIGGER)
        .start()
    )
    return query, sink_id


def run_query(
    spark: Any, url: str, sink_name: str, batches: int, warmup: int, checkpoints: Path
) -> dict[str, Any]:
    """One query of warmup + batches batches; its per-batch figures (warm-up left out)."""
    reset(url, TABLE, TABLE_DDL)
    target = warmup + batches
    seen: list[tuple[float, int]] = []  # (time.time(), max id) at each change
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(target + 50))
    sink_id = None
    if sink_name.startswith("fb_"):
        query, sink_id = start_foreach_batch(
            cost_frame(spark), url, sink_name.removeprefix("fb_"), checkpoints
        )
    else:
        sink = Sink.noop() if sink_name == "noop" else Sink.sqlsink(url, TABLE, sink_name)
        query = start(cost_frame(spark), sink, checkpoints)
    try:
        with psycopg.connect(url, autocommit=True, application_name="bench poller") as conn:
            last, last_check, done = -1, 0.0, False
            deadline = time.monotonic() + 60 + target * 5
            while not done:
                if sink_name != "noop":
                    row = conn.execute(f"SELECT max(id) FROM {TABLE}").fetchone()
                    top = -1 if row is None or row[0] is None else int(row[0])
                    if top != last:
                        seen.append((time.time(), top))
                        last = top
                now = time.monotonic()
                if now - last_check > 0.2:
                    last_check = now
                    progress = query.lastProgress
                    done = progress is not None and int(progress["batchId"]) >= target
                    if query.exception() is not None:
                        raise RuntimeError(f"batch-cost query failed: {query.exception()}")
                    if now > deadline:
                        raise TimeoutError(f"{sink_name}: {target} batches not done in time")
                time.sleep(0.002)
            idle_by = time.monotonic() + 1.0  # stop between batches if one comes soon
            while query.status["isTriggerActive"] and time.monotonic() < idle_by:
                time.sleep(0.005)
        progress = [dict(p) for p in query.recentProgress]
    finally:
        query.stop()
    by_batch = {int(p["batchId"]): p for p in progress}
    steady = [by_batch[b] for b in sorted(by_batch) if warmup <= b < target]
    out: dict[str, Any] = {
        "sink": sink_name,
        "trigger_ms": [float(p["durationMs"].get("triggerExecution", 0)) for p in steady],
        "add_batch_ms": [float(p["durationMs"].get("addBatch", 0)) for p in steady],
    }
    if sink_name != "noop":
        out["trigger_to_visible_ms"] = visible_after_trigger(url, seen, warmup, target)
    if sink_name.endswith("exactly_once"):
        sink_id = sink_id or str(progress[0]["id"])
        out["commit_ms"] = commit_ms(url, sink_id, after=warmup - 1)[:batches]
    return out


def visible_after_trigger(
    url: str, seen: list[tuple[float, int]], warmup: int, target: int
) -> list[float]:
    """For every steady batch (rows grouped by their trigger time), ms from its trigger to
    the first poll that saw its last row."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"SELECT extract(epoch FROM ts)::float8, max(id), count(*) FROM {TABLE} "
            "GROUP BY ts ORDER BY ts"
        ).fetchall()
    out = []
    for number, (trigger, last_id, count) in enumerate(rows):
        if not warmup <= number < target or count != ROWS_PER_BATCH:
            continue
        visible = next((t for t, top in seen if top >= last_id), None)
        if visible is not None:
            out.append((visible - float(trigger)) * 1000)
    return out


def deciles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0]] * 9
    return statistics.quantiles(values, n=10, method="inclusive")


def summarize(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    median, low, high = median_interval(values)
    return {
        "n": len(values),
        "median": median,
        "ci95": [low, high],
        "p10": deciles(values)[0],
        "p90": deciles(values)[-1],
    }


def measure_batch_cost(
    spark: Any,
    url: str,
    checkpoints: Path,
    batches: int,
    rounds: int,
    warmup: int,
    counted_batches: int,
    attempt: Callable[[str, Callable[[], Any]], Any],
) -> dict[str, Any]:
    pooled: dict[str, dict[str, list[float]]] = {s: {} for s in SINKS}
    for round_number in range(1, rounds + 1):
        for sink in SINKS:
            got = attempt(
                f"batch cost: {sink} (round {round_number}/{rounds})",
                lambda sink=sink: run_query(spark, url, sink, batches, warmup, checkpoints),  # type: ignore[misc]
            )
            for key, values in (got or {}).items():
                if isinstance(values, list):
                    pooled[sink].setdefault(key, []).extend(values)
    sinks = {
        sink: {key: summarize(values) for key, values in figures.items()}
        for sink, figures in pooled.items()
    }
    result: dict[str, Any] = {
        "rows_per_batch": ROWS_PER_BATCH,
        "partitions": PARTITIONS,
        "trigger": TRIGGER["processingTime"],
        "sinks": sinks,
        "ratios": cost_ratios(sinks),
    }
    counted = attempt(
        "batch cost: statements per batch (log_statement = all)",
        lambda: count_statements(spark, url, counted_batches, checkpoints),
    )
    if counted is not None:
        result["statements"] = counted
    return result


def cost_ratios(sinks: dict[str, dict[str, Any]]) -> dict[str, float]:
    def med(sink: str, key: str) -> float | None:
        figure = sinks.get(sink, {}).get(key)
        return None if not figure else float(figure["median"])

    out: dict[str, float] = {}
    noop = med("noop", "trigger_ms")
    for sink in ("at_least_once", "exactly_once"):
        visible, trigger = med(sink, "trigger_to_visible_ms"), med(sink, "trigger_ms")
        if noop and visible:
            out[f"{sink} trigger->visible / noop batch"] = visible / noop
        if noop and trigger:
            out[f"{sink} triggerExecution / noop batch"] = trigger / noop
    eo, alo = med("exactly_once", "trigger_ms"), med("at_least_once", "trigger_ms")
    if eo is not None and alo is not None:
        out["exactly_once - at_least_once triggerExecution, ms"] = eo - alo
    eo_v, alo_v = (
        med("exactly_once", "trigger_to_visible_ms"),
        med("at_least_once", "trigger_to_visible_ms"),
    )
    if eo_v is not None and alo_v is not None:
        out["exactly_once - at_least_once trigger->visible, ms"] = eo_v - alo_v
    fb_eo, fb_alo = (
        med("fb_exactly_once", "trigger_to_visible_ms"),
        med("fb_at_least_once", "trigger_to_visible_ms"),
    )
    if noop and fb_eo:
        out["foreachBatch exactly_once trigger->visible / noop batch"] = fb_eo / noop
    if fb_eo is not None and fb_alo is not None:
        out["foreachBatch exactly_once - at_least_once trigger->visible, ms"] = fb_eo - fb_alo
    return out


LOG_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \S+ app=(?P<app>.*?): "
    r"(?:LOG|DETAIL|ERROR|WARNING|STATEMENT):\s+(?P<msg>.*)"
)
BURST_GAP_S = 0.05  # the driver's commit of one batch: statements less than 50 ms apart
STATEMENT = re.compile(r"^(?:statement|execute [^:]*): (?P<sql>.*)")
PREPARE = re.compile(r"^PREPARE TRANSACTION 'sqlsink_[A-Za-z0-9-]+_(?P<batch>\d+)_")


def server_log(url: str) -> Path | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    log = Path(str(row[0])).parent / "server.log" if row else None
    return log if log is not None and log.is_file() else None


def count_statements(spark: Any, url: str, batches: int, checkpoints: Path) -> dict[str, Any]:
    """One exactly_once query with every statement logged: statements and connections per
    batch, by session kind; and the driver's commit statements of one batch, in order."""
    log = server_log(url)
    if log is None:
        raise RuntimeError("the server's log file is not readable here (--url?)")
    settings = {
        "log_statement": "'all'",
        "log_connections": "on",
        "log_line_prefix": "'%m app=%a: '",
    }
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)
    offset = log.stat().st_size
    try:
        run = run_query(spark, url, "exactly_once", batches, 2, checkpoints)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for name in settings:
                conn.execute(f"ALTER SYSTEM RESET {name}")
            conn.execute("SELECT pg_reload_conf()")
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    statements: Counter[str] = Counter()
    connections: Counter[str] = Counter()
    commit_sequence: list[tuple[float, str]] = []
    last_prepare: dict[int, float] = {}  # batch -> when its last PREPARE TRANSACTION began
    for line in text.splitlines():
        match = LOG_LINE.match(line)
        if not match:
            continue
        app, msg = match["app"], match["msg"]
        if msg.startswith("connection authorized"):
            found = re.search(r"application_name=(.*?)(?: SSL| GSS|$)", msg)
            kind = kind_of(found.group(1) if found else "")
            if kind != "benchmark":
                connections[kind] += 1
            continue
        stmt = STATEMENT.match(msg)
        if stmt is None:
            continue
        kind = kind_of(app)
        if kind == "benchmark":
            continue  # the benchmark's own polling
        statements[kind] += 1
        when = datetime.strptime(match["ts"], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        if kind == "driver commit":
            commit_sequence.append((when, stmt["sql"][:100]))
        prepare = PREPARE.match(stmt["sql"])
        if kind == "partition tasks" and prepare is not None:
            batch = int(prepare["batch"])
            last_prepare[batch] = max(when, last_prepare.get(batch, when))
    total_batches = batches + 2
    return {
        "batches": total_batches,
        "partitions": PARTITIONS,
        "statements_per_batch": {k: v / total_batches for k, v in statements.items()},
        "connections_per_batch": {k: v / total_batches for k, v in connections.items()},
        **driver_commit_bursts(commit_sequence),
        "commit_ms": summarize(run.get("commit_ms", [])),
        "last_prepare_to_commit_ms": summarize(
            handoffs(last_prepare, [when for when, _ in commit_sequence], after=2)
        ),
    }


def handoffs(last_prepare: dict[int, float], commit_times: list[float], after: int) -> list[float]:
    """Per batch (from ``after`` on): ms from the start of its last PREPARE TRANSACTION to
    the first statement of the driver's commit after it (server log times): Spark's hand-off
    to the data source's ``commit()``, a PREPARE's own flush included."""
    ordered = sorted(commit_times)
    out = []
    for batch, prepared in sorted(last_prepare.items()):
        at = bisect.bisect_right(ordered, prepared)
        if batch >= after and at < len(ordered):
            out.append((ordered[at] - prepared) * 1000)
    return out


def kind_of(app: str) -> str:
    if app.startswith("sqlsink sink "):
        return "partition tasks"
    if app.endswith(" commit") and app.startswith("sqlsink "):
        return "driver commit"
    if app == "sqlsink planner":
        return "planner"
    if app.startswith("sqlsink"):
        return "other sqlsink"
    if app.startswith("bench"):
        return "benchmark"
    return "other"


def driver_commit_bursts(sequence: list[tuple[float, str]]) -> dict[str, Any]:
    """The driver's commit statements cut into bursts (one per batch: statements less than
    BURST_GAP_S apart); the burst sizes and the statements of the median-sized one."""
    bursts: list[list[str]] = []
    last = None
    for when, statement in sequence:
        if last is None or when - last > BURST_GAP_S:
            bursts.append([])
        bursts[-1].append(statement)
        last = when
    if not bursts:
        return {"driver_commit_statements": None, "driver_commit_one_batch": []}
    sizes = [len(b) for b in bursts]
    median = statistics.median(sizes)
    # a steady batch: the last burst of the median size (the first batches also register)
    typical = min(reversed(bursts), key=lambda b: abs(len(b) - median))
    return {
        "driver_commit_statements": {"median": median, "min": min(sizes), "max": max(sizes)},
        "driver_commit_bursts": len(bursts),
        "driver_commit_one_batch": typical,
    }
