"""``run_registry.RUNS_SQL`` takes each run's batch interval from one pass over the
sink's decisions instead of a lateral subquery per row of ``sqlsink.runs`` (which is
never pruned, docs/DESIGN.md 7; ``benchmarks/runs_sql.py`` measures both): every column
of every run stays what the lateral gave, on a log with superseded, fenced, aborted,
live and dead runs of two sinks, runs with no, one, two, four and six decisions, and a
prepared transaction."""

from __future__ import annotations

from typing import Any

import psycopg

from sqlsink.core.gid import Gid
from sqlsink.postgres import run_registry
from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import forget_sink
from tests.pg.protocol import new_sink, prepare_by_hand, prepared_of

# RUNS_SQL's batch interval as it was computed before: per row, the run's four newest
# decisions (the reference the one pass must agree with)
PER_ROW = """CROSS JOIN LATERAL (
    SELECT max(gap) AS batch_interval FROM (
        SELECT decided_at - lag(decided_at) OVER (ORDER BY batch_id) AS gap
        FROM (SELECT batch_id, decided_at FROM sqlsink.decisions d
              WHERE d.sink_id = r.sink_id AND d.run_id = r.run_id
              ORDER BY batch_id DESC LIMIT 4) AS recent
    ) AS gaps
) AS g
"""


def per_row_sql() -> str:
    """RUNS_SQL with the per-row lateral in place of the one pass."""
    sql = run_registry.RUNS_SQL
    start = sql.index("LEFT JOIN (\n    SELECT sink_id, run_id, max(gap)")
    end = sql.index("CROSS JOIN LATERAL (SELECT greatest(")
    return sql[:start] + PER_ROW + sql[end:]


# (run, decisions it made, superseded_by, aborted_batch, heartbeat age in s, runTimeout s)
RUNS = [
    ("r1", 6, "r2", None, 900, 60),  # superseded, with decisions
    ("r2", 1, "r3", 3, 800, 60),  # superseded and aborted
    ("r3", 0, "operator", None, 700, 60),  # fenced by an operator, no decision
    ("r4", 2, "r5", None, 600, 60),  # superseded, one gap
    ("r5", 4, None, 12, 5, 60),  # over: a batch aborted, heard from lately
    ("r6", 6, None, None, 500, 60),  # dead: heard from too long ago
    ("r7", 4, None, None, 200, 60),  # live by 3 x its batch interval (gaps up to 90 s)
    ("r8", 0, None, None, 1, 60),  # live by its heartbeat
]


def build(conn: psycopg.Connection[Any], sink: str) -> None:
    conn.execute("INSERT INTO sqlsink.sinks (sink_id) VALUES (%s)", (sink,))
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    now = row[0]  # one clock for every row: whole-second gaps
    batch = 0
    for i, (run, decisions, by, aborted, age, timeout) in enumerate(RUNS):
        conn.execute(
            "INSERT INTO sqlsink.runs (sink_id, run_id, first_seen, heartbeat_at, live_for, "
            "  superseded_at, superseded_by, aborted_batch) "
            "VALUES (%s, %s, %s - make_interval(secs => %s), "
            "  clock_timestamp() - make_interval(secs => %s), make_interval(secs => %s), "
            "  CASE WHEN %s::text IS NULL THEN NULL ELSE %s END, %s, %s)",
            (sink, run, now, 1000 - i, age, timeout, by, now, by, aborted),
        )
        for k in range(decisions):  # gaps of 10, 30, 90, 20, 60 s: not in batch order
            conn.execute(
                "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, run_id, "
                "  decided_at, completed_at) "
                "VALUES (%s, %s, '{}', 0, %s, %s - make_interval(secs => %s), %s)",
                (sink, batch, run, now, 1000 - 10 * i - (0, 10, 40, 130, 150, 210)[k], now),
            )
            batch += 1


def judged(
    conn: psycopg.Connection[Any], sql: str, sink: str | None
) -> tuple[list[tuple[Any, ...]], list[float]]:
    """Every column of every run but its age (the clock moves), and the ages."""
    rows = conn.execute(
        f"{sql} ORDER BY r.sink_id, r.first_seen DESC, r.run_id", {"sink": sink}
    ).fetchall()
    return [(*row[:4], *row[5:]) for row in rows], [float(row[4]) for row in rows]


def test_the_one_pass_judges_every_run_as_the_per_row_lateral_did(
    pg_url: str, keyed: str, sink: str
) -> None:
    other = new_sink()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            ensure_schema(conn)  # type: ignore[arg-type]
            build(conn, sink)
            build(conn, other)
            gid = prepare_by_hand(pg_url, keyed, Gid(sink, 40, 0, "r6", 1), range(2))
            try:
                judge_alike(conn, sink, other)
            finally:
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
        assert prepared_of(pg_url, sink) == []
    finally:
        forget_sink(pg_url, other)


def judge_alike(conn: psycopg.Connection[Any], sink: str, other: str) -> None:
    """Both ways judge every run alike, per sink and for every sink."""
    for of in (sink, other, None):
        before, ages_before = judged(conn, per_row_sql(), of)
        now, ages = judged(conn, run_registry.RUNS_SQL, of)
        print(of, [(row[1], row[5], row[6], row[-1]) for row in now])  # interval, timeout, live
        assert now == before
        assert all(0 <= a - b < 1 for a, b in zip(ages, ages_before, strict=True))
    found = run_registry.runs(conn, sink)  # type: ignore[arg-type]
    states = {r.run_id: (r.state, r.batch_interval_s) for r in found}
    assert states == {
        "r1": ("fenced", 90.0),
        "r2": ("fenced", None),
        "r3": ("fenced", None),
        "r4": ("fenced", 10.0),
        "r5": ("dead", 90.0),
        "r6": ("live", 90.0),  # heard from: its transaction prepared just now
        "r7": ("live", 90.0),
        "r8": ("live", None),
    }
