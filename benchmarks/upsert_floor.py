"""Where an upsert's time goes, on the server alone (no Spark, no sink): the floor.

    .venv/bin/python benchmarks/upsert_floor.py [--rows 1000000] [--repeat 3] [--url URL]

The throughput benchmark's upsert loads N rows into a table pre-filled with every other
row. This takes the same rows and times, in one session and one transaction each, the
steps the sink's upsert runs in a partition transaction, and their alternatives:

- ``copy into the empty target``: the plain COPY (the ceiling's work);
- ``copy into a staging table``: the sink's first step (a logged table);
- ``merge, as the sink does``: DISTINCT ON (keys) ... ORDER BY keys, ordinal DESC, then
  INSERT ... ON CONFLICT DO UPDATE, from the staging table, with the server's work_mem;
- ``merge, work_mem 256MB``: the same with room to sort in memory;
- ``merge, target fillfactor 50``: the same into a target whose pages have room for
  the new row versions (HOT updates: no new index entry);
- ``insert on conflict, no dedup``: the conflict path alone (what no client can beat).

Prints seconds (median) and rows/s of each; the copy into the empty target is the 1.0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from server import postgres
from workload import COPY_TYPES, make_rows

T, STAGE = "floor_target", "floor_stage"
DDL = (
    "CREATE TABLE {} (id bigint PRIMARY KEY, ts timestamptz NOT NULL, n integer NOT NULL, "
    "x double precision NOT NULL, s text NOT NULL)"
)
DEDUP = f"SELECT DISTINCT ON (id) * FROM {STAGE} ORDER BY id, ord DESC"
UPSERT = (
    f"INSERT INTO {T} (id, ts, n, x, s) SELECT id, ts, n, x, s FROM ({{source}}) AS s "
    "ON CONFLICT (id) DO UPDATE SET ts = EXCLUDED.ts, n = EXCLUDED.n, x = EXCLUDED.x, "
    "s = EXCLUDED.s"
)


def copy(conn: psycopg.Connection[Any], table: str, rows: list[tuple[Any, ...]]) -> None:
    columns = "id, ts, n, x, s" + (", ord" if table == STAGE else "")
    types = list(COPY_TYPES) + (["int8"] if table == STAGE else [])
    with (
        conn.cursor() as cur,
        cur.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as c,
    ):
        c.set_types(types)
        for number, row in enumerate(rows):
            c.write_row((*row, number) if table == STAGE else row)


def prepare(
    url: str, rows: list[tuple[Any, ...]], prefill: bool, stage: str, fillfactor: int = 100
) -> None:
    """The target (empty or pre-filled with every other row); the staging table: "none",
    "empty" or "filled" with every row and its ordinal."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table in (T, STAGE):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(DDL.format(T) + f" WITH (fillfactor = {fillfactor})")
        if prefill:
            copy(conn, T, [(i, ts, -1, x, s) for i, ts, _, x, s in rows[::2]])
        if stage != "none":
            conn.execute(DDL.format(STAGE).replace(" PRIMARY KEY", ""))
            conn.execute(f"ALTER TABLE {STAGE} ADD COLUMN ord bigint")
        if stage == "filled":
            copy(conn, STAGE, rows)
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def step(url: str, work: Callable[[psycopg.Connection[Any]], None]) -> float:
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        work(conn)
        conn.commit()
        return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--url", help="an existing PostgreSQL instead of an embedded one")
    args = parser.parse_args()
    table = make_rows(0, args.rows)
    rows = list(zip(*(c.to_pylist() for c in table.columns), strict=True))

    def merge(work_mem: str | None, dedup: bool) -> Callable[[psycopg.Connection[Any]], None]:
        def run(conn: psycopg.Connection[Any]) -> None:
            if work_mem:
                conn.execute(f"SET LOCAL work_mem = '{work_mem}'")
            conn.execute(UPSERT.format(source=DEDUP if dedup else f"SELECT * FROM {STAGE}"))

        return run

    cases: list[tuple[str, bool, str, int, Callable[[psycopg.Connection[Any]], None]]] = [
        ("copy into the empty target", False, "none", 100, lambda c: copy(c, T, rows)),
        ("copy into a staging table", True, "empty", 100, lambda c: copy(c, STAGE, rows)),
        ("merge, as the sink does", True, "filled", 100, merge(None, dedup=True)),
        ("merge, work_mem 256MB", True, "filled", 100, merge("256MB", dedup=True)),
        ("merge, target fillfactor 50", True, "filled", 50, merge(None, dedup=True)),
        ("insert on conflict, no dedup", True, "filled", 100, merge(None, dedup=False)),
    ]
    with (
        tempfile.TemporaryDirectory(prefix="sqlsink-floor-") as base,
        postgres(args.url, Path(base)) as url,
    ):
        results = {}
        for name, prefill, staged, fillfactor, work in cases:
            times = []
            for _ in range(args.repeat):
                prepare(url, rows, prefill=prefill, stage=staged, fillfactor=fillfactor)
                times.append(step(url, work))
            results[name] = statistics.median(times)
    base_s = results["copy into the empty target"]
    print(f"{args.rows:,} rows, median of {args.repeat}")
    for name, seconds in results.items():
        print(f"{name:32} {seconds:7.2f} s {args.rows / seconds:>11,.0f} rows/s "
              f"{base_s / seconds:5.2f} x the plain COPY")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
