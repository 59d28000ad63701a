"""The results: a printed table, results.json, results.png (matplotlib, Agg)."""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil


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
