"""A token of the Spark driver that plans a stream's batches, the same in each of its
Python workers.

A stream's run id is Spark's ``spark.jobGroup.id``, a local property that only the
tasks see. The planning worker (``streamWriter()`` before each batch) and the
commit/abort worker are other processes of the driver, each making its own writer,
and neither learns the run id. What they share is their ancestor: the driver's JVM.
A digest of its host, pid and start time, with the sink id, is the same in every
Python worker of that driver and differs between two drivers (a zombie and its
successor), even on one host. The tasks record it with their run
(``register_run``); an abort that no task reported to finds its run by it
(``Committer.abort_batch``). Two runs of one query in one driver never overlap
(Spark refuses a second active query with the same id), so the newest run with the
token is the abort's.

Linux only (``/proc``); elsewhere there is no token, and such an abort does nothing,
as before.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

_MAX_DEPTH = 16


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


def driver_token(sink_id: str) -> str | None:
    """The token of this process's driver for the sink; None when there is no JVM
    ancestor to name (not a Spark worker, or not Linux)."""
    jvm = driver_jvm()
    if jvm is None:
        return None
    pid, started = jvm
    text = f"{socket.gethostname()}:{pid}:{started}:{sink_id}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]
