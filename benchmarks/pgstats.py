"""What the server did during a run: wait events sampled from pg_stat_activity, WAL volume
(pg_stat_wal), PostgreSQL's CPU seconds (``cpu.settled_postgres_s``), the load average.

``WaitSampler`` polls ``pg_stat_activity`` from a thread of its own every ``interval_s``
and counts, for every *active* backend whose ``application_name`` matches a pattern, its
``wait_event_type:wait_event`` ("CPU" when it waits for nothing: running, or runnable and
waiting for a core). ``Client:ClientRead`` while active is a backend waiting for the client's
next COPY data. The shares are of backend-samples: 0.4 for ``LWLock:BufferContent`` means
that on average 40% of the loading backends were waiting for a buffer's content lock.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from cpu import settled_postgres_s

SAMPLER_APP = "bench sampler"


@dataclass
class WaitSampler:
    """``with WaitSampler(url, "sqlsink sink %") as waits: ...`` then ``waits.summary()``."""

    url: str
    like: str
    interval_s: float = 0.02
    counts: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    busy_samples: int = 0  # samples that saw at least one matching active backend

    def __enter__(self) -> WaitSampler:
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="wait-sampler", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        query = (
            "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) "
            "FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND application_name LIKE %s GROUP BY 1"
        )
        try:
            with psycopg.connect(self.url, autocommit=True, application_name=SAMPLER_APP) as c:
                c.execute("SET jit = off")
                self._ready.set()
                while not self._stop.is_set():
                    rows = c.execute(query, (self.like,)).fetchall()
                    self.samples += 1
                    if rows:
                        self.busy_samples += 1
                    for event, count in rows:
                        self.counts[str(event)] += int(count)
                    time.sleep(self.interval_s)
        except BaseException as exc:  # reported by summary(), never kills the run
            self._error = exc
            self._ready.set()

    def summary(self) -> dict[str, Any]:
        total = sum(self.counts.values())
        share = {k: round(v / total, 4) for k, v in self.counts.most_common()} if total else {}
        return {
            "samples": self.samples,
            "interval_s": self.interval_s,
            "mean_active_backends": round(total / self.busy_samples, 2)
            if self.busy_samples
            else 0.0,
            "share": share,
            **({"error": repr(self._error)} if self._error else {}),
        }


def merge_waits(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The wait shares pooled over several runs (weighted by their backend-samples)."""
    pooled: Counter[str] = Counter()
    samples = 0
    for s in summaries:
        weight = s["samples"] * max(s["mean_active_backends"], 1e-9)
        samples += s["samples"]
        for event, share in s["share"].items():
            pooled[event] += share * weight
    total = sum(pooled.values())
    return {
        "samples": samples,
        "share": {k: round(v / total, 4) for k, v in pooled.most_common()} if total else {},
    }


def wal_counters(url: str) -> dict[str, float]:
    """pg_stat_wal's cumulative counters (PostgreSQL 14+; empty before)."""
    try:
        with psycopg.connect(url, autocommit=True, application_name=SAMPLER_APP) as conn:
            row = conn.execute(
                "SELECT wal_records, wal_fpi, wal_bytes, wal_buffers_full FROM pg_stat_wal"
            ).fetchone()
    except psycopg.Error:
        return {}
    if row is None:
        return {}
    names = ("wal_records", "wal_fpi", "wal_bytes", "wal_buffers_full")
    return dict(zip(names, map(float, row), strict=True))


@dataclass
class ServerMeter:
    """``with ServerMeter(url) as m: ...`` then ``m.result``: PostgreSQL's CPU seconds, the
    WAL written, the wall time and the load average around the block."""

    url: str
    result: dict[str, Any] = field(default_factory=dict)

    def __enter__(self) -> ServerMeter:
        self._wal = wal_counters(self.url)
        self._cpu = settled_postgres_s()
        self._load = os.getloadavg()[0]
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._started
        cpu = settled_postgres_s()
        wal = wal_counters(self.url)
        self.result = {
            "wall_s": wall,
            "postgres_cpu_s": None if cpu is None or self._cpu is None else cpu - self._cpu,
            "load_1m_before": round(self._load, 2),
            "load_1m_after": round(os.getloadavg()[0], 2),
            **{k: wal[k] - self._wal.get(k, 0.0) for k in wal},
        }


def relation_mb(url: str, name: str) -> float | None:
    with psycopg.connect(url, autocommit=True, application_name=SAMPLER_APP) as conn:
        row = conn.execute("SELECT pg_relation_size(to_regclass(%s))", (name,)).fetchone()
    return None if row is None or row[0] is None else round(int(row[0]) / 2**20, 2)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and every value (the runs of one method)."""
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "runs": list(values),
    }


def median_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """The median and its distribution-free 95% interval (order statistics of a binomial)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * n**0.5 / 2
    low = max(0, int(n / 2 - half))
    high = min(n - 1, int(n / 2 + half + 1))
    return statistics.median(ordered), ordered[low], ordered[high]
