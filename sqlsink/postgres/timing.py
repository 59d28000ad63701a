"""Where one partition's write spends its time, for benchmarks (``benchmarks/batch_split.py``).

Off unless the environment variable ``SQLSINK_TIMING_DIR`` names a directory when the
partition starts: then ``begin()`` returns a ``PartTimes`` that the write path feeds, and
``PartTimes.save`` appends one JSON line per partition to ``<dir>/<pid>.jsonl``. Off,
``begin()`` returns None and no clock is read for it (``phase`` is then a null context).

Phases (seconds of wall time; ``*_cpu`` the CPU seconds of this thread beside them):
``arrow_wait`` blocked in Spark's iterator for the next Arrow batch; ``session`` the
connection and the participant's checks before the write; ``encode`` Arrow to binary COPY;
``send`` blocked in ``Copy.write`` (libpq's buffer full: the server is behind);
``copy_end`` the end of COPY (the server's last rows); ``marker``, ``prepare``,
``after_prepare`` the protocol's fixed cost; ``total`` from begin() to save().
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

ENV = "SQLSINK_TIMING_DIR"


class PartTimes:
    """The phases of one partition's write, summed."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.started = time.perf_counter()
        self.started_cpu = time.thread_time()
        self.started_at = time.time()

    def add(self, phase: str, wall_s: float, cpu_s: float | None = None) -> None:
        self.wall[phase] = self.wall.get(phase, 0.0) + wall_s
        if cpu_s is not None:
            self.cpu[phase] = self.cpu.get(phase, 0.0) + cpu_s

    def phase(self, name: str) -> _Phase:
        return _Phase(self, name)

    def waited(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The batches, the time blocked in the iterator counted as ``arrow_wait``."""
        while True:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                batch = next(batches)
            except StopIteration:
                self.add("arrow_wait", time.perf_counter() - wall, time.thread_time() - cpu)
                return
            self.add("arrow_wait", time.perf_counter() - wall, time.thread_time() - cpu)
            yield batch

    def save(self, **facts: Any) -> None:
        self.add("total", time.perf_counter() - self.started, time.thread_time() - self.started_cpu)
        record = {
            "pid": os.getpid(),
            "started_at": self.started_at,
            "wall": {k: round(v, 6) for k, v in self.wall.items()},
            "cpu": {k: round(v, 6) for k, v in self.cpu.items()},
            **facts,
        }
        path = os.path.join(self.directory, f"{os.getpid()}.jsonl")
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


class _Phase:
    def __init__(self, times: PartTimes, name: str) -> None:
        self.times, self.name = times, name

    def __enter__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def __exit__(self, *exc: object) -> None:
        self.times.add(self.name, time.perf_counter() - self.wall, time.thread_time() - self.cpu)


def phase(times: PartTimes | None, name: str) -> AbstractContextManager[None]:
    """``times.phase(name)``, or nothing at all when the write is not timed."""
    return nullcontext() if times is None else times.phase(name)


def begin() -> PartTimes | None:
    """A partition's timer when ``SQLSINK_TIMING_DIR`` is set, else None."""
    directory = os.environ.get(ENV)
    return PartTimes(directory) if directory else None
