"""What reading through the consistent view costs (option consistentView, issue 13).

    .venv/bin/python benchmarks/view_cost.py [--rows 1000000] [--runs 25] [--url URL]
                                             [--out benchmarks/results/view_cost.json] [--no-plot]

No Spark: the view's cost is the server's. An embedded PostgreSQL (as for run.py, unless
--url) gets a table of ``--rows`` benchmark rows (primary key on ``id``), vacuumed so that
index-only scans are possible, and the sink's view of it (``sqlsink.postgres.views``,
created as the committer creates it). Then, in three states of the sink:

- ``nothing in flight``: no marker of the sink visible (the common case, what the 1.1x
  target is about);
- ``in flight, 2 hidden``: a batch of 3 partitions, 2 committed (1,000 rows each, hidden
  by the view) and 1 prepared, as a reader sees it between two COMMIT PREPAREDs or after
  a driver died mid-commit (for information);
- ``in flight, 100 hidden``: the same with 100 committed partitions (the filter compares
  each row's xmin with every hidden partition's xid: linear in their number).

each of these queries runs on the table and on the view, ``--runs`` rounds, every query
once per round and the table and the view in alternating order (so that a change of load
hits both alike):

- ``count(*)``: ``SELECT count(*)``, one query;
- ``key lookup``: ``SELECT * ... WHERE id = $1`` for 200 random ids (the same for table
  and view in a round), planned every time (psycopg without server-side prepare: what an
  ad hoc reader pays), mean per lookup;
- ``key lookup, prepared``: the same as a prepared statement (plan cached: what an
  application with a driver that prepares pays), mean per lookup.

With nothing in flight, two more relations run in the same rounds, for reference (they
are not consistent views): ``bare view`` (``SELECT <columns> FROM <table>``: what any
view costs) and ``gate only`` (the table under ``WHERE NOT EXISTS (a marker of the
sink)``: the cheapest check of the markers a query can make, one probe and a one-time
filter; it hides nothing when a batch is in flight, so it is a floor, not a design) and
``any gate`` (the table under ``WHERE (SELECT true)``: a check that reads nothing at all,
decided while the query runs; what any such check costs before it reads anything, the
floor of every design that decides in the reader's snapshot).

Client wall time, round trip included. Prints medians with p10-p90, min-max, the ratio
of the medians view/table and the median (p10-p90) of the ratios of each round's pair;
writes every sample, the statistics, the load average before and after each state and
EXPLAIN (ANALYZE, BUFFERS) of each query into the JSON, and a plot beside it. See the
README's Benchmarks section.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from report import machine_facts, write_results
from server import postgres, server_facts
from workload import COPY_TYPES, TABLE_DDL, make_rows

from sqlsink.core.gid import Gid
from sqlsink.postgres import views
from sqlsink.postgres.schema import ensure_schema
from sqlsink.tablename import TableName

HERE = Path(__file__).resolve().parent
TABLE = TableName("public", "view_cost_rows")
VIEW = TableName("public", "view_cost_whole")
BARE_VIEW = TableName("public", "view_cost_bare")  # reference: any view
GATE_ONLY = TableName("public", "view_cost_gate")  # reference: the cheapest check of the markers
ANY_GATE = TableName("public", "view_cost_any_gate")  # reference: any run-time check (floor)
REFERENCES = {"bare view": BARE_VIEW, "gate only": GATE_ONLY, "any gate": ANY_GATE}
SINK = "bench-view-cost"
RUN = "bench-run"
LOOKUPS = 200  # key lookups per sample
PARTITION_ROWS = 1_000  # rows of each in-flight partition
STATES = ("nothing in flight", "in flight, 2 hidden", "in flight, 100 hidden")
QUERIES = ("count(*)", "key lookup", "key lookup, prepared")
Conn = psycopg.Connection[tuple[Any, ...]]


def say(message: str) -> None:
    print(f"[view_cost {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the table and the view ------------------------------------------------------------------


def load(conn: Conn, rows: int) -> None:
    """The table, filled by COPY in chunks, vacuumed (visibility map: index-only scans)."""
    for view in (VIEW, *REFERENCES.values()):
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view.identifier()))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(TABLE.identifier()))
    conn.execute(TABLE_DDL.format(table=TABLE.identifier().as_string(conn)))
    chunk = 200_000
    for first in range(0, rows, chunk):
        table = make_rows(first, min(chunk, rows - first))
        tuples = zip(*(c.to_pylist() for c in table.columns), strict=True)
        copy = sql.SQL("COPY {} (id, ts, n, x, s) FROM STDIN (FORMAT BINARY)")
        with conn.cursor() as cur, cur.copy(copy.format(TABLE.identifier())) as c:
            c.set_types(list(COPY_TYPES))
            for row in tuples:
                c.write_row(row)
    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(TABLE.identifier()))
    conn.execute("CHECKPOINT")
    conn.execute(
        sql.SQL("CREATE VIEW {} AS SELECT * FROM {}").format(
            BARE_VIEW.identifier(), TABLE.identifier()
        )
    )
    conn.execute(
        sql.SQL(
            "CREATE VIEW {} AS SELECT * FROM {} "
            "WHERE NOT EXISTS (SELECT FROM sqlsink.markers WHERE sink_id = {})"
        ).format(GATE_ONLY.identifier(), TABLE.identifier(), sql.Literal(SINK))
    )
    conn.execute(
        sql.SQL("CREATE VIEW {} AS SELECT * FROM {} WHERE (SELECT true)").format(
            ANY_GATE.identifier(), TABLE.identifier()
        )
    )


def forget(conn: Conn) -> None:
    """The bench sink's traces: its prepared transactions, markers, log rows."""
    for (gid,) in conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s AND database = current_database()",
        ("sqlsink\\_" + SINK + "\\_%",),
    ).fetchall():
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    conn.execute("SELECT set_config('sqlsink.forget', %s, false)", (SINK,))
    for table in ("markers", "decisions", "runs", "sinks"):
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE sink_id = %s").format(sql.Identifier("sqlsink", table)),
            (SINK,),
        )


def partition(url: str, batch: int, number: int, first: int, *, commit: bool) -> None:
    """One partition transaction as the sink's: rows, marker, PREPARE; then COMMIT PREPARED."""
    gid = str(Gid(SINK, batch, number, RUN, batch * 1000 + number + 1))
    with psycopg.connect(url) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, now(), 0, 0, 'in flight' "
                "FROM generate_series(%s::bigint, %s::bigint) AS g"
            ).format(TABLE.identifier()),
            (first, first + PARTITION_ROWS - 1),
        )
        conn.execute(
            "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
            "VALUES (%s, %s, %s, %s, %s)",
            (gid, SINK, batch, number, PARTITION_ROWS),
        )
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    if commit:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))


def set_state(url: str, state: str, rows: int) -> int:
    """Put the sink in ``state``; the rows the view hides then."""
    if state == "nothing in flight":
        return 0
    hidden = 2 if state == "in flight, 2 hidden" else 100
    batch = hidden  # a batch of its own per state
    first = rows + 10_000_000 * batch
    for number in range(hidden + 1):  # the last one stays prepared
        partition(url, batch, number, first + number * PARTITION_ROWS, commit=number < hidden)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE sqlsink.markers")
    return hidden * PARTITION_ROWS


# -- measuring -------------------------------------------------------------------------------


def one_sample(conn: Conn, query: str, relation: TableName, ids: list[int]) -> float:
    """Seconds for one sample of ``query`` on ``relation`` (per lookup for the lookups)."""
    if query == "count(*)":
        statement = sql.SQL("SELECT count(*) FROM {}").format(relation.identifier())
        started = time.perf_counter()
        conn.execute(statement).fetchone()
        return time.perf_counter() - started
    statement = sql.SQL("SELECT * FROM {} WHERE id = %s").format(relation.identifier())
    prepare = query.endswith("prepared")
    started = time.perf_counter()
    for key in ids:
        conn.execute(statement, (key,), prepare=prepare).fetchone()
    return (time.perf_counter() - started) / len(ids)


def measure(
    conn: Conn, runs: int, rows: int, rng: random.Random, *, references: bool = False
) -> dict[str, dict[str, Any]]:
    """``runs`` rounds of every query on the table and on the view (and the reference
    relations), interleaved: each round in the opposite order of the one before."""
    targets = {"table": TABLE, "view": VIEW, **(REFERENCES if references else {})}
    samples: dict[str, dict[str, list[float]]] = {q: {t: [] for t in targets} for q in QUERIES}
    for _ in range(2):  # caches and the prepared statements, not recorded
        for query in QUERIES:
            for relation in targets.values():
                one_sample(conn, query, relation, [rng.randrange(rows) for _ in range(20)])
    names = list(targets)
    for number in range(runs):
        order = names if number % 2 == 0 else names[::-1]
        for query in QUERIES:
            ids = [rng.randrange(rows) for _ in range(LOOKUPS)]
            for target in order:
                samples[query][target].append(one_sample(conn, query, targets[target], ids))
    out: dict[str, dict[str, Any]] = {}
    for query, by_target in samples.items():
        table = statistics.median(by_target["table"])
        out[query] = {
            "table": summary(by_target["table"]),
            "view": summary(by_target["view"]),
            "ratio_of_medians": statistics.median(by_target["view"]) / table,
            "ratio_paired": paired(by_target["view"], by_target["table"]),
        }
        if references:
            out[query]["references"] = {
                name: {
                    **summary(by_target[name]),
                    "ratio_of_medians": statistics.median(by_target[name]) / table,
                    "ratio_paired": paired(by_target[name], by_target["table"]),
                }
                for name in REFERENCES
            }
    return out


def paired(view: list[float], table: list[float]) -> dict[str, float]:
    """The ratio view/table of each round (the two ran back to back, under the same
    load): median and p10-p90. Less disturbed by a change of load than the ratio of
    the medians."""
    ratios = sorted(v / t for v, t in zip(view, table, strict=True))
    deciles = statistics.quantiles(ratios, n=10)
    return {"median": statistics.median(ratios), "p10": deciles[0], "p90": deciles[-1]}


def summary(seconds: list[float]) -> dict[str, Any]:
    ms = sorted(s * 1000 for s in seconds)
    deciles = statistics.quantiles(ms, n=10)
    return {
        "median_ms": statistics.median(ms),
        "p10_ms": deciles[0],
        "p90_ms": deciles[-1],
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "runs": len(ms),
        "samples_ms": [round(s * 1000, 4) for s in seconds],
    }


def plans(conn: Conn, *, references: bool = False) -> dict[str, list[str]]:
    """EXPLAIN (ANALYZE, BUFFERS) of count(*) and of one key lookup, on the table, the
    view (and the reference relations)."""
    out = {}
    relations = {"table": TABLE, "view": VIEW, **(REFERENCES if references else {})}
    for name, relation in relations.items():
        for query, text in (
            ("count(*)", "SELECT count(*) FROM {}"),
            ("key lookup", "SELECT * FROM {} WHERE id = 4242"),
        ):
            explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + text)
            rows = conn.execute(explain.format(relation.identifier())).fetchall()
            out[f"{query} on the {name}"] = [str(r[0]) for r in rows]
    return out


def check_counts(conn: Conn, hidden: int) -> dict[str, int]:
    """The view must hide exactly the committed partitions of the batch in flight."""
    row = conn.execute(
        sql.SQL("SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {})").format(
            TABLE.identifier(), VIEW.identifier()
        )
    ).fetchone()
    assert row is not None
    table, view = int(row[0]), int(row[1])
    if table - view != hidden:
        raise RuntimeError(f"the view hides {table - view} rows, expected {hidden}")
    return {"table_rows": table, "view_rows": view}


# -- the report --------------------------------------------------------------------------------


def print_report(results: dict[str, Any]) -> None:
    print()
    print(f"{results['config']['rows']:,} rows, {results['config']['runs']} interleaved runs")
    head = f"{'state':24} {'query':22} {'table ms (p10-p90)':>26} {'view ms (p10-p90)':>26}"
    print(f"{head} ratio  paired (p10-p90)")
    for state, measured in results["states"].items():
        for query, m in measured["queries"].items():
            t, v = m["table"], m["view"]
            row = f"{state:24} {query:22} {fmt(t):>26} {fmt(v):>26}"
            print(f"{row} {m['ratio_of_medians']:5.2f}x {fmt_paired(m['ratio_paired'])}")
            for name, r in m.get("references", {}).items():
                row = f"{'':24} {'  ' + name + ' (reference)':22} {'':>26} {fmt(r):>26}"
                print(f"{row} {r['ratio_of_medians']:5.2f}x {fmt_paired(r['ratio_paired'])}")
        load = measured["load_average_before"][0], measured["load_average_after"][0]
        print(f"{'':24} load average {load[0]:.1f} before, {load[1]:.1f} after")


def fmt_paired(p: dict[str, float]) -> str:
    return f"{p['median']:.2f}x ({p['p10']:.2f}-{p['p90']:.2f})"


def fmt(s: dict[str, Any]) -> str:
    digits = 3 if s["median_ms"] < 1 else 1
    return f"{s['median_ms']:.{digits}f} ({s['p10_ms']:.{digits}f}-{s['p90_ms']:.{digits}f})"


def write_plot(results: dict[str, Any], path: Path) -> None:
    """One panel per query: table and view per state, median bars, p10-p90 whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(QUERIES), figsize=(15, 5))
    states = list(results["states"])
    for ax, query in zip(axes, QUERIES, strict=True):
        for offset, target, color in ((-0.2, "table", "#7f7f7f"), (0.2, "view", "#d62728")):
            stats = [results["states"][s]["queries"][query][target] for s in states]
            medians = [s["median_ms"] for s in stats]
            errors = [
                [m - s["p10_ms"] for m, s in zip(medians, stats, strict=True)],
                [s["p90_ms"] - m for m, s in zip(medians, stats, strict=True)],
            ]
            xs = [x + offset for x in range(len(states))]
            ax.bar(xs, medians, 0.4, yerr=errors, capsize=3, color=color, label=target)
        for x, state in enumerate(states):
            ratio = results["states"][state]["queries"][query]["ratio_of_medians"]
            top = max(
                results["states"][state]["queries"][query][t]["p90_ms"] for t in ("table", "view")
            )
            ax.annotate(f"{ratio:.2f}x", (x, top), ha="center", va="bottom")
        ax.set_xticks(range(len(states)), [s.replace(", ", ",\n") for s in states], fontsize=8)
        unit = "ms per lookup" if "lookup" in query else "ms per query"
        ax.set_ylabel(f"{unit} (median, p10-p90)")
        ax.set_title(query)
        ax.legend(loc="upper left")
    facts = results["machine"]
    fig.suptitle(
        f"reading through the consistent view: {results['config']['rows']:,} rows, "
        f"{results['config']['runs']} interleaved runs, {facts['cpu_count']} CPUs, "
        f"PostgreSQL {results['postgres'].get('server_version', '?')}, {facts['date'][:10]}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command -------------------------------------------------------------------------------


def run(url: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    rng = random.Random(args.seed)
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)
        forget(conn)
        say(f"loading {args.rows:,} rows ...")
        load(conn, args.rows)
        assert views.keep_view(conn, VIEW, TABLE, SINK) == "created"
        results["postgres"] = server_facts(url)
    try:
        for state in STATES:
            say(f"{state} ...")
            hidden = set_state(url, state, args.rows)
            # never prepared on its own: each query says (prepare=None would forbid it)
            references = state == "nothing in flight"
            with psycopg.connect(url, autocommit=True, prepare_threshold=2**31) as conn:
                counts = check_counts(conn, hidden)
                load_before = list(os.getloadavg())
                started = time.perf_counter()
                measured = measure(conn, args.runs, args.rows, rng, references=references)
                results["states"][state] = {
                    "hidden_rows": hidden,
                    **counts,
                    "load_average_before": load_before,
                    "load_average_after": list(os.getloadavg()),
                    "seconds": time.perf_counter() - started,
                    "queries": measured,
                    "plans": plans(conn, references=references),
                }
            with psycopg.connect(url, autocommit=True) as conn:
                forget(conn)  # the next state starts from nothing in flight, vacuumed
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE id >= %s").format(TABLE.identifier()),
                    (args.rows,),
                )
                conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(TABLE.identifier()))
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            forget(conn)
            if args.url:  # an existing server: leave nothing behind
                for view in (VIEW, *REFERENCES.values()):
                    conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view.identifier()))
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(TABLE.identifier()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=25, help="interleaved rounds (>= 20)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--url", help="an existing PostgreSQL (max_prepared_transactions > 0)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "view_cost.json")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "config": {"rows": args.rows, "runs": args.runs, "lookups_per_sample": LOOKUPS},
        "machine": machine_facts(),
        "states": {},
    }
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="sqlsink-view-cost-") as base,
        postgres(args.url, Path(base)) as url,
    ):
        run(url, args, results)
    results["machine"]["total_seconds"] = time.perf_counter() - started
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    print_report(results)
    write_results(results, args.out, None if args.no_plot else write_plot, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
