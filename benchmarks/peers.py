"""Measure 9: the peers a user would otherwise pick, in the same run as sqlsink.

Every method streams the same rows (``readStream`` of the Parquet files, Spark's own file
partitions, ``trigger(availableNow=True)``) into the same fresh table with the primary key:

* upsert, into the table pre-filled with every other row (``n = -1``: half the rows update
  one, half insert one): the hand-written ``foreachBatch`` most users write, per partition
  (``foreachPartition``) one psycopg connection, one transaction, either
  ``cursor.executemany`` of ``INSERT ... ON CONFLICT (id) DO UPDATE`` (psycopg 3 pipelines
  it) or multi-row ``INSERT ... VALUES (...), (...) ... ON CONFLICT`` of 1,000 rows each (what
  psycopg2's ``execute_values`` sends, with a page of 1,000 instead of its default 100); against
  sqlsink ``exactly_once`` with ``mode=upsert``;
* append into the empty table: Spark's JDBC writer called from ``foreachBatch`` with
  ``reWriteBatchedInserts=true`` against sqlsink ``exactly_once`` (append);
* Spark's own floor: the same stream into the ``noop`` sink (no ratio; what any sink pays).

The runs go round-robin over the methods, ``repeat`` rounds; medians with min and max, the
server's CPU beside them, and where the machine's CPU went (``cpu.CpuMeter``: the JVM,
Spark's Python workers, PostgreSQL, the rest). Spark and PostgreSQL share this machine's
cores, so an append's wall time follows the CPU-seconds all of them spend: the figure
that tells whether a sink can be twice as fast as another here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from copyload import Layout, check_table, encode_sessions, load_at_once, read_sorted, reset
from cpu import CpuMeter
from pgstats import ServerMeter, spread
from server import jdbc_target
from streaming import (
    Sink,
    read_stream,
    run_available_now,
    run_foreach_batch_available_now,
    start_query,
)
from workload import TABLE_DDL, Dataset

TABLE = "peer_rows"
FLOOR = "Spark noop sink (Spark's own floor)"
PAGE = 1_000
UPSERT_SQL = (
    "INSERT INTO {table} (id, ts, n, x, s) VALUES {values} ON CONFLICT (id) DO UPDATE SET "
    "ts = EXCLUDED.ts, n = EXCLUDED.n, x = EXCLUDED.x, s = EXCLUDED.s"
)


def handwritten_upsert(url: str, table: str, style: str) -> Callable[[Any, int], None]:
    """The foreachBatch function a user writes. Everything the executors run is inside it
    (pickled by value: the benchmark's modules are not importable on the workers)."""
    one = "(%s, %s, %s, %s, %s)"
    single = UPSERT_SQL.format(table=table, values=one)
    page = PAGE

    def write_partition(rows: Any) -> None:
        import psycopg as pg

        with pg.connect(url) as conn, conn.cursor() as cur:
            if style == "executemany":
                cur.executemany(single, [tuple(r) for r in rows])
            else:
                chunk: list[Any] = []
                for r in rows:
                    chunk.extend(r)
                    if len(chunk) == 5 * page:
                        statement = UPSERT_SQL.format(table=table, values=", ".join([one] * page))
                        cur.execute(statement, chunk)
                        chunk = []
                if chunk:
                    values = ", ".join([one] * (len(chunk) // 5))
                    cur.execute(UPSERT_SQL.format(table=table, values=values), chunk)
            conn.commit()

    def each_batch(frame: Any, batch_id: int) -> None:
        frame.foreachPartition(write_partition)

    return each_batch


def jdbc_each_batch(url: str, table: str) -> Callable[[Any, int], None]:
    jdbc_url, props = jdbc_target(url)
    options = {
        "url": jdbc_url + "?reWriteBatchedInserts=true",
        "dbtable": table,
        "driver": "org.postgresql.Driver",
        **props,
    }

    def each_batch(frame: Any, batch_id: int) -> None:
        frame.write.format("jdbc").mode("append").options(**options).save()

    return each_batch


def run_foreach_batch(
    spark: Any, data: Dataset, fn: Callable[[Any, int], None], work: Path
) -> float:
    frame = read_stream(spark, data.path)
    return run_foreach_batch_available_now(frame, fn, work, "foreach").seconds


def measure_peers(
    spark: Any,
    url: str,
    data: Dataset,
    checkpoints: Path,
    repeat: int,
    jdbc: bool,
    attempt: Callable[[str, Callable[[], Any]], Any],
) -> dict[str, Any]:
    rows = read_sorted(data)
    even = rows.filter(pc.equal(pc.bit_wise_and(rows["id"], 1), 0))
    stale = even.set_column(2, "n", pa.array([-1] * even.num_rows, pa.int32()))
    prefill_sessions = encode_sessions(stale, Layout(1))
    del rows, even, stale

    def prefill() -> None:
        reset(url, TABLE, TABLE_DDL)
        load_at_once(url, TABLE, prefill_sessions)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {TABLE}")
            conn.execute("CHECKPOINT")

    def check_upsert() -> None:
        check_table(url, TABLE, data.rows)
        with psycopg.connect(url) as conn:
            row = conn.execute(f"SELECT count(*) FILTER (WHERE n = -1) FROM {TABLE}").fetchone()
        if row is None or row[0] != 0:
            raise AssertionError(f"upsert left {row} stale rows")

    def streamed(
        fn: Callable[[Any, int], None] | Sink, upsert: bool, checked: bool = True
    ) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            if upsert:
                prefill()
            else:
                reset(url, TABLE, TABLE_DDL)
            with ServerMeter(url) as meter, CpuMeter() as cpu:
                if isinstance(fn, Sink):
                    seconds = run_available_now(
                        read_stream(spark, data.path), fn, checkpoints
                    ).seconds
                else:
                    seconds = run_foreach_batch(spark, data, fn, checkpoints)
            if checked:
                check_upsert() if upsert else check_table(url, TABLE, data.rows)
            return {"seconds": seconds, **meter.result, "cpu_s": cpu.split}

        return run

    methods: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "hand-written upsert, executemany": (
            "upsert",
            streamed(handwritten_upsert(url, TABLE, "executemany"), True),
        ),
        f"hand-written upsert, multi-row VALUES ({PAGE:,} rows)": (
            "upsert",
            streamed(handwritten_upsert(url, TABLE, "values"), True),
        ),
        "sqlsink exactly_once, upsert": (
            "upsert",
            streamed(Sink.sqlsink(url, TABLE, "exactly_once", mode="upsert"), True),
        ),
        "sqlsink exactly_once, append": (
            "append",
            streamed(Sink.sqlsink(url, TABLE, "exactly_once"), False),
        ),
    }
    if jdbc:
        methods["Spark JDBC via foreachBatch, reWriteBatchedInserts"] = (
            "append",
            streamed(jdbc_each_batch(url, TABLE), False),
        )
    methods[FLOOR] = ("floor", streamed(Sink.noop(), False, checked=False))  # writes nothing
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    for round_number in range(1, repeat + 1):
        for name, (_, run) in methods.items():
            got = attempt(f"peers: {name} (round {round_number}/{repeat})", run)
            if got is not None:
                runs[name].append(got)
    results = []
    for name, found in runs.items():
        if not found:
            continue
        seconds = [r["seconds"] for r in found]
        cpu = [r["postgres_cpu_s"] * 1e6 / data.rows for r in found if r.get("postgres_cpu_s")]
        splits = [r["cpu_s"] for r in found if r.get("cpu_s")]
        groups = sorted({g for split in splits for g in split})
        results.append(
            {
                "method": name,
                "kind": methods[name][0],
                "rows": data.rows,
                "seconds": spread(seconds),
                "rows_per_s": data.rows / statistics.median(seconds),
                "postgres_cpu_s_per_m_rows": spread(cpu) if cpu else None,
                # median CPU-seconds per million rows of each process group (cpu.CpuMeter)
                "cpu_s_per_m_rows": {
                    g: statistics.median(s.get(g, 0.0) for s in splits) * 1e6 / data.rows
                    for g in groups
                },
                "load_1m": [r["load_1m_before"] for r in found],
                "runs": found,
            }
        )
    return {"rows": data.rows, "methods": results, "ratios": peer_ratios(results)}


def peer_ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """sqlsink's rows/s over each peer's (higher = sqlsink faster), and for each the
    machine's CPU-seconds the peer spent over sqlsink's ("machine CPU")."""
    rate = {r["method"]: r["rows_per_s"] for r in results}
    machine = {r["method"]: r["cpu_s_per_m_rows"].get("machine_total") for r in results}
    out: dict[str, float] = {}
    for ours, kind in (
        ("sqlsink exactly_once, upsert", "upsert"),
        ("sqlsink exactly_once, append", "append"),
    ):
        if ours not in rate:
            continue
        for r in results:
            if r["kind"] == kind and r["method"] != ours:
                out[f"{ours} / {r['method']}"] = rate[ours] / r["rows_per_s"]
                theirs, mine = machine[r["method"]], machine[ours]
                if theirs and mine:
                    out[f"{ours} / {r['method']}, machine CPU"] = theirs / mine
    return out


__all__ = ["measure_peers", "start_query"]
