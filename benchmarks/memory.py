"""Measure 5: peak RSS of Spark's Python workers while one partition of N, then 10·N rows is
written with exactly_once: a sink that streams its rows keeps the peak flat.

A sampler thread walks the process tree under this driver (the JVM and every Python process
it started: the worker daemon, its forked workers, the data source's planner and commit
workers) every 50 ms and keeps each Python process's largest RSS.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from server import TABLE, check_rows, reset_table
from streaming import Sink, read_stream, run_available_now
from workload import Dataset

MB = 1 << 20


def python_descendants() -> list[psutil.Process]:
    """The Python processes under this one (Spark's workers), not this driver itself."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name().startswith("python"):
                found.append(process)
        except psutil.Error:
            continue
    return found


def worker_role(process: psutil.Process) -> str:
    """E.g. 'pyspark.worker (forked)': the module the daemon runs; forked = a worker proper."""
    try:
        args = process.cmdline()
        parent = process.parent()
        forked = parent is not None and parent.name().startswith("python")
    except psutil.Error:
        return "?"
    return f"{args[-1] if args else '?'} ({'forked' if forked else 'daemon'})"


@dataclass
class RssSampler:
    """Max RSS per Python descendant, sampled every ``interval_s`` in a thread."""

    interval_s: float = 0.05
    peaks: dict[int, tuple[int, str]] = field(default_factory=dict)
    samples: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        for process in python_descendants():
            try:
                rss = process.memory_info().rss
            except psutil.Error:
                continue
            best = self.peaks.get(process.pid)
            if best is None or rss > best[0]:
                self.peaks[process.pid] = (rss, best[1] if best else worker_role(process))
        self.samples += 1

    def peak(self) -> tuple[int, str]:
        return max(self.peaks.values(), default=(0, "none"))


@dataclass(frozen=True)
class MemoryRun:
    rows: int
    partitions: int
    seconds: float
    peak_rss_mb: float
    peak_process: str
    idle_rss_mb: float  # largest Python worker just before the run
    samples: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_peak_rss(spark: Any, url: str, dataset: Dataset, checkpoints: Path) -> MemoryRun:
    """All of ``dataset`` in one batch and one partition, exactly_once."""
    reset_table(url)
    idle = RssSampler()
    idle.sample()
    frame = read_stream(spark, dataset.path).coalesce(1)
    with RssSampler() as sampler:
        run = run_available_now(frame, Sink.sqlsink(url, TABLE, "exactly_once"), checkpoints)
    check_rows(url, dataset.rows, "memory run")
    peak, role = sampler.peak()
    return MemoryRun(
        rows=dataset.rows,
        partitions=1,
        seconds=run.seconds,
        peak_rss_mb=peak / MB,
        peak_process=role,
        idle_rss_mb=idle.peak()[0] / MB,
        samples=sampler.samples,
    )


def measure_memory(
    spark: Any, url: str, small: Dataset, large: Dataset, checkpoints: Path
) -> dict[str, Any]:
    runs = [measure_peak_rss(spark, url, d, checkpoints) for d in (small, large)]
    return {
        "runs": [r.as_dict() for r in runs],
        "peak_ratio_large_to_small": runs[1].peak_rss_mb / runs[0].peak_rss_mb,
        "rows_ratio": large.rows / small.rows,
    }
