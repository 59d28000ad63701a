"""The foreachBatch writer's heartbeat: a run is heard from while one of its batches is
open (docs/DESIGN.md invariant 10).

A run registers at each task's start and at its commit. A batch of several DataFrames
(parts) leaves part 0's partitions prepared while part 1's Spark job computes its input
(a join, an aggregation: no task of the sink runs), and the user's function may do
anything between two parts: nothing of the sink would register, and once runTimeout
passed ``sqlsink recover`` would take the run for dead and roll part 0 back. So while a
``Batch`` is open a driver thread registers the run every ``runTimeout / 3`` (at least
``MIN_INTERVAL_S``), and at once before each part's job but the first: part 0's tasks
register the run themselves as they start, so a batch of one part (the common case)
costs no registration of its own unless its block stays open for an interval.

Bounded: each registration is a connection (``connect_timeout``), the sink's
``lockTimeout`` and the write bound of ``PostgresBackend``; the thread is a daemon (it
never outlives the process), ends when the block exits, when the ``Batch`` is dropped
without exiting, or when the run was fenced or refused (the batch's tasks and commit say
so themselves). The block's exit waits for a registration in progress at most
``JOIN_S``; one still running then finishes on its own, within those bounds (it
registers the run, as the commit does next). A failed registration is logged and tried
again at the next beat. Nothing here imports Spark.
"""

from __future__ import annotations

import logging
import threading
import weakref

from sqlsink.errors import ConfigError, FencedError
from sqlsink.options import SinkOptions

log = logging.getLogger("sqlsink")

# a registration writes the heartbeat only when it is older than a second (register_run):
# beats further apart than that each write it, so it is never older than the interval
MIN_INTERVAL_S = 1.1
# the shortest runTimeout a run open in a batch stays heard from within: a beat every
# MIN_INTERVAL_S, recorded at most once a second, leaves a heartbeat at most ~2.1 s old
MIN_RUN_TIMEOUT_S = 3.0
JOIN_S = 0.05  # at the block's exit: how long to wait for a registration in progress


class Heartbeat:
    """Registers run ``run_id`` of the sink from a driver thread, until ``stop()``."""

    def __init__(
        self, options: SinkOptions, sink_id: str, run_id: str, query_id: str | None
    ) -> None:
        self.options = options
        self.sink_id = sink_id
        self.run_id = run_id
        self.query_id = query_id
        self.interval_s = max(MIN_INTERVAL_S, options.run_timeout_s / 3)
        self.beats = 0  # registrations done
        self.ended_by: str | None = None  # why it ended by itself (fenced, refused)
        self._stop = threading.Event()
        self._now = threading.Event()  # a part's job is about to start: beat at once
        self._thread: threading.Thread | None = None
        self._failed = False  # a failure was logged (once, until a registration succeeds)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Heartbeat:
        """Start the thread; it registers the run once an interval has passed (or when
        nudged), not at once."""
        self._thread = threading.Thread(
            target=self._run, name=f"sqlsink heartbeat {self.sink_id}", daemon=True
        )
        self._thread.start()
        return self

    def nudge(self) -> None:
        """Register now (before a part's job) without waiting for it."""
        self._now.set()

    def halt(self) -> None:
        """No registration after this, but one in progress; returns at once."""
        self._stop.set()
        self._now.set()

    def stop(self) -> None:
        """``halt``, then wait at most ``JOIN_S`` for a registration in progress."""
        self.halt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)

    def _run(self) -> None:
        while True:
            self._now.wait(self.interval_s)
            self._now.clear()
            if self._stop.is_set():
                return
            try:
                self.beat()
            except (FencedError, ConfigError) as exc:  # the tasks and the commit say it too
                self.ended_by = str(exc)
                log.info(
                    "sqlsink %s: the heartbeat of run %s ends: %s", self.sink_id, self.run_id, exc
                )
                return
            except Exception as exc:  # the database away for a moment: the next beat
                if not self._failed:
                    log.warning(
                        "sqlsink %s: the heartbeat of run %s failed (%s); it tries again every "
                        "%.1f s. While it fails, an open batch whose parts take longer than "
                        "runTimeout may be taken for dead by sqlsink recover",
                        self.sink_id,
                        self.run_id,
                        exc,
                        self.interval_s,
                    )
                    self._failed = True

    def beat(self) -> None:
        """Register the run once, as its tasks do: a writer the sink refuses fences
        nobody (ConfigError), a fenced run is told so (FencedError)."""
        from sqlsink.backends import open_database
        from sqlsink.core.committer import Committer
        from sqlsink.core.model import Binding

        options = self.options
        loading = open_database(options.url).loading()
        with loading.heartbeat_backend(options, self.sink_id) as backend:
            committer = Committer(backend, self.sink_id, run_timeout_s=options.run_timeout_s)
            committer.register(self.run_id, holds_lock=False, writer=Binding.of(self.query_id))
        self.beats += 1
        self._failed = False


# the open batches' heartbeats, by batch: a batch dropped without exiting ends its own
_open: weakref.WeakKeyDictionary[object, Heartbeat] = weakref.WeakKeyDictionary()
_open_lock = threading.Lock()


def check_run_timeout(options: SinkOptions) -> None:
    """Refuse a runTimeout the heartbeat cannot keep an open batch's run live within."""
    if options.run_timeout_s < MIN_RUN_TIMEOUT_S:
        raise ConfigError(
            f"ForeachBatchWriter: runTimeout {options.run_timeout_s:g}s is shorter than the "
            "writer can keep a run heard from while a batch is open: its heartbeat registers "
            f"the run every {MIN_INTERVAL_S} s at the shortest, and a registration records a "
            "beat at most once a second, so a live run would look dead to sqlsink recover "
            f"and its batch be rolled back. Fix: runTimeout of at least {MIN_RUN_TIMEOUT_S:g}s "
            "(the default, 5min, suits most queries)"
        )


def before_job(
    batch: object, options: SinkOptions, sink_id: str, run_id: str, query_id: str | None
) -> Heartbeat:
    """Before each part's job of ``batch``: register the run from a driver thread every
    interval until ``end(batch)``, and now before every part but the first (whose tasks
    register it as they start)."""
    with _open_lock:
        heartbeat = _open.get(batch)
        if heartbeat is not None:
            heartbeat.nudge()
            return heartbeat
        heartbeat = _open[batch] = Heartbeat(options, sink_id, run_id, query_id).start()
        weakref.finalize(batch, heartbeat.halt)
        return heartbeat


def end(batch: object) -> None:
    """The batch's block exits: its heartbeat stops (the commit registers by itself)."""
    with _open_lock:
        heartbeat = _open.pop(batch, None)
    if heartbeat is not None:
        heartbeat.stop()
