"""Where the CPU goes during a run: this driver, the JVM, Spark's Python workers, the rest.

CPU seconds (user + system) of this process and of its descendants, by group, taken before
and after a run. PostgreSQL (the embedded server) is read from its postmaster: the
postmaster's own time, its live children's, and the time of the children it has reaped
(``children_user``/``children_system``: a backend that ended with its connection is counted
there), so every backend is counted whether it outlived the run or not. "rest" is the
machine's busy time minus all of those: anything else running on the machine (with
``--url``, the server's backends too). On 2 cores a run of w seconds has 2·w CPU seconds
to spend.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import psutil

REAPED_WORKERS = "python_workers_reaped"
_postmaster: list[int] = []  # the embedded server's postmaster, when the benchmark runs one


def watch_postgres(pid: int) -> None:
    _postmaster[:] = [pid]


def postgres_s() -> float | None:
    """CPU seconds the server's processes have used so far (None when not watched)."""
    if not _postmaster:
        return None
    try:
        root = psutil.Process(_postmaster[0])
        times = root.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in root.children():
            try:
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
            except psutil.Error:
                continue  # it ended just now: its time is in children_* next time
        return float(total)
    except psutil.Error:
        return None


def settled_postgres_s(limit_s: float = 2.0, step_s: float = 0.05) -> float | None:
    """PostgreSQL's CPU seconds once two readings agree: a backend whose connection just
    closed is still exiting, and until the postmaster reaps it its time is in neither its
    live children nor ``children_*`` (it would be lost into "rest")."""
    last = postgres_s()
    deadline = time.monotonic() + limit_s
    while last is not None and time.monotonic() < deadline:
        time.sleep(step_s)
        now = postgres_s()
        if now is None or abs(now - last) < 0.005:
            return now
        last = now
    return last


def group_of(process: psutil.Process) -> str:
    if process.pid == psutil.Process().pid:
        return "driver"
    name = process.name()
    if name == "java":
        return "jvm"
    return "python_workers" if name.startswith("python") else "other_children"


def machine_busy_s() -> float:
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + times.irq + times.softirq)


Snapshot = tuple[float, dict[int, tuple[str, float]], float | None, dict[int, int]]


def snapshot() -> Snapshot:
    """(the machine's busy seconds, pid -> (group, CPU seconds), PostgreSQL's, pid -> parent
    pid) now; the
    server's is read last, once settled. Children of this process that ended and were
    reaped (forked COPY processes) are one entry, "reaped_children"; the Python workers the
    JVM or pyspark's daemon reaped are REAPED_WORKERS (per reaping process)."""
    me = psutil.Process()
    processes = [me, *me.children(recursive=True)]
    mine = me.cpu_times()
    seen = {-1: ("reaped_children", mine.children_user + mine.children_system)}
    parents: dict[int, int] = {}
    for process in processes:
        try:
            times = process.cpu_times()
            group = group_of(process)
            seen[process.pid] = (group, times.user + times.system)
            parents[process.pid] = process.ppid()
            if process.pid != me.pid and group in ("jvm", "python_workers"):
                # what the JVM and pyspark's daemon reaped: Python workers that ended (a
                # worker not reused, the data source's planner and commit workers)
                reaped = times.children_user + times.children_system
                seen[-process.pid - 1] = (REAPED_WORKERS, reaped)
        except psutil.Error:
            continue
    return machine_busy_s(), seen, settled_postgres_s(), parents


@dataclass
class CpuMeter:
    """``with CpuMeter() as cpu: ...`` then ``cpu.split`` is CPU seconds per group."""

    split: dict[str, float] | None = None

    def __enter__(self) -> CpuMeter:
        self._before = snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        busy_before, before, pg_before, parents = self._before
        busy_after, after, pg_after, _ = snapshot()
        groups: Counter[str] = Counter()
        for pid, (group, seconds) in after.items():
            groups[group] += seconds - before.get(pid, (group, 0.0))[1]
        for pid, (group, seconds) in before.items():
            parent = parents.get(pid)
            if pid > 0 and pid not in after and group == "python_workers" and parent in after:
                # a worker that ended during the run: its whole time is in its (watched)
                # parent's reaped figure now, its time before the run is not the run's
                groups[REAPED_WORKERS] -= seconds
        total = busy_after - busy_before
        if pg_before is not None and pg_after is not None:
            groups["postgres"] = pg_after - pg_before
        self.split = {name: round(seconds, 2) for name, seconds in sorted(groups.items())}
        self.split["rest"] = round(max(0.0, total - sum(groups.values())), 2)
        self.split["machine_total"] = round(total, 2)
