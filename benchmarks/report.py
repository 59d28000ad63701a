"""The results: a printed table, results.json, results.png (matplotlib, Agg)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil


def write_results(
    results: dict[str, Any],
    out: Path,
    plot: Callable[[dict[str, Any], Path], None] | None,
    say: Callable[[str], None],
) -> None:
    """A stand-alone benchmark's JSON at ``out`` and, unless ``plot`` is None, its plot
    beside it (``out`` with ``.png``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    say(f"wrote {out}")
    if plot is not None:
        plot(results, out.with_suffix(".png"))
        say(f"wrote {out.with_suffix('.png')}")


def machine_facts() -> dict[str, Any]:
    import psycopg
    import pyarrow

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "cpu_model": cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "psycopg": psycopg.__version__,
        "pyarrow": pyarrow.__version__,
        "load_average_at_start": list(os.getloadavg()),
    }


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def ratios(throughput: list[dict[str, Any]]) -> dict[str, float]:
    """exactly_once against the ceiling and the JDBC writer (higher = sqlsink faster)."""
    rate = {t["method"]: t["rows_per_s"] for t in throughput}
    exactly = rate.get("sqlsink exactly_once")
    out: dict[str, float] = {}
    if exactly is None:
        return out
    for name, method in (
        ("exactly_once_vs_ceiling", "ceiling: binary COPY, 1 process"),
        ("exactly_once_vs_jdbc_default", "Spark JDBC, defaults"),
        ("exactly_once_vs_jdbc_rewrite", "Spark JDBC, reWriteBatchedInserts"),
        ("exactly_once_vs_at_least_once", "sqlsink at_least_once"),
        ("exactly_once_vs_noop_floor", "Spark floor: noop sink"),
    ):
        if method in rate:
            out[name] = exactly / rate[method]
    upsert, ceiling = (
        rate.get("sqlsink exactly_once, upsert"),
        rate.get("ceiling: binary COPY, 1 process"),
    )
    if upsert is not None and ceiling is not None:
        out["upsert_vs_ceiling"] = upsert / ceiling
    return out


# -- printing ---------------------------------------------------------------------------------


def print_report(results: dict[str, Any]) -> None:
    measures = results["measures"]
    print()
    if "throughput" in measures:
        print_throughput(measures["throughput"], results.get("ratios", {}))
    if "overhead" in measures:
        print_overhead(measures["overhead"])
    if "memory" in measures:
        print_memory(measures["memory"])
    if "latency" in measures:
        print_latency(measures["latency"])
    if "trap" in measures:
        print_trap(measures["trap"])
    if "scaling" in measures:
        print_scaling(measures["scaling"])
    if "peers" in measures:
        print_peers(measures["peers"])
    if "batch_cost" in measures:
        print_batch_cost(measures["batch_cost"])
    for name, error in results.get("errors", {}).items():
        print(f"!! {name} failed: {error}")


def print_throughput(rows: list[dict[str, Any]], ratio: dict[str, float]) -> None:
    ceiling = next((t["rows_per_s"] for t in rows if t["method"].startswith("ceiling")), None)
    print(f"{'throughput':<36} {'rows':>9} {'median s':>9} {'rows/s':>10} {'/ceiling':>9}  runs")
    for t in rows:
        share = f"{t['rows_per_s'] / ceiling:9.2f}" if ceiling else f"{'':9}"
        runs = ", ".join(f"{s:.2f}" for s in t["seconds"])
        print(
            f"{t['method']:<36} {t['rows']:>9,} {t['median_s']:>9.2f} "
            f"{t['rows_per_s']:>10,.0f} {share}  [{runs}]"
        )
    for name, value in ratio.items():
        print(f"  {name:<34} {value:.2f}")
    print()
    print_cpu(rows)


def print_cpu(rows: list[dict[str, Any]]) -> None:
    """CPU seconds per process group in each method's median run, and how busy the cores were."""
    groups = ("driver", "jvm", "python_workers", "postgres", "rest", "machine_total")
    heads = ("driver", "JVM", "py workers", "PostgreSQL", "rest", "total", "busy")
    print(
        "CPU seconds of the median run (driver: this process and the COPY processes it "
        "forked; rest: anything else running on the machine)"
    )
    print(f"{'':<36}" + "".join(f"{h:>11}" for h in heads))
    cores = os.cpu_count() or 1
    for t in rows:
        cpu = dict(t.get("cpu_s_of_median_run", {}))
        cpu["driver"] = cpu.get("driver", 0.0) + cpu.get("reaped_children", 0.0)
        cells = "".join(f"{cpu.get(g, 0.0):>11.2f}" for g in groups)
        busy = cpu.get("machine_total", 0.0) / (cores * t["median_s"])
        print(f"{t['method']:<36}{cells}{busy:>10.0%}")
    print()


def print_overhead(overhead: dict[str, Any]) -> None:
    print("per-batch cost, ms: median addBatch (triggerExecution) over the steady batches")
    sinks = ("noop", "at_least_once", "exactly_once")
    head = "".join(f"{s:>16}" for s in sinks)
    print(f"{'partitions':>10}{head} {'eo - alo [95% CI]':>22} {'alo - noop':>11}")
    runs = {(r["sink"], r["partitions"]): r for r in overhead["runs"]}
    ci = overhead["ci95"]
    for p, extra in overhead["overhead_ms_by_partitions"].items():
        cells = [runs[(s, int(p))] for s in sinks]
        text = "".join(
            f"{c['median_add_batch_ms']:>9.0f} ({c['median_trigger_ms']:>4.0f})" for c in cells
        )
        low, high = ci["overhead_ms_by_partitions"][p]
        sink_cost = overhead["sink_cost_ms_by_partitions"][p]
        print(f"{p:>10}{text} {extra:>7.1f} [{low:>5.0f}, {high:>5.0f}] {sink_cost:>11.1f}")
    fit = overhead["fit_ms"]
    a_ci, b_ci = ci["per_batch_a"], ci["per_partition_b"]
    print(
        f"  fit: overhead = {fit['per_batch_a']:.1f} ms per batch "
        f"[{a_ci[0]:.0f}, {a_ci[1]:.0f}] + {fit['per_partition_b']:.1f} ms per partition "
        f"[{b_ci[0]:.1f}, {b_ci[1]:.1f}]"
    )
    commits = overhead.get("exactly_once_commit_ms_by_partitions", {})
    if commits:
        cells = ", ".join(f"{ms:.1f} ms at {p}" for p, ms in commits.items())
        print(f"  exactly_once commit on the driver (commit log, median): {cells}")
    print()


def print_memory(memory: dict[str, Any]) -> None:
    print("peak RSS of Spark's Python workers, one partition, exactly_once")
    for run in memory["runs"]:
        print(
            f"  {run['rows']:>10,} rows: peak {run['peak_rss_mb']:7.1f} MB "
            f"({run['peak_process']}), largest before the run {run['idle_rss_mb']:.1f} MB, "
            f"{run['seconds']:.1f} s"
        )
    print(
        f"  {memory['rows_ratio']:.0f}x the rows -> "
        f"{memory['peak_ratio_large_to_small']:.2f}x the peak\n"
    )


def print_latency(latency: dict[str, Any]) -> None:
    print("10-row micro-batch latency, medians (ms)")
    print(f"{'':<22} {'drop->visible':>14} {'trigger->visible':>17} {'triggerExecution':>17}")
    for name, summary in latency.items():
        cells = [
            summary["median_drop_to_visible_ms"],
            summary["median_trigger_to_visible_ms"],
            summary["median_trigger_ms"],
        ]
        text = [f"{c:.0f}" if c is not None else "-" for c in cells]
        print(f"{name:<22} {text[0]:>14} {text[1]:>17} {text[2]:>17}")
    print()


def _spread(figure: dict[str, Any] | None, fmt: str = "{:.2f}") -> str:
    if not figure:
        return "-"
    return (
        f"{fmt.format(figure['median'])} [{fmt.format(figure['min'])}-{fmt.format(figure['max'])}]"
    )


def top_waits(waits: dict[str, Any] | None, count: int = 4) -> str:
    if not waits or not waits.get("share"):
        return "-"
    items = list(waits["share"].items())[:count]
    return ", ".join(f"{name} {share:.0%}" for name, share in items)


def print_trap(trap: dict[str, Any]) -> None:
    print(
        f"interleaved-key trap: {trap['rows']:,} rows (Spark: {trap['batches']} batches); "
        "medians [min-max]; x ref = time / the level's reference"
    )
    print(
        f"{'variant':<62} {'seconds':>18} {'rows/s':>9} {'x ref':>6} "
        f"{'PG CPU-s/M':>18} {'WAL B/row':>9} {'index MB':>8}  waits (share of backend samples)"
    )
    ratio = trap.get("ratios", {})
    for v in trap["variants"]:
        x = next((r for k, r in ratio.items() if k.startswith(v["name"] + " / ")), None)
        wal = v.get("wal_bytes_per_row")
        print(
            f"{('[' + v['level'] + '] ' + v['name'])[:62]:<62} {_spread(v['seconds']):>18} "
            f"{v['rows_per_s']:>9,.0f} {x if x is None else round(x, 2)!s:>6} "
            f"{_spread(v.get('postgres_cpu_s_per_m_rows')):>18} "
            f"{'-' if wal is None else f'{wal:.0f}':>9} {v.get('index_mb') or '-'!s:>8}  "
            f"{top_waits(v.get('waits'))}"
        )
    print()


def print_scaling(scaling: dict[str, Any]) -> None:
    print(
        f"scaling: {scaling['rows']:,} rows, PostgreSQL CPU-s per million rows and rows/s, "
        "medians [min-max]"
    )
    points = {(p["method"], p["partitions"]): p for p in scaling["points"]}
    counts = sorted({p["partitions"] for p in scaling["points"]})
    for method, name in (
        ("sqlsink exactly_once", "sqlsink"),
        ("sqlsink exactly_once, foreachBatch writer", "sqlsink exactly_once, foreachBatch writer"),
    ):
        if not any(m == method for m, _ in points):
            continue
        print(f"  {method} against plain COPY:")
        print(
            f"{'partitions':>10} {'plain COPY CPU-s/M':>22} {'sqlsink CPU-s/M':>22} {'ratio':>6} "
            f"{'COPY rows/s':>12} {'sqlsink rows/s':>15} {'index MB':>15}"
        )
        for p in counts:
            copy, sink = points.get(("plain COPY", p)), points.get((method, p))
            ratio = scaling["ratios"].get(f"server CPU, {name} / COPY at {p}")
            print(
                f"{p:>10} {_spread(copy and copy['postgres_cpu_s_per_m_rows']):>22} "
                f"{_spread(sink and sink['postgres_cpu_s_per_m_rows']):>22} "
                f"{'-' if ratio is None else f'{ratio:.2f}':>6} "
                f"{copy['rows_per_s'] if copy else 0:>12,.0f} "
                f"{sink['rows_per_s'] if sink else 0:>15,.0f} "
                f"{(copy or {}).get('index_mb') or 0:>7.1f} "
                f"{(sink or {}).get('index_mb') or 0:>7.1f}"
            )
    print()


def print_peers(peers: dict[str, Any]) -> None:
    print(f"peers: {peers['rows']:,} rows, medians [min-max]")
    print(
        f"{'method':<56} {'seconds':>18} {'rows/s':>9} {'PG CPU-s/M':>18}  "
        "machine CPU-s/M: JVM + Python workers + PostgreSQL + driver + rest"
    )
    for m in peers["methods"]:
        split = m.get("cpu_s_per_m_rows") or {}
        parts = ("jvm", "python_workers", "postgres", "driver", "rest")
        where = " + ".join(f"{split.get(g, 0.0):.2f}" for g in parts)
        print(
            f"{m['method']:<56} {_spread(m['seconds']):>18} {m['rows_per_s']:>9,.0f} "
            f"{_spread(m.get('postgres_cpu_s_per_m_rows')):>18}  "
            f"{split.get('machine_total', 0.0):.2f} = {where}"
        )
    for name, value in peers.get("ratios", {}).items():
        print(f"  {name:<100} {value:.2f}x")
    print()


def _median_ci(figure: dict[str, Any] | None) -> str:
    if not figure:
        return "-"
    low, high = figure["ci95"]
    return f"{figure['median']:.0f} [{low:.0f}, {high:.0f}]"


def print_batch_cost(cost: dict[str, Any]) -> None:
    print(
        f"per-batch cost: {cost['rows_per_batch']}-row batches, {cost['partitions']} partitions, "
        f"trigger every {cost['trigger']}; ms, median [95% CI]"
    )
    keys = ("trigger_to_visible_ms", "trigger_ms", "add_batch_ms", "commit_ms")
    heads = ("trigger->visible", "triggerExecution", "addBatch", "commit_ms")
    print(f"{'sink':<15} {'batches':>7}" + "".join(f" {h:>20}" for h in heads))
    for sink, figures in cost["sinks"].items():
        n = max((f["n"] for f in figures.values() if f), default=0)
        print(f"{sink:<15} {n:>7}" + "".join(f" {_median_ci(figures.get(k)):>20}" for k in keys))
    for name, value in cost.get("ratios", {}).items():
        print(f"  {name:<55} {value:.2f}")
    counted = cost.get("statements")
    if counted:
        per = ", ".join(f"{k} {v:.1f}" for k, v in counted["statements_per_batch"].items())
        conns = ", ".join(f"{k} {v:.1f}" for k, v in counted["connections_per_batch"].items())
        print(f"  statements per batch ({counted['batches']} batches logged): {per}")
        print(f"  connections per batch: {conns}")
        print(
            "  the driver's commit, statements per batch: "
            f"{counted.get('driver_commit_statements')}"
        )
    print()


# -- files ------------------------------------------------------------------------------------


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")


def write_plot(results: dict[str, Any], path: Path) -> None:
    """Left: rows/s per method, the ceiling as a line. Right: overhead ms vs partitions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5), width_ratios=(3, 2))
    plot_throughput(left, results["measures"].get("throughput", []))
    plot_overhead(right, results["measures"].get("overhead"))
    facts = results["machine"]
    fig.suptitle(
        f"sqlsink benchmark: {results['config']['rows']:,} rows, {facts['cpu_count']} CPUs, "
        f"PostgreSQL {results['postgres'].get('server_version', '?')}, "
        f"Spark {results['spark'].get('spark', '?')}, {facts['date'][:10]}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_round2_plot(results: dict[str, Any], path: Path) -> None:
    """Issue 16's measures: the trap, scaling, the peers, the per-batch cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = results["measures"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    plot_trap(axes[0][0], measures.get("trap"))
    plot_scaling(axes[0][1], measures.get("scaling"))
    plot_peers(axes[1][0], measures.get("peers"))
    plot_batch_cost(axes[1][1], measures.get("batch_cost"))
    facts = results["machine"]
    fig.suptitle(
        f"sqlsink benchmark, issue 16: {facts['cpu_count']} CPUs, "
        f"PostgreSQL {results['postgres'].get('server_version', '?')}, "
        f"Spark {results.get('spark', {}).get('spark', '?')}, {facts['date'][:10]}, "
        f"load average at start {facts['load_average_at_start'][0]:.1f}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_trap(ax: Any, trap: dict[str, Any] | None) -> None:
    """PostgreSQL's CPU per row: the trap's robust figure (the wall time carries the load)."""
    ax.set_title("interleaved-key trap: PostgreSQL CPU-s per million rows (median, min-max)")
    if not trap:
        return
    variants = [v for v in trap["variants"] if v.get("postgres_cpu_s_per_m_rows")]
    variants = [v for v in variants if "noop" not in v["name"]]
    names = [("[S] " if v["level"] == "spark" else "[PG] ") + v["name"] for v in variants]
    cpu = [v["postgres_cpu_s_per_m_rows"] for v in variants]
    med = [c["median"] for c in cpu]
    err = [[m - c["min"] for m, c in zip(med, cpu, strict=True)]]
    err.append([c["max"] - m for m, c in zip(med, cpu, strict=True)])
    colors = ["#1f77b4" if v["level"] == "spark" else "#2ca02c" for v in variants]
    ys = list(range(len(variants)))[::-1]
    ax.barh(ys, med, color=colors, xerr=err)
    for y, v, m in zip(ys, variants, med, strict=True):
        shares = (v.get("waits") or {}).get("share", {})
        lwlock = sum(x for k, x in shares.items() if k.startswith("LWLock"))
        ax.annotate(
            f" {m:.2f}, {v['rows_per_s'] / 1000:.0f}k rows/s, LWLock {lwlock:.0%}",
            (m, y),
            va="center",
            fontsize=7,
        )
    ax.set_yticks(ys, [n[:70] for n in names], fontsize=7)
    ax.set_xlabel(
        "server CPU-s per million rows ([S] through Spark into sqlsink, [PG] COPY alone); "
        "annotated: rows/s, LWLock share of the waits"
    )


def plot_scaling(ax: Any, scaling: dict[str, Any] | None) -> None:
    ax.set_title("scaling: PostgreSQL CPU-s per million rows (median, min-max)")
    ax.set_xlabel("partitions / COPY processes")
    ax.set_ylabel("server CPU-s per million rows")
    if not scaling:
        return
    for method, color in (
        ("plain COPY", "#7f7f7f"),
        ("sqlsink exactly_once", "#d62728"),
        ("sqlsink exactly_once, foreachBatch writer", "#1f77b4"),
    ):
        pts = sorted(
            (p for p in scaling["points"] if p["method"] == method), key=lambda p: p["partitions"]
        )
        pts = [p for p in pts if p["postgres_cpu_s_per_m_rows"]]
        if not pts:
            continue
        xs = [p["partitions"] for p in pts]
        med = [p["postgres_cpu_s_per_m_rows"]["median"] for p in pts]
        err = [
            [m - p["postgres_cpu_s_per_m_rows"]["min"] for m, p in zip(med, pts, strict=True)],
            [p["postgres_cpu_s_per_m_rows"]["max"] - m for m, p in zip(med, pts, strict=True)],
        ]
        ax.errorbar(xs, med, yerr=err, fmt="o-", color=color, capsize=4, label=method)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.legend()


def plot_peers(ax: Any, peers: dict[str, Any] | None) -> None:
    ax.set_title("peers in the same run: rows/s (median, min-max)")
    if not peers:
        return
    methods = [m for m in peers["methods"] if m.get("kind") != "floor"]  # off the scale
    rates = [m["rows_per_s"] / 1000 for m in methods]
    lows = [m["rows"] / m["seconds"]["max"] / 1000 for m in methods]
    highs = [m["rows"] / m["seconds"]["min"] / 1000 for m in methods]
    colors = ["#d62728" if "sqlsink" in m["method"] else "#ff7f0e" for m in methods]
    xs = list(range(len(methods)))
    ax.bar(
        xs,
        rates,
        color=colors,
        yerr=[
            [r - lo for r, lo in zip(rates, lows, strict=True)],
            [h - r for r, h in zip(rates, highs, strict=True)],
        ],
        capsize=4,
    )
    for x, r in zip(xs, rates, strict=True):
        ax.annotate(f"{r:.0f}k", (x, r), ha="center", va="bottom")
    short = {
        "hand-written upsert, executemany": "hand-written\nupsert,\nexecutemany",
        "hand-written upsert, multi-row VALUES (1,000 rows)": "hand-written\nupsert,\nVALUES",
        "sqlsink exactly_once, upsert": "sqlsink\nexactly_once,\nupsert",
        "sqlsink exactly_once, append": "sqlsink\nexactly_once,\nappend",
        "Spark JDBC via foreachBatch, reWriteBatchedInserts": "Spark JDBC,\nreWrite…",
        "Spark noop sink (Spark's own floor)": "Spark\nnoop",
    }
    ax.set_xticks(xs, [short.get(m["method"], wrap(m["method"])) for m in methods], fontsize=7)
    ax.set_ylabel("thousand rows/s")


def plot_batch_cost(ax: Any, cost: dict[str, Any] | None) -> None:
    ax.set_title("10-row batches: ms, median with 95% interval")
    if not cost:
        return
    labels, values, errors = [], [], []
    for sink, figures in cost["sinks"].items():
        for key, label in (
            ("trigger_to_visible_ms", "trigger->visible"),
            ("trigger_ms", "triggerExecution"),
            ("commit_ms", "commit_ms"),
        ):
            figure = figures.get(key)
            if figure:
                labels.append(f"{sink}\n{label}")
                values.append(figure["median"])
                errors.append(
                    (figure["median"] - figure["ci95"][0], figure["ci95"][1] - figure["median"])
                )
    xs = list(range(len(values)))
    ax.bar(
        xs,
        values,
        yerr=[[e[0] for e in errors], [e[1] for e in errors]],
        capsize=4,
        color="#1f77b4",
    )
    for x, v in zip(xs, values, strict=True):
        ax.annotate(f"{v:.0f}", (x, v), ha="center", va="bottom")
    ax.set_xticks(xs, labels, fontsize=7)
    ax.set_ylabel("ms")


def plot_throughput(ax: Any, rows: list[dict[str, Any]]) -> None:
    bars = [t for t in rows if not t["method"].startswith("ceiling")]
    ceiling = next((t for t in rows if t["method"].startswith("ceiling")), None)
    colors = ["#d62728" if "exactly_once" in t["method"] else "#1f77b4" for t in bars]
    colors = [
        "#7f7f7f"
        if "noop" in t["method"] or "COPY" in t["method"]
        else "#ff7f0e"
        if "JDBC" in t["method"]
        else c
        for t, c in zip(bars, colors, strict=True)
    ]
    positions = range(len(bars))
    ax.bar(positions, [t["rows_per_s"] / 1000 for t in bars], color=colors)
    for x, t in zip(positions, bars, strict=True):
        ax.annotate(
            f"{t['rows_per_s'] / 1000:.0f}k", (x, t["rows_per_s"] / 1000), ha="center", va="bottom"
        )
    if ceiling:
        ax.axhline(ceiling["rows_per_s"] / 1000, color="black", linestyle="--")
        ax.annotate(
            f"ceiling: binary COPY, 1 process ({ceiling['rows_per_s'] / 1000:.0f}k)",
            (-0.4, ceiling["rows_per_s"] / 1000),
            va="bottom",
        )
    ax.set_xticks(list(positions), [wrap(t["method"]) for t in bars], fontsize=8)
    ax.set_ylabel("thousand rows/s (median)")
    ax.set_title("throughput")


def wrap(label: str) -> str:
    label = label.replace("reWriteBatchedInserts", "reWrite-\nBatchedInserts")
    return label.replace(", ", ",\n").replace("sqlsink ", "sqlsink\n").replace(": ", ":\n")


def plot_overhead(ax: Any, overhead: dict[str, Any] | None) -> None:
    ax.set_title("exactly_once over at_least_once, per batch")
    ax.set_xlabel("partitions per batch")
    ax.set_ylabel("ms per batch")
    if not overhead:
        return
    points = {int(p): ms for p, ms in overhead["overhead_ms_by_partitions"].items()}
    fit = overhead["fit_ms"]
    xs = sorted(points)
    ci = overhead["ci95"]["overhead_ms_by_partitions"]
    errors = [
        [max(0.0, points[x] - ci[str(x)][0]) for x in xs],
        [max(0.0, ci[str(x)][1] - points[x]) for x in xs],
    ]
    ax.errorbar(
        xs,
        [points[x] for x in xs],
        yerr=errors,
        fmt="o",
        color="#d62728",
        capsize=4,
        label="measured (median difference, 95% CI)",
    )
    line = [fit["per_batch_a"] + fit["per_partition_b"] * x for x in [0, *xs]]
    ax.plot(
        [0, *xs],
        line,
        "--",
        color="black",
        label=f"{fit['per_batch_a']:.1f} + {fit['per_partition_b']:.1f}·p ms",
    )
    ax.set_xlim(left=0)
    ax.set_xticks([0, *xs])
    ax.legend()
