"""Measure 7: the interleaved-key trap (issue 16), through Spark and on the server alone.

Spark: the same rows (a bigint primary key, in files of increasing keys) streamed in 4
batches (``maxFilesPerTrigger``) into format("sqlsink") ``exactly_once``, shaped before the
sink as a user would: ``repartition(2)`` (round-robin: both partitions hold keys from the
whole batch's range, in an order shuffled by Spark's sort before repartitioning) into a table
with the primary key and into one without; ``repartition(2)`` then a ``mapInArrow`` that sorts
the whole partition by the key (what sorting inside the sink would give; Spark refuses
``sortWithinPartitions`` on a stream), beside the same ``mapInArrow`` passing the batches
through unchanged (its own cost); ``repartitionByRange(2, "id")``; Spark's own file
partitions; and the ``noop`` sink after ``repartition(2)``.

Server alone (``copyload``): N sessions COPYing the same rows into a fresh table, shaped the
same ways (round-robin or range-split keys; in key order, shuffled, or sorted within chunks
of the size the sink could sort without holding the partition) and, for the trap's shape,
with the rows cut differently into COPY statements and ``write()`` buffers.

Every run is sampled for wait events (``pgstats.WaitSampler``), PostgreSQL's CPU seconds and
the WAL written; the index's size after the run is kept. The runs go round-robin over the
variants, ``repeat`` rounds; a variant's figures are medians with their min and max.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from copyload import Layout, check_table, encode_sessions, load_at_once, read_sorted, reset
from pgstats import ServerMeter, WaitSampler, merge_waits, relation_mb, spread
from streaming import Sink, read_stream, run_available_now
from workload import TABLE_DDL, Dataset

PK_TABLE = "trap_rows"
NOPK_TABLE = "trap_rows_nopk"
NOPK_DDL = TABLE_DDL.replace(" PRIMARY KEY", "")


@dataclass
class Variant:
    name: str
    run: Callable[[], dict[str, Any]]  # one timed run: {"seconds", "meter", "waits", ...}
    level: str  # "spark" or "server"
    runs: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, rows: int) -> dict[str, Any]:
        seconds = [r["seconds"] for r in self.runs]
        cpu = [r["meter"]["postgres_cpu_s"] for r in self.runs if r["meter"].get("postgres_cpu_s")]
        wal = [r["meter"]["wal_bytes"] for r in self.runs if "wal_bytes" in r["meter"]]
        waits = [r["waits"] for r in self.runs if r.get("waits")]
        median_s = statistics.median(seconds)
        return {
            "name": self.name,
            "level": self.level,
            "rows": rows,
            "seconds": spread(seconds),
            "rows_per_s": rows / median_s,
            "postgres_cpu_s_per_m_rows": spread([c * 1e6 / rows for c in cpu]) if cpu else None,
            "wal_bytes_per_row": statistics.median(wal) / rows if wal else None,
            "index_mb": statistics.median(r["index_mb"] for r in self.runs)
            if all(r.get("index_mb") is not None for r in self.runs)
            else None,
            "waits": merge_waits(waits) if waits else None,
            "load_1m": [r["meter"]["load_1m_before"] for r in self.runs],
            "runs": self.runs,
        }


def spark_variant(
    spark: Any,
    url: str,
    data: Dataset,
    checkpoints: Path,
    batches: int,
    variant: tuple[str, str, str],
) -> Variant:
    """One streaming shape into ``table`` (or noop), ``batches`` batches."""
    name, shape, table = variant
    files = max(1, data.files // batches)
    ddl = NOPK_DDL if table == NOPK_TABLE else TABLE_DDL

    def frame() -> Any:
        df = read_stream(spark, data.path, files_per_trigger=files)
        if shape == "repartition":
            return df.repartition(2)
        if shape in ("repartition_sorted", "repartition_unchanged"):
            # nested, so pickled by value: the workers cannot import the benchmark's modules
            def sorted_partition(batches: Any) -> Any:
                import pyarrow as pa

                table = pa.Table.from_batches(list(batches))  # the whole partition in memory
                if table.num_rows:
                    yield from table.sort_by("id").to_batches(max_chunksize=10_000)

            def unchanged_partition(batches: Any) -> Any:
                yield from batches  # the mapInArrow step's own cost

            fn = sorted_partition if shape == "repartition_sorted" else unchanged_partition
            return df.repartition(2).mapInArrow(fn, df.schema)
        if shape == "range":
            return df.repartitionByRange(2, "id")
        return df  # Spark's file partitions

    def run() -> dict[str, Any]:
        noop = table == ""
        if not noop:
            reset(url, table, ddl)
        sink = Sink.noop() if noop else Sink.sqlsink(url, table, "exactly_once")
        with WaitSampler(url, "sqlsink sink %") as waits, ServerMeter(url) as meter:
            result = run_available_now(frame(), sink, checkpoints)
        if not noop:
            check_table(url, table, data.rows)
        return {
            "seconds": result.seconds,
            "meter": meter.result,
            "waits": None if noop else waits.summary(),
            "index_mb": None if noop or table == NOPK_TABLE else relation_mb(url, f"{table}_pkey"),
            "batches": len(result.progress),
        }

    return Variant(name, run, "spark")


def server_variant(url: str, data: Dataset, name: str, layout: Layout, *, pk: bool) -> Variant:
    table, ddl = (PK_TABLE, TABLE_DDL) if pk else (NOPK_TABLE, NOPK_DDL)
    encoded: list[Any] = []  # built on first use, kept for the other rounds

    def run() -> dict[str, Any]:
        if not encoded:
            encoded.append(encode_sessions(read_sorted(data), layout))
        reset(url, table, ddl)
        with WaitSampler(url, "bench copy") as waits, ServerMeter(url) as meter:
            seconds = load_at_once(url, table, encoded[0])
        check_table(url, table, data.rows)
        return {
            "seconds": seconds,
            "meter": meter.result,
            "waits": waits.summary(),
            "index_mb": relation_mb(url, f"{table}_pkey") if pk else None,
            "layout": layout.describe(),
        }

    return Variant(name, run, "server")


SPARK_SHAPES = (
    ("repartition(2), primary key", "repartition", PK_TABLE),
    ("repartition(2), no primary key", "repartition", NOPK_TABLE),
    (
        "repartition(2), each partition sorted (mapInArrow), primary key",
        "repartition_sorted",
        PK_TABLE,
    ),
    ("repartition(2), mapInArrow unchanged, primary key", "repartition_unchanged", PK_TABLE),
    ('repartitionByRange(2, "id"), primary key', "range", PK_TABLE),
    ("Spark's file partitions, primary key", "files", PK_TABLE),
    ("noop sink after repartition(2)", "repartition", ""),
)

TRAP = Layout(2, "round_robin", "shuffled")
SERVER_SHAPES: tuple[tuple[str, Layout, bool], ...] = (
    ("1 session, key order", Layout(1), True),
    ("1 session, shuffled", Layout(1, order="shuffled"), True),
    ("2 sessions, range-split, key order", Layout(2, "range"), True),
    ("2 sessions, round-robin, shuffled (the trap)", TRAP, True),
    ("2 sessions, round-robin, shuffled, no primary key", TRAP, False),
    ("2 sessions, round-robin, each session sorted", Layout(2, "round_robin", "key"), True),
    (
        "2 sessions, round-robin, sorted per 10,000 rows",
        Layout(2, "round_robin", "sorted_chunks", chunk_rows=10_000),
        True,
    ),
    (
        "2 sessions, round-robin, sorted per 100,000 rows",
        Layout(2, "round_robin", "sorted_chunks", chunk_rows=100_000),
        True,
    ),
    ("8 sessions, range-split, key order", Layout(8, "range"), True),
    ("8 sessions, round-robin, shuffled", Layout(8, "round_robin", "shuffled"), True),
    ("8 sessions, round-robin, each session sorted", Layout(8, "round_robin", "key"), True),
    (
        "the trap, a COPY per 10,000 rows",
        Layout(2, "round_robin", "shuffled", rows_per_copy=10_000),
        True,
    ),
    (
        "the trap, 1,000 rows per write",
        Layout(2, "round_robin", "shuffled", rows_per_write=1_000),
        True,
    ),
    (
        "the trap, 100,000 rows per write",
        Layout(2, "round_robin", "shuffled", rows_per_write=100_000),
        True,
    ),
)


def measure_trap(
    spark: Any,
    url: str,
    data: Dataset,
    checkpoints: Path,
    repeat: int,
    batches: int,
    attempt: Callable[[str, Callable[[], Any]], Any],
) -> dict[str, Any]:
    variants = [
        spark_variant(spark, url, data, checkpoints, batches, shape) for shape in SPARK_SHAPES
    ] + [server_variant(url, data, name, layout, pk=pk) for name, layout, pk in SERVER_SHAPES]
    for round_number in range(1, repeat + 1):
        for variant in variants:
            result = attempt(f"trap: {variant.name} (round {round_number}/{repeat})", variant.run)
            if result is not None:
                variant.runs.append(result)
    for table in (PK_TABLE, NOPK_TABLE):
        with psycopg.connect(url, autocommit=True) as conn, contextlib.suppress(psycopg.Error):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    summaries = [v.summary(data.rows) for v in variants if v.runs]
    return {
        "rows": data.rows,
        "batches": batches,
        "variants": summaries,
        "ratios": trap_ratios(summaries),
    }


def trap_ratios(summaries: list[dict[str, Any]]) -> dict[str, float]:
    """Each variant's time against its level's reference: the single key-ordered COPY
    session on the server, Spark's file partitions through the sink."""
    by_name = {s["name"]: s for s in summaries}
    out: dict[str, float] = {}
    refs = {"spark": "Spark's file partitions, primary key", "server": "1 session, key order"}
    for s in summaries:
        ref = by_name.get(refs[s["level"]])
        if ref is not None:
            out[f"{s['name']} / {ref['name']}"] = s["seconds"]["median"] / ref["seconds"]["median"]
    return out
