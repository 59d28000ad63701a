"""MariaDB's upsert paths for one partition, no Spark: which one the sink keeps
(sqlsink/mariadb/upsert.py).

The rows: ``--rows`` (300,000) of benchmarks/mariadb_load.py's mixed-type table, their
key ``id`` folded onto ``--keys`` (200,000) keys (so a third of the rows repeat a key of
the same partition; the last one must win), as Arrow record batches of 10,000 rows,
built before timing. Before each run the table holds the first half of the keys (so the
upsert updates 100,000 rows and inserts 100,000); each path writes all the rows in one
XA branch (XA START ... XA END, XA PREPARE, disconnect, XA COMMIT from another
session), best of ``--repeat`` (3):

    stage         the sink's whole branch (sqlsink.mariadb.partition.write_partition with
                  an UpsertPlan: the checks, a temporary staging table, LOAD DATA LOCAL
                  REPLACE from the FIFO, INSERT ... SELECT ... ON DUPLICATE KEY UPDATE, the
                  marker, PREPARE) and the Committer's XA COMMIT
    stage_delete  the same with a deleteColumn flagging 5 % of the rows (the DELETE too)
    insert_odku   multi-row INSERT ... ON DUPLICATE KEY UPDATE c = VALUES(c), ~1 MB
                  statements (PyMySQL's executemany batching), in an XA branch; the rows'
                  conversion from Arrow to Python tuples timed with it (what a multi-row
                  INSERT from Python costs with this client)

Every path must leave the same table, the last row of each key (checked against Arrow's
own last-row-per-key: the count, and sums of two columns).

A private mariadbd is started (tests/fix_mariadb.py's: Debian's binaries, the binary log
on, a free port), and stopped at the end. Run from the repository's root:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/mariadb_upsert_paths.py [--rows N] [--keys K]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mariadb_load import COLUMNS, make_batches

from sqlsink.core.committer import Committer
from sqlsink.core.model import TaskIdentity
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.partition import LoadTarget, write_partition
from sqlsink.mariadb.schema import ensure_schema
from sqlsink.mariadb.upsert import UpsertPlan
from tests.fix_mariadb import _own_server

TABLE, BASE = "bench_upsert", "bench_upsert_base"
FLAG = "gone"


def folded(count: int, keys: int) -> list[pa.RecordBatch]:
    out = []
    for batch in make_batches(count):
        ids = pa.array(batch.column(0).to_numpy() % keys)
        out.append(batch.set_column(0, "id", ids))
    return out


def flagged(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(11)
    return [b.append_column(FLAG, pa.array(rng.random(b.num_rows) < 0.05)) for b in batches]


def expected(batches: list[pa.RecordBatch], prefilled: pa.Table) -> tuple[int, int, float]:
    """(rows, sum of n, sum of f) of the table after the upsert: the last row per key."""
    table = pa.Table.from_batches(batches)
    table = table.append_column("__i", pa.array(np.arange(table.num_rows)))
    last = table.group_by("id").aggregate([("__i", "max")]).column("__i_max")
    kept = table.take(last)
    gone = kept.column(FLAG) if FLAG in kept.schema.names else None
    written = kept.filter(pc.invert(gone)) if gone is not None else kept
    deleted = set(kept.filter(gone).column("id").to_pylist()) if gone is not None else set()
    touched = set(kept.column("id").to_pylist())
    stays = prefilled.filter(
        pc.invert(pc.is_in(prefilled.column("id"), pa.array(list(touched | deleted))))
    )
    n = pc.sum(written.column("n")).as_py() + (pc.sum(stays.column("n")).as_py() or 0)
    f = (pc.sum(written.column("f")).as_py() or 0.0) + (pc.sum(stays.column("f")).as_py() or 0.0)
    return written.num_rows + stays.num_rows, int(n), float(f)


def stage(url: str, batches: list[pa.RecordBatch], delete: str | None) -> None:
    sink_id = f"b-{uuid.uuid4().hex[:8]}"
    task = TaskIdentity(sink_id, 0, 0, "run1", 1, 0, "q1")
    target = LoadTarget(url, TABLE, upsert=UpsertPlan(("id",), delete))
    outcome = write_partition(target, task, batches)
    conn = connect(url)
    try:
        Committer(MariaDBBackend(conn), sink_id).commit_batch(
            0, [outcome], query_id="q1", run_id="run1"
        )
    finally:
        conn.close()


def insert_odku(url: str, batches: list[pa.RecordBatch]) -> None:
    names = batches[0].schema.names
    sets = ", ".join(f"`{c}` = VALUES(`{c}`)" for c in names if c != "id")
    statement = (
        f"INSERT INTO `{TABLE}` ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))}) "
        f"ON DUPLICATE KEY UPDATE {sets}"
    )
    branch = f"'odku-{uuid.uuid4().hex[:8]}'"
    conn = connect(url)
    try:
        execute(conn, f"XA START {branch}")
        with conn.cursor() as cur:
            for batch in batches:
                columns = [c.to_pylist() for c in batch.columns]
                cur.executemany(statement, list(zip(*columns, strict=True)))
        execute(conn, f"XA END {branch}")
        execute(conn, f"XA PREPARE {branch}")
    finally:
        conn.close()
    other = connect(url)
    try:
        execute(other, f"XA COMMIT {branch}")
    finally:
        other.close()


def state(conn: Any) -> tuple[int, int, float]:
    found = rows(conn, f"SELECT count(*), sum(n), sum(f) FROM `{TABLE}`")[0]
    return int(found[0]), int(found[1] or 0), float(found[2] or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    batches = folded(args.rows, args.keys)
    with_flag = flagged(batches)
    prefilled = pa.Table.from_batches(make_batches(args.keys // 2))
    prefill = prefilled.to_batches()
    with tempfile.TemporaryDirectory(prefix="bench-mariadb-") as base:
        servers = _own_server(Path(base))
        server = next(servers)
        try:
            url = server.url()
            conn = connect(url, local_infile=True)
            ensure_schema(conn)
            for table in (TABLE, BASE):
                execute(conn, f"CREATE TABLE `{table}` ({COLUMNS}) ENGINE=InnoDB")
            stage(url, prefill, None)  # the first half of the keys, kept aside
            execute(conn, f"INSERT INTO `{BASE}` SELECT * FROM `{TABLE}`")
            paths: dict[str, tuple[Callable[[], None], list[pa.RecordBatch]]] = {
                "stage": (lambda: stage(url, batches, None), batches),
                "stage_delete": (lambda: stage(url, with_flag, FLAG), with_flag),
                "insert_odku": (lambda: insert_odku(url, batches), batches),
            }
            results: dict[str, float] = {}
            for name, (run, given) in paths.items():
                want = expected(given, prefilled)
                times = []
                for _ in range(args.repeat):
                    execute(conn, f"TRUNCATE TABLE `{TABLE}`")
                    execute(conn, f"INSERT INTO `{TABLE}` SELECT * FROM `{BASE}`")
                    began = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - began)
                    got = state(conn)
                    assert got[:2] == want[:2] and abs(got[2] - want[2]) < 1e-6 * max(
                        1.0, abs(want[2])
                    ), (name, got, want)
                results[name] = min(times)
                print(
                    f"{name:12s} best {min(times):7.2f} s  {args.rows / min(times):9.0f} rows/s  "
                    f"(runs: {', '.join(f'{t:.2f}' for t in times)})",
                    flush=True,
                )
            ratio = results["insert_odku"] / results["stage"]
            print(f"insert_odku / stage: {ratio:.1f}x slower")
            if args.json:
                args.json.write_text(
                    json.dumps({"rows": args.rows, "keys": args.keys, "best_s": results}, indent=2)
                    + "\n"
                )
            conn.close()
        finally:
            servers.close()


if __name__ == "__main__":
    main()
