"""What this process knows of the batches handed to foreachBatch writers, shared by every
writer object of a sink: the last batch each run handed over (``HANDED``, the rules of
``core/writer_batch.HandedBatches``) and the wrapped calls watching a batch's blocks
(``WATCHES``, ``ForeachBatchWriter.wrap``)."""

from __future__ import annotations

import threading

from sqlsink.core.writer_batch import HandedBatches

# the last batch each run handed to a writer of each sink in this process: every writer
# object of a sink adds to it, so that none decides empty a batch another one was handed
HANDED = HandedBatches()


class CallWatch:
    """The blocks of one batch of one sink during one wrapped call: whether one ended
    decided, the error of the last one if it ended undecided (a retry that decided after
    a failure clears it; a failure after a decision does not), how many are still open.
    Known whatever the run id (an abort renews the process's run id)."""

    def __init__(self, sink_id: str, batch_id: int) -> None:
        self.key = (sink_id, batch_id)
        self.open = 0
        self.decided = False
        self.error: BaseException | None = None


class CallWatches:
    """The wrapped calls running in this process (``wrap``); every ``Batch`` block of
    their (sink, batch) reports to them. Thread-safe."""

    def __init__(self) -> None:
        self._watches: list[CallWatch] = []
        self._lock = threading.Lock()

    def watch(self, sink_id: str, batch_id: int) -> CallWatch:
        watch = CallWatch(sink_id, batch_id)
        with self._lock:
            self._watches.append(watch)
        return watch

    def unwatch(self, watch: CallWatch) -> None:
        with self._lock:
            self._watches.remove(watch)

    def _of(self, sink_id: str, batch_id: int) -> list[CallWatch]:
        return [w for w in self._watches if w.key == (sink_id, batch_id)]

    def handed(self, sink_id: str, batch_id: int) -> None:
        """A block of the batch handed it to the writer."""
        with self._lock:
            for watch in self._of(sink_id, batch_id):
                watch.open += 1

    def ended(self, sink_id: str, batch_id: int, handed: bool, error: BaseException | None) -> None:
        """A block of the batch ended: decided (``error`` None) or not."""
        with self._lock:
            for watch in self._of(sink_id, batch_id):
                watch.open -= 1 if handed and watch.open else 0
                watch.decided = watch.decided or error is None
                watch.error = error


WATCHES = CallWatches()
