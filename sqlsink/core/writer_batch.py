"""The foreachBatch writer's batch rules (docs/DESIGN.md 1.5): when a DataFrame (a part)
of batch N may be written, when it is a replay, when it is refused; and which batches a
run never handed to the writer.

    a part of batch N, before its Spark job (``judge_part``):
        N has no decision                               -> WRITE
        N decided by an earlier run (another run id),   -> REPLAY: its tasks find N
          with the part's table among its tables, or       decided and write nothing
          its tables unknown (a decision with
          transactions before the log recorded them)
        N decided by this very run                      -> refused (ConfigError): a second
                                                           write of one batch would be
                                                           skipped as if it were a replay
        N decided without the part's table              -> refused (ConfigError)
    an empty batch (no part: ``table`` None) follows the same rule: a new run's replay of
    a decided batch writes nothing, the same run's second hand-over is refused.

    a run hands batch b after a, a < b-1 (``HandedBatches``): Spark runs a run's batches
    in order and calls the function for each, so a+1..b-1 ran without reaching the
    writer; Spark recorded them committed. The writer decides each of them (those above
    the highest decided batch, ``fillable``) as an empty batch, through the
    committer, before anything of b is committed.

    a run hands batch b after its hand-over of a, a < b, ended undecided (the block
    raised: aborted, nothing committed), a still undecided in the log: the function
    caught the writer's error and returned, so Spark recorded a as committed without
    its rows -> refused (DataLossError, ``swallowed_loss_error``) before anything of b
    is written. Only the same run (the same process): a new run (a restart) replays
    a batch whose function raised, and a Spark task retry does not call the function
    again. (``wrap`` refuses at a's own return: ``swallowed_error``.)

A real replay comes from a new run only: Spark re-runs a batch after a restart (a new
run id), and the foreachBatch writer's own run id (when Spark's is not readable) is
replaced after an abort. So a batch decided by the run that hands it again is the
function's second write, never Spark's replay.

Pure rules over ``TwoPhaseBackend``: no Spark, no database driver.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Collection, Mapping, Sequence

from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.checkpoint_check import CheckpointCheck, Unreadable
from sqlsink.core.committer import Committer
from sqlsink.core.model import Decision, Handover, ResolutionReport
from sqlsink.errors import ConfigError, DataLossError

FIX = (
    "write every DataFrame of a batch in one `with writer.batch(batch_id)` block — one "
    "decision for all — or give each writer its own sink_id"
)


class PartStart(enum.Enum):
    """What a part of a batch does, decided before its Spark job."""

    WRITE = "write"  # the batch is undecided: the job writes and prepares
    REPLAY = "replay"  # an earlier run decided it: the job's tasks skip, nothing is written


def read_decision(backend: TwoPhaseBackend, sink_id: str, batch_id: int) -> Decision | None:
    """This batch's decision, if it has one."""
    return backend.decisions(sink_id, [(sink_id, batch_id)]).get((sink_id, batch_id))


def judge_part(
    sink_id: str,
    batch_id: int,
    run_id: str,
    table: str | None,
    decision: Decision | None,
    *,
    handed_before: bool = False,
) -> PartStart:
    """The rule of the module's table for one part (``table`` as schema.name; None for an
    empty batch); a ConfigError, before anything of the part is written, when refused.
    ``handed_before``: this run handed this batch to a writer of the sink before, in this
    process (``HandedBatches.handed``): a second hand-over whatever the decision says (a
    replay's second write of a table the decision names was never written; a block of
    the batch may still be open)."""
    if handed_before and (decision is None or decision.run_id != run_id):
        raise handed_twice_error(sink_id, batch_id, table)
    if decision is None:
        return PartStart.WRITE
    known = tuple(decision.tables or ())
    if decision.run_id == run_id:
        raise second_write_error(sink_id, batch_id, table, known, same_run=True)
    # tables unknown: a decision that wrote something before the log recorded its tables;
    # one with no transaction wrote no table (an empty batch, whatever its tables read)
    unknown = not known and bool(decision.gids)
    if table is None or unknown or table in known:
        return PartStart.REPLAY
    raise second_write_error(sink_id, batch_id, table, known, same_run=False)


def check_part(
    backend: TwoPhaseBackend, sink_id: str, batch_id: int, run_id: str, table: str | None
) -> PartStart:
    """``judge_part`` on the batch's decision as the log holds it now."""
    return judge_part(sink_id, batch_id, run_id, table, read_decision(backend, sink_id, batch_id))


def second_write_error(
    sink_id: str,
    batch_id: int,
    table: str | None,
    decided: Collection[str],
    *,
    same_run: bool,
) -> ConfigError:
    """A second write of a decided batch: it would be skipped, so it is refused."""
    tables = ", ".join(repr(t) for t in decided) if decided else "no table (an empty batch)"
    what = (
        f"the write of table {table!r} would be skipped"
        if table is not None
        else "this second hand-over of the batch (an empty one) would change nothing"
    )
    if same_run:
        who = (
            f"batch {batch_id} was already decided by this very run (its decision holds "
            f"{tables}): a second write of one batch id in one run (two to() calls, two "
            "`with writer.batch(batch_id)` blocks, or two writers with one sink_id) finds "
            f"the batch decided, and {what} as if it were Spark's replay"
            + (
                f"; or the function retries a write of {table!r} whose commit decided the "
                "batch and raised afterwards: then its rows are committed, and batch "
                f"{batch_id} must not be handed to the writer again"
                if table is not None and table in decided
                else ""
            )
        )
    else:
        who = (
            f"batch {batch_id} was decided by an earlier run with {tables}, without "
            f"{table!r}: this replay would skip {table!r}, whose rows were never written "
            f"for it. The decision of batch {batch_id} is final: to go on, hand batch "
            f"{batch_id} to the writer without {table!r} (that batch only: later batches "
            f"write it as usual) and load batch {batch_id}'s rows of {table!r} yourself, or "
            "accept that they are missing"
        )
    return ConfigError(
        f"sink {sink_id!r}: {who}. Nothing of {table!r} was written for batch {batch_id}. "
        f"Fix: {FIX}"
        if table is not None
        else f"sink {sink_id!r}: {who}. Nothing was written. Fix: {FIX}",
        sink_id=sink_id,
        batch=batch_id,
        table=table,
        decided=sorted(decided),
    )


def handed_twice_error(sink_id: str, batch_id: int, table: str | None) -> ConfigError:
    """A run hands a batch to the writer a second time, before the batch is decided by it
    (a block of it still open, or a replay whose first hand-over found it decided)."""
    what = f"table {table!r}" if table is not None else "an empty batch"
    return ConfigError(
        f"sink {sink_id!r}: batch {batch_id} was already handed to the writer by this very "
        "run in this process (two to() calls, two `with writer.batch(batch_id)` blocks, two "
        "writers with one sink_id, or a writer call inside an open block): this second "
        f"hand-over, of {what}, would be skipped as a replay or taken for the first one's "
        f"transactions. Nothing of it was written for batch {batch_id}. Fix: {FIX}",
        sink_id=sink_id,
        batch=batch_id,
        table=table,
    )


def check_skip_outside(
    sink_id: str,
    batch_id: int,
    location: str | None,
    commits: frozenset[int] | Unreadable | None,
    prepared: Mapping[int, Collection[str]],
) -> frozenset[int]:
    """An empty decision made outside the stream (``writer.skip(N)`` from an operator's
    script) is only for a batch Spark committed (``commits/N`` in the query's checkpoint)
    and that holds no prepared transaction (``prepared``: the sink's prepared gids by
    batch): a batch Spark has not committed is one it runs (again), with rows, and an
    empty decision would make that run skip them; a batch with prepared transactions is
    a lost decision (``recover --commit-lost``).

    Returns the later batches the skip's checkpoint check passes over: those Spark
    committed above N with nothing prepared (the run skipped its last batches and
    stopped: the operator skips them in order, N first). They stay undecided: the next
    commit's check that is not such a skip still reports any of them left so. A later
    batch with prepared transactions is not passed over (a lost decision)."""
    where = f"sink {sink_id!r}: writer.skip({batch_id}) outside the stream"
    if commits is None or isinstance(commits, Unreadable):
        why = (
            "no checkpoint_location was given"
            if location is None
            else f"the checkpoint {location} cannot be read ({commits.reason})"
            if isinstance(commits, Unreadable)
            else f"the checkpoint {location} cannot be read"
        )
        raise ConfigError(
            f"{where}: {why}, so nothing shows that Spark committed batch {batch_id}; "
            "a batch Spark has not committed is one it runs again with its rows, which an "
            "empty decision would skip. Nothing was decided. Fix: pass "
            "ForeachBatchWriter(..., checkpoint_location=<the query's checkpointLocation>), "
            f"or sqlsink recover --sink-id {sink_id} --mark-skipped {batch_id} --checkpoint DIR",
            sink_id=sink_id,
            batch=batch_id,
        )
    if batch_id not in commits:
        raise ConfigError(
            f"{where}: Spark's checkpoint {location} does not record batch {batch_id} as "
            f"committed (no commits/{batch_id}): Spark runs it (again) with its rows, and an "
            "empty decision would make that run skip them. Nothing was decided. Fix: skip "
            "only the batch the data-loss error names; a batch Spark runs again needs "
            "nothing",
            sink_id=sink_id,
            batch=batch_id,
        )
    held = sorted(prepared.get(batch_id, ()))
    if held:
        raise ConfigError(
            f"{where}: batch {batch_id} has prepared transactions ({', '.join(held)}): "
            "its rows were written and its decision was lost, so it is not a batch with "
            f"nothing. Nothing was decided. Fix: sqlsink recover --sink-id {sink_id} "
            f"--commit-lost {batch_id} --checkpoint DIR",
            sink_id=sink_id,
            batch=batch_id,
        )
    return frozenset(b for b in commits if b > batch_id and not prepared.get(b))


def decide_empty(
    committer: Committer,
    batch_id: int,
    *,
    query_id: str | None,
    run_id: str,
    passing: Collection[int] = (),
) -> ResolutionReport | None:
    """An empty batch (no gid, 0 rows): what ``with writer.batch(id): pass``,
    ``writer.skip(id)`` and a batch never handed decide. The rule first (a replay by a new
    run decides nothing: None), then the committer's own path and checks (binding,
    fencing, forward-only, checkpoint check when it has one). ``passing``: later batches
    this decision's checkpoint check does not count as missing (``check_skip_outside``)."""
    check = committer.checkpoint_check
    committer.checkpoint_check = deciding(check, {batch_id, *passing})
    try:
        return _decide_empty(committer, batch_id, query_id, run_id)
    finally:
        committer.checkpoint_check = check


def _decide_empty(
    committer: Committer, batch_id: int, query_id: str | None, run_id: str
) -> ResolutionReport | None:
    sink_id = committer.required_sink()
    if check_part(committer.backend, sink_id, batch_id, run_id, None) is PartStart.REPLAY:
        return None
    return committer.commit_batch(batch_id, [], query_id=query_id, run_id=run_id)


def deciding(check: CheckpointCheck | None, batches: Collection[int]) -> CheckpointCheck | None:
    """The checkpoint check of a commit that does not count ``batches`` as missing: they
    are being decided empty. Spark writes commits/N after the function returned, so N is
    there only for a batch Spark ran without the function handing it to the writer (a
    gap), or one skipped afterwards (a run that skipped its last batch and stopped:
    ``writer.skip(N)`` outside the stream)."""
    if check is None:
        return None
    read, deciding_now = check.policy.read_commits, frozenset(batches)

    def without_it() -> frozenset[int] | Unreadable:
        found = read()
        return found if isinstance(found, Unreadable) else found - deciding_now

    policy = dataclasses.replace(check.policy, read_commits=without_it)
    return CheckpointCheck(check.ledger, policy)


# -- batches a run never handed to the writer -----------------------------------------


class HandedBatches:
    """Per (sink, run): the last batch id handed to a writer of the sink in this process,
    and the batches whose hand-over ended undecided (``fail``). Thread-safe (queries of
    one driver run their functions on their own threads)."""

    def __init__(self, keep: int = 1000) -> None:
        self._last: dict[tuple[str, str], int] = {}
        self._failed: dict[tuple[str, str], set[int]] = {}
        self._keep = keep  # runs remembered (a process may see many restarts)
        self._lock = threading.Lock()

    def hand(self, sink_id: str, run_id: str, batch_id: int) -> range:
        """Record that the run handed ``batch_id``; return the batches it skipped since
        the last one it handed (empty the first time, and when not ahead of it)."""
        key = (sink_id, run_id)
        with self._lock:
            last = self._last.get(key)
            if last is None or batch_id > last:
                self._last.pop(key, None)  # newest last: the oldest run is dropped first
                self._last[key] = batch_id
                while len(self._last) > self._keep:
                    self._failed.pop(oldest := next(iter(self._last)), None)
                    del self._last[oldest]
            if last is None or batch_id <= last + 1:
                return range(0)
            return range(last + 1, batch_id)

    def handed(self, sink_id: str, run_id: str, batch_id: int) -> bool:
        """Whether the run handed this batch (or a later one) to the writer before."""
        last = self.last(sink_id, run_id)
        return last is not None and batch_id <= last

    def last(self, sink_id: str, run_id: str) -> int | None:
        """The last batch this run handed, None when it handed none yet."""
        with self._lock:
            return self._last.get((sink_id, run_id))

    def fail(self, sink_id: str, run_id: str, batch_id: int) -> None:
        """The run's hand-over of ``batch_id`` ended without deciding it (it raised)."""
        with self._lock:
            self._failed.setdefault((sink_id, run_id), set()).add(batch_id)
            while len(self._failed) > self._keep:
                del self._failed[next(iter(self._failed))]

    def settle(self, sink_id: str, run_id: str, batch_id: int) -> None:
        """The run's hand-over of ``batch_id`` ended decided."""
        with self._lock:
            self._failed.get((sink_id, run_id), set()).discard(batch_id)

    def carry(self, sink_id: str, old: str, new: str) -> None:
        """The process replaced run ``old`` by ``new`` after an abort (``ProcessRuns``):
        the new run inherits the old one's failed batches (not its last hand-over: the
        new run may retry the aborted batch, a first hand-over for it)."""
        if old == new:
            return
        with self._lock:
            failed = self._failed.get((sink_id, old))
            if failed:
                self._failed.setdefault((sink_id, new), set()).update(failed)

    def failed_before(self, sink_id: str, run_id: str, batch_id: int) -> list[int]:
        """The batches before ``batch_id`` whose hand-over by this run ended undecided."""
        with self._lock:
            return sorted(b for b in self._failed.get((sink_id, run_id), ()) if b < batch_id)


def swallowed_loss_error(sink_id: str, lost: Sequence[int], batch_id: int) -> DataLossError:
    """A run hands ``batch_id`` after its write of the ``lost`` batches failed and the
    function returned normally: Spark recorded them as committed without their rows."""
    first, rest = lost[0], [b for b in lost[1:]]
    more = (
        f" (so did this run's writes of batch{'es' if len(rest) > 1 else ''} "
        f"{', '.join(map(str, rest))} after it: the function caught those errors too)"
        if rest
        else ""
    )
    return DataLossError(
        f"data loss: sink {sink_id!r}: this run's write of batch {first} failed (it was "
        "aborted, nothing of it is committed), but the foreachBatch function returned "
        f"normally: it caught the writer's error, so Spark went on and recorded batch {first} "
        f"as committed in its checkpoint{more}. The rows of batch {first} were not written, "
        f"and Spark will not run it again. Nothing of batch {batch_id} was written. Fix: let "
        "the writer's error propagate out of the function (re-raise it after logging it, or "
        "give foreachBatch writer.wrap(function), which raises it); then restore the lost "
        f"batches' rows: replay their source offsets (offsets/{first} of the checkpoint, and "
        "so on) into the table yourself, or accept that they are missing: sqlsink recover "
        f"--sink-id {sink_id} --mark-skipped {first} --checkpoint DIR (each lost batch, in "
        "order); then restart the query",
        sink_id=sink_id,
        batch=batch_id,
        lost=list(lost),
    )


def unfinished_handovers(
    backend: TwoPhaseBackend, sink_id: str, batch_id: int, highest: int | None
) -> list[Handover]:
    """The batches before ``batch_id`` that a run of the sink (this one or an earlier one,
    in any process) was handed and that nobody decided: above the highest decided batch,
    recorded by ``record_handover`` before anything of them was written. A stream hands
    its batches in order and Spark runs a batch again until its function returns, so a
    run handing ``batch_id`` past one of them means the function returned from it
    undecided (it caught the writer's error): Spark recorded it committed without its
    rows. Not a batch the function never handed (no record: a skipped batch, decided
    empty by ``fill_gap``), not ``batch_id`` itself (a replay hands it again)."""
    return sorted(
        (
            h
            for h in backend.handovers(sink_id)
            if h.batch_id < batch_id and (highest is None or h.batch_id > highest)
        ),
        key=lambda h: (h.batch_id, h.run_id),
    )


def handed_loss_error(
    sink_id: str, lost: Sequence[Handover], batch_id: int, run_id: str
) -> DataLossError:
    """A run hands ``batch_id`` past batches handed to the writer and never decided."""
    first = lost[0]
    who = "this run" if first.run_id == run_id else f"run {first.run_id}"
    batches = sorted({h.batch_id for h in lost})
    more = f" (and batches {', '.join(map(str, batches[1:]))} after it)" if len(batches) > 1 else ""
    return DataLossError(
        f"data loss: sink {sink_id!r}: batch {first.batch_id} was handed to the writer (by "
        f"{who}, at {first.handed_at.isoformat(timespec='seconds')}){more} and never decided: its "
        "write failed or its block was left by an exception, and the foreachBatch function "
        "returned normally (it caught the error), so Spark recorded the batch as committed "
        f"in its checkpoint without its rows, and will not run it again. Nothing of batch "
        f"{batch_id} was written. Fix: let the writer's error propagate out of the function "
        "(re-raise it after logging it, or give foreachBatch writer.wrap(function)); then "
        f"restore batch {first.batch_id}'s rows: replay its source offsets (offsets/"
        f"{first.batch_id} of the checkpoint) into the table yourself, or re-deliver it by "
        f"restarting the query from a copy of its checkpoint taken before commits/"
        f"{first.batch_id}; or accept that its rows are missing: sqlsink recover --sink-id "
        f"{sink_id} --mark-skipped {first.batch_id} --checkpoint DIR (each lost batch, in "
        f"order); then restart the query. (Only if a later run re-ran batch {first.batch_id} "
        "and the function returned from it without handing it to the writer, on purpose, "
        "is nothing lost: mark it skipped the same way; foreachBatch(writer.wrap(function)) "
        "decides such batches itself.) Or the database went back in time (an asynchronous "
        "failover to a standby, a point-in-time restore) and lost batch "
        f"{first.batch_id}'s decision, not its hand-over: then the function is not at fault; "
        "if the batch's prepared transactions survived (sqlsink status lists them), sqlsink "
        f"recover --sink-id {sink_id} --commit-lost {first.batch_id} commits them, else "
        "re-deliver the batch as above.",
        sink_id=sink_id,
        batch=batch_id,
        lost=batches,
    )


def swallowed_error(sink_id: str, batch_id: int, error: BaseException | None) -> ConfigError:
    """A wrapped function returned normally although its hand-over of ``batch_id``
    ended undecided: Spark would record the batch committed without its rows."""
    if error is None:
        what = "was handed to the writer and never decided (a batch() not left)"
    else:
        text = str(error).splitlines()[0] if str(error) else ""
        what = f"failed ({type(error).__name__}: {text[:300]})"
    return ConfigError(
        f"sink {sink_id!r}: the foreachBatch function returned normally although the "
        f"writer's write of batch {batch_id} {what}: the error was caught in the function, "
        f"and Spark would record batch {batch_id} as committed although the writer did not "
        f"decide it (its rows not written). This error stops the query so that its restart "
        f"runs batch {batch_id} again. Fix: re-raise the writer's error in the function "
        "(after logging it) instead of returning",
        sink_id=sink_id,
        batch=batch_id,
    )


def fillable(gap: range, highest: int | None) -> range:
    """The batches of ``gap`` the writer decides empty: those above the highest decided
    one (a batch at or below it is decided, or behind the log: never decided late)."""
    start = gap.start if highest is None else max(gap.start, highest + 1)
    return range(start, max(start, gap.stop))


def fill_gap(committer: Committer, gap: range, *, query_id: str | None, run_id: str) -> range:
    """Decide the fillable batches of ``gap`` empty, in order; return them."""
    filled = fillable(gap, committer.backend.highest_decided(committer.required_sink()))
    check = committer.checkpoint_check
    committer.checkpoint_check = deciding(check, filled)  # in commits/: Spark ran them
    try:
        for batch_id in filled:
            _decide_empty(committer, batch_id, query_id, run_id)
    finally:
        committer.checkpoint_check = check
    return filled


def gap_warning(sink_id: str, run_id: str, gap: range, filled: range, before: int) -> str:
    """The one warning for batches a run never handed to the writer."""
    shown = _span(gap)
    done = (
        f"decided {_span(filled)} as empty (nothing written for them)"
        if len(filled)
        else "decided nothing for them (already decided)"
    )
    return (
        f"sqlsink: sink {sink_id!r}: run {run_id} handed batch {before} to the writer, but not "
        f"{shown}: Spark ran {'them' if len(gap) > 1 else 'it'} and recorded "
        f"{'them' if len(gap) > 1 else 'it'} as committed without the foreachBatch "
        f"function calling the writer, so {done}, before batch {before}. Fix: hand every "
        "batch to the writer, writer.batch(batch_id) or writer.skip(batch_id) (a skipped "
        "last batch before a stop is seen by nobody, and the restart stops on it)"
    )


def _span(batches: range) -> str:
    if len(batches) == 1:
        return f"batch {batches.start}"
    return f"batches {batches.start}..{batches.stop - 1}"
