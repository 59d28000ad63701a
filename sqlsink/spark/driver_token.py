"""Tokens of the Spark driver that plans a stream's batches, the same in each of its
Python workers: the driver's, and a run's (the driver's and the query's).

A stream's run id is Spark's ``spark.jobGroup.id``, a local property that only the
tasks see. The planning worker (``streamWriter()`` before each batch) and the
commit/abort worker are other processes of the driver, each making its own writer,
and neither learns the run id. What they share is their ancestor: the driver's JVM.
A digest of its host (name and boot id), pid and start time, with the sink id, is
the same in every Python worker of that driver and differs between two drivers (a
zombie and its successor), even on one host (``driver_token``).

One driver runs many queries (a notebook; every client of one Spark Connect server),
and two of them may name the same sink (one is refused). So the token a stream's
tasks record with their run (``register_run``) is the driver's token and the query
id together (``run_token``): an abort that no task reported to reads its query id
from its checkpoint and finds its own run by it (``Committer.abort_batch``), never
another query's of the same driver. Two runs of one query in one driver never
overlap (Spark refuses a second active query with the same id), so the newest run
with the token is the abort's.

Linux only (``/proc``); elsewhere there is no token, and such an abort does nothing.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

_MAX_DEPTH = 16
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(command name, parent pid, start time in clock ticks) of a process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return name, int(fields[1]), fields[19]  # fields 4 (ppid) and 22 (starttime) of stat


def driver_jvm() -> tuple[int, str] | None:
    """(pid, start time) of the nearest ancestor JVM of this process, if any."""
    pid = os.getpid()
    for _ in range(_MAX_DEPTH):
        stat = _stat(pid)
        if stat is None:
            return None
        name, parent, started = stat
        if name == "java":
            return pid, started
        if parent <= 1:
            return None
        pid = parent
    return None


def _boot_id() -> str:
    """The kernel's random id of this boot: start ticks count from the boot, and two
    hosts (or containers with one fixed host name and JVM pid) differ by it."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def driver_token(sink_id: str) -> str | None:
    """The token of this process's driver for the sink; None when there is no JVM
    ancestor to name (not a Spark worker, or not Linux)."""
    jvm = driver_jvm()
    if jvm is None:
        return None
    pid, started = jvm
    text = f"{socket.gethostname()}:{_boot_id()}:{pid}:{started}:{sink_id}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def run_token(driver: str | None, query_id: str | None) -> str | None:
    """The token a stream's tasks record with their run, and that the abort of a batch
    of theirs looks for: the driver's token and the query id. None without either (no
    token is recorded, and an abort without messages then acts on nothing)."""
    if driver is None or not query_id:
        return None
    return hashlib.sha256(f"{driver}:{query_id}".encode()).hexdigest()[:32]
