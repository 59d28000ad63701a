"""Measure 8: scaling with the partition count, in PostgreSQL CPU seconds per million rows.

At p = 1, 2, 4, 8: sqlsink ``exactly_once`` (the rows streamed in one batch,
``repartitionByRange(p, "id")``: p sessions with disjoint key ranges, no trap) against a plain
binary COPY from p forked processes, each a contiguous range of the key (``copyload``, the
rows encoded beforehand). Both load the same rows into a fresh table with the primary key.
A third method is the foreachBatch writer on the same frame: it sorts each partition by
the table's key (its default, ``order_by_key``), so its sessions send what COPY sends,
in the same order, and the difference is the sink's own work at the server.

The figure that matters where executors run on other machines than the database is the
server's CPU per row (read from the postmaster and its children, ``cpu.py``): on this 2-core
machine the wall time mixes in the JVM and the Python workers. Spark runs at most 2 tasks at
once (``local[2]``): at 4 and 8 partitions the sink's sessions take turns (each holds its
prepared transaction until the batch commits) while the plain COPY's p processes all run at
once. The rows of a range partition arrive as sorted blocks (one per input file) in the
order Spark read the files, not in key order: the index then splits pages in the middle
(its size after the run is kept, as the WAL per row). The runs are interleaved (every
(p, method) once per round), ``repeat`` rounds; medians with min and max.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from copyload import Layout, check_table, encode_sessions, load_at_once, read_sorted, reset
from pgstats import ServerMeter, relation_mb, spread
from streaming import Sink, read_stream, run_available_now, run_foreach_batch_available_now
from workload import TABLE_DDL, Dataset

TABLE = "scale_rows"
FOREACH_BATCH = "sqlsink exactly_once, foreachBatch writer"
METHODS = ("plain COPY", "sqlsink exactly_once", FOREACH_BATCH)


def measure_scaling(
    spark: Any,
    url: str,
    data: Dataset,
    checkpoints: Path,
    partitions: Sequence[int],
    repeat: int,
    attempt: Callable[[str, Callable[[], Any]], Any],
) -> dict[str, Any]:
    table = read_sorted(data)
    encoded = {p: encode_sessions(table, Layout(p, "range")) for p in partitions}
    del table
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {
        (m, p): [] for p in partitions for m in METHODS
    }

    def copy_run(p: int) -> dict[str, Any]:
        reset(url, TABLE, TABLE_DDL)
        with ServerMeter(url) as meter:
            seconds = load_at_once(url, TABLE, encoded[p])
        check_table(url, TABLE, data.rows)
        return {"seconds": seconds, **meter.result, "index_mb": relation_mb(url, f"{TABLE}_pkey")}

    def sink_run(p: int) -> dict[str, Any]:
        reset(url, TABLE, TABLE_DDL)
        frame = read_stream(spark, data.path).repartitionByRange(p, "id")
        sink = Sink.sqlsink(url, TABLE, "exactly_once")
        with ServerMeter(url) as meter:
            result = run_available_now(frame, sink, checkpoints)
        check_table(url, TABLE, data.rows)
        index_mb = relation_mb(url, f"{TABLE}_pkey")
        return {"seconds": result.seconds, **meter.result, "index_mb": index_mb}

    def writer_run(p: int) -> dict[str, Any]:
        import sqlsink

        reset(url, TABLE, TABLE_DDL)
        frame = read_stream(spark, data.path).repartitionByRange(p, "id")
        writer = sqlsink.ForeachBatchWriter(url=url, sink_id=f"scale-{uuid.uuid4().hex[:12]}")
        with ServerMeter(url) as meter:
            result = run_foreach_batch_available_now(frame, writer.to(TABLE), checkpoints, "fb")
        check_table(url, TABLE, data.rows)
        index_mb = relation_mb(url, f"{TABLE}_pkey")
        return {"seconds": result.seconds, **meter.result, "index_mb": index_mb}

    runners = {"plain COPY": copy_run, "sqlsink exactly_once": sink_run, FOREACH_BATCH: writer_run}
    for round_number in range(1, repeat + 1):
        for p in partitions:
            for method in METHODS:
                run = runners[method]
                got = attempt(
                    f"scaling: {method}, {p} partitions (round {round_number}/{repeat})",
                    lambda run=run, p=p: run(p),  # type: ignore[misc]
                )
                if got is not None:
                    runs[(method, p)].append(got)
    return summarize(runs, data.rows)


def summarize(runs: dict[tuple[str, int], list[dict[str, Any]]], rows: int) -> dict[str, Any]:
    points = []
    for (method, p), found in runs.items():
        if not found:
            continue
        cpu = [r["postgres_cpu_s"] * 1e6 / rows for r in found if r.get("postgres_cpu_s")]
        seconds = [r["seconds"] for r in found]
        points.append(
            {
                "method": method,
                "partitions": p,
                "postgres_cpu_s_per_m_rows": spread(cpu) if cpu else None,
                "seconds": spread(seconds),
                "rows_per_s": rows / statistics.median(seconds),
                "wal_bytes_per_row": statistics.median(r.get("wal_bytes", 0.0) for r in found)
                / rows,
                "index_mb": statistics.median(r["index_mb"] or 0.0 for r in found),
                "load_1m": [r["load_1m_before"] for r in found],
                "runs": found,
            }
        )
    ratios: dict[str, float] = {}
    by_key = {(pt["method"], pt["partitions"]): pt for pt in points}
    for (method, p), pt in by_key.items():
        copy = by_key.get(("plain COPY", p))
        if method == "plain COPY" or copy is None:
            continue
        name = "sqlsink" if method == "sqlsink exactly_once" else method
        if pt["postgres_cpu_s_per_m_rows"] and copy["postgres_cpu_s_per_m_rows"]:
            ratios[f"server CPU, {name} / COPY at {p}"] = (
                pt["postgres_cpu_s_per_m_rows"]["median"]
                / copy["postgres_cpu_s_per_m_rows"]["median"]
            )
        ratios[f"rows/s, {name} / COPY at {p}"] = pt["rows_per_s"] / copy["rows_per_s"]
    return {"rows": rows, "points": points, "ratios": ratios}
