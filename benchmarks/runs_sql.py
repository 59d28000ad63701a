"""What judging a sink's runs (``run_registry.RUNS_SQL``: ``sqlsink status``, ``recover``,
``forget``) costs as ``sqlsink.runs`` grows: it is never pruned (docs/DESIGN.md 7).

    .venv/bin/python benchmarks/runs_sql.py [--rows 1000,10000,50000] [--decisions 1000]
                                            [--repeat 3] [--url URL]

One sink's log as years of restarts leave it: ``--rows`` runs, each superseded by the
next but the newest (live), one in ten of them over (a batch aborted), and the sink's
``--decisions`` newest decisions (retention keeps ``keepBatches``, default 1000) decided
by its newest runs, ten each. Per size, the median of ``--repeat`` calls of
``run_registry.runs`` (every run judged, as status and recover read them) and of
``run_registry.live_runs`` (forget, retention), in seconds. Prints the command, the date
and the server; run it with ``PYTHONPATH`` naming the checkout to measure (before/after
a change: two checkouts).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from server import postgres

from sqlsink.postgres import run_registry
from sqlsink.postgres.schema import ensure_schema

SINK = "bench-runs"


def build_log(conn: psycopg.Connection, sink: str, runs: int, decisions: int) -> None:
    """``runs`` runs of ``sink`` (run-000001 the oldest), and its ``decisions`` newest
    decisions, ten a run, by the newest runs; a gap of 1 s growing by 0.1 s between
    decisions."""
    conn.execute("DELETE FROM sqlsink.runs WHERE sink_id = %s", (sink,))
    conn.execute("SELECT set_config(%s, %s, false)", ("sqlsink.forget", sink))  # as forget does
    conn.execute("DELETE FROM sqlsink.decisions WHERE sink_id = %s", (sink,))
    conn.execute("RESET sqlsink.forget")
    conn.execute("INSERT INTO sqlsink.sinks (sink_id) VALUES (%s) ON CONFLICT DO NOTHING", (sink,))
    conn.execute(
        "INSERT INTO sqlsink.runs (sink_id, run_id, first_seen, heartbeat_at, live_for, "
        "                          superseded_at, superseded_by, aborted_batch) "
        "SELECT %(sink)s, format('run-%%s', lpad(i::text, 6, '0')), "
        "       now() - make_interval(mins => %(runs)s - i + 1), "
        "       now() - make_interval(mins => %(runs)s - i), interval '5 min', "
        "       CASE WHEN i < %(runs)s THEN now() - make_interval(mins => %(runs)s - i) END, "
        "       CASE WHEN i < %(runs)s THEN format('run-%%s', lpad((i + 1)::text, 6, '0')) END, "
        "       CASE WHEN i %% 10 = 5 THEN i END "
        "FROM generate_series(1, %(runs)s) AS i",
        {"sink": sink, "runs": runs},
    )
    conn.execute(
        "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, query_id, run_id, "
        "                               decided_at, completed_at) "
        "SELECT %(sink)s, b, '{}', 0, 'q', "
        "       format('run-%%s', lpad(greatest(1, %(runs)s - (%(decisions)s - 1 - b) / 10)::text, "
        "                              6, '0')), "
        "       now() - make_interval(secs => (%(decisions)s - b) * (1 + b %% 7 * 0.1)), now() "
        "FROM generate_series(0, %(decisions)s - 1) AS b",
        {"sink": sink, "runs": runs, "decisions": decisions},
    )
    conn.execute("ANALYZE sqlsink.runs")
    conn.execute("ANALYZE sqlsink.decisions")


def timed(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000,10000,50000")
    parser.add_argument("--decisions", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    print("$", " ".join([Path(sys.executable).name, *sys.argv]))
    print("date:", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    print("sqlsink from:", Path(run_registry.__file__).parent.parent)
    with (
        tempfile.TemporaryDirectory() as tmp,
        postgres(args.url, Path(tmp)) as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        ensure_schema(conn)  # type: ignore[arg-type]
        print("server:", conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        print(f"{'runs rows':>10} {'runs() s':>10} {'live_runs() s':>14}  live")
        for size in (int(n) for n in args.rows.split(",")):
            build_log(conn, SINK, size, args.decisions)
            every = timed(lambda: run_registry.runs(conn, SINK), args.repeat)  # type: ignore[arg-type]
            live = timed(lambda: run_registry.live_runs(conn, SINK), args.repeat)  # type: ignore[arg-type]
            found = sorted(r for _, r in run_registry.live_runs(conn, SINK))  # type: ignore[arg-type]
            print(f"{size:>10} {every:>10.3f} {live:>14.3f}  {found}")
        build_log(conn, SINK, 0, 0)


if __name__ == "__main__":
    main()
