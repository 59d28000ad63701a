"""The cost of option deadLetterTable on a partition's append: no Spark, the sink's own
``write_partition`` (screen, encode, COPY, dead letters, marker, PREPARE) in this process.

    .venv/bin/python benchmarks/dead_letters.py                       # 500,000 rows, 5 rounds
    .venv/bin/python benchmarks/dead_letters.py --rows 1000000 --repeat 7 --url postgresql://...

Three variants over the same rows (``workload.make_rows``: bigint, timestamptz, integer,
double precision, ~40-character text; Arrow batches of 10,000 rows, as Spark hands them):
the option off; the option on and no bad row; the option on and 1% bad rows (every 100th:
a NUL in the text, or a NULL into the NOT NULL double, in turn). Every run prepares one
partition transaction, which is then rolled back (the table stays empty: no run pays for
another's rows). The runs go round-robin, so a change of load on the machine hits every
variant alike; a variant's figure is its median run. "CPU s" is this process's CPU time
(the sink's side: screen, encode, JSON of the bad rows), which other work on the machine
disturbs less than the wall time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from server import TABLE, postgres, recreate_table
from workload import make_rows

from sqlsink.core.model import TaskIdentity
from sqlsink.options import SinkOptions
from sqlsink.postgres.dead_letters import ensure_table
from sqlsink.postgres.partition import write_partition
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import plan_target
from sqlsink.tablename import TableName

DEAD = "bench_dead_letters"


def batches_of(table: pa.Table, bad_every: int | None) -> list[pa.RecordBatch]:
    """10,000-row batches; with ``bad_every``, every such row bad (NUL text or NULL x)."""
    if bad_every:
        rows = np.arange(table.num_rows)
        nul = (rows % bad_every == 0) & (rows % (2 * bad_every) == 0)
        null_x = (rows % bad_every == 0) & ~nul
        s = pc.if_else(
            pa.array(nul), pc.binary_join_element_wise(table["s"], "\x00", ""), table["s"]
        )
        x = pc.if_else(pa.array(null_x), pa.scalar(None, pa.float64()), table["x"])
        table = table.set_column(4, "s", s).set_column(3, "x", x)
    return table.combine_chunks().to_batches(max_chunksize=10_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--url", default=None, help="an existing server (default: embedded)")
    args = parser.parse_args()
    rows = make_rows(0, args.rows)
    variants = {
        "option off": (False, batches_of(rows, None)),
        "option on, no bad row": (True, batches_of(rows, None)),
        "option on, 1% bad rows": (True, batches_of(rows, 100)),
    }
    with tempfile.TemporaryDirectory() as tmp, postgres(args.url, Path(tmp)) as url:
        recreate_table(url)
        sink = f"bench-dl-{uuid.uuid4().hex[:6]}"
        with psycopg.connect(url, autocommit=True) as conn:
            ensure_schema(conn)  # type: ignore[arg-type]
            conn.execute(f"DROP TABLE IF EXISTS {DEAD}")
            ensure_table(conn, TableName("public", DEAD), TableName("public", TABLE))  # type: ignore[arg-type]
        plans = {}
        for name, (on, _) in variants.items():
            given = {"url": url, "table": TABLE, "sinkId": sink}
            options = SinkOptions.parse({**given, **({"deadLetterTable": DEAD} if on else {})})
            with psycopg.connect(url, autocommit=True) as conn:
                plans[name] = (options, plan_target(conn, options, rows.schema.names, None))  # type: ignore[arg-type]
        times: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
        batch = 0
        for _ in range(args.repeat):
            for name, (_, batches) in variants.items():
                options, target = plans[name]
                task = TaskIdentity(sink, batch, 0, "bench", batch, 0, query_id=None)
                batch += 1
                wall, cpu = time.perf_counter(), time.process_time()
                outcome = write_partition(options, target, task, batches)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(f"ROLLBACK PREPARED '{outcome.gid}'")
                times[name].append((wall, cpu, outcome.dead_letters))
    base_wall = statistics.median(w for w, _, _ in times["option off"])
    base_cpu = statistics.median(c for _, c, _ in times["option off"])
    print(f"{args.rows:,} rows, 10,000-row batches, median of {args.repeat} rounds")
    print(
        f"{'variant':<26}{'rows/s':>12}{'wall':>9}{'CPU s':>8}{'vs off':>9}"
        f"{'CPU vs off':>12}{'dead':>8}"
    )
    for name, runs in times.items():
        wall = statistics.median(w for w, _, _ in runs)
        cpu = statistics.median(c for _, c, _ in runs)
        print(
            f"{name:<26}{args.rows / wall:>12,.0f}{wall:>8.2f}s{cpu:>8.2f}"
            f"{(wall / base_wall - 1) * 100:>+8.1f}%{(cpu / base_cpu - 1) * 100:>+11.1f}%"
            f"{runs[0][2]:>8,}"
        )


if __name__ == "__main__":
    main()
