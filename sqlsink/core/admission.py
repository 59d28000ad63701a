"""Who may write to a sink: the checks a committer and a task make before acting.

A sink with decided batches belongs to the writer that decided them (invariant 8);
Spark replays only its last batch, so a batch below the highest decided one is
refused (invariant 9); a run superseded by a newer one is a zombie (invariant 10).
This module owns those rules and the errors they raise; the committer
(``core/committer.py``, its abort included) and the participant
(``core/participant.py``) apply them.
"""

from __future__ import annotations

from sqlsink.core.model import Binding
from sqlsink.errors import CheckpointError, FencedError, SinkBindingError


def check_binding(
    sink_id: str, bound: Binding | None, highest: int | None, writer: Binding
) -> None:
    """Invariant 8: a sink with decided batches belongs to the writer that decided them."""
    if refuses(bound, highest, writer):
        assert bound is not None
        raise binding_error(sink_id, bound, writer)


def refuses(bound: Binding | None, highest: int | None, writer: Binding) -> bool:
    """Whether a sink bound so, with batches up to ``highest``, refuses this writer."""
    return bound is not None and bound != writer and highest is not None


def check_forward(sink_id: str, batch_id: int, highest: int | None) -> None:
    """Invariant 9: Spark replays only its last batch; anything below it is not a replay."""
    if highest is not None and batch_id < highest:
        raise checkpoint_error(sink_id, batch_id, highest)


def fenced_error(
    sink_id: str, run_id: str, fenced_by: str, *, load: bool = False, decided: bool = False
) -> FencedError:
    """``load``: the run is a named batch load's (no streaming query): it has no checkpoint
    to restart from, so the newer run is another load of the same sinkId (or an
    operator). ``decided``: the load's batch was decided before (an abort after a failed
    commit): its rows are then committed, not rolled back."""
    by = "an operator (sqlsink recover --force)" if fenced_by == "operator" else f"run {fenced_by}"
    if not load:
        return FencedError(
            f"sink {sink_id!r}: run {run_id} was superseded by {by}: a newer run of this "
            "sink started (its checkpoint restarted while this driver was paused or cut "
            "off), so this run is a zombie. It writes, decides and resolves nothing; stop "
            "this query, the newer run goes on",
            sink_id=sink_id,
            run=run_id,
            fenced_by=fenced_by,
        )
    operator = fenced_by == "operator"
    finisher = "sqlsink recover" if operator else "the other load's commit, or by sqlsink recover"
    if decided:
        outcome = (
            "Its batch was decided before, so its rows are committed all the same (by "
            f"{finisher} --sink-id {sink_id})"
        )
    else:
        outcome = (
            "Nothing of this load was written: it decides nothing, and its prepared parts "
            f"are rolled back (by {finisher} --sink-id {sink_id})"
        )
    if operator:
        why = "an operator ended this load's run"
        fix = "run the load again under the same sinkId (it writes its rows once)"
    else:
        why = "another load of this sinkId started after this one"
        fix = (
            "loads of different data need different sinkIds; a re-run of the same load "
            "waits for the other one to finish, then runs again (and writes nothing if "
            "that one committed)"
        )
    return FencedError(
        f"sink {sink_id!r}: run {run_id} was superseded by {by}: {why}, so this load "
        f"stops. {outcome}. Fix: {fix}",
        sink_id=sink_id,
        run=run_id,
        fenced_by=fenced_by,
    )


def binding_error(sink_id: str, bound: Binding, writer: Binding) -> SinkBindingError:
    return SinkBindingError(
        f"sink {sink_id!r} is bound to {bound.describe()}, whose batches are in its "
        f"commit log; this is {writer.describe()}. Sharing the sink id would make this "
        "writer skip batches as already committed. Nothing was written. Restart the "
        "original writer (a query from its checkpoint), or give this one its own sinkId "
        f"option; to reuse the sink id, finish and remove the old log first: sqlsink "
        f"recover --sink-id {sink_id}, then sqlsink forget --sink-id {sink_id}",
        sink_id=sink_id,
        bound=bound.describe(),
        writer=writer.describe(),
    )


def checkpoint_error(sink_id: str, batch_id: int, highest: int) -> CheckpointError:
    return CheckpointError(
        f"sink {sink_id!r}: this run writes batch {batch_id}, but batch {highest} is already "
        "decided in the commit log: the checkpoint went back in time (restored from an "
        "older copy, or its offsets/ or commits/ folder was cleared). Spark replays only "
        f"its last batch, so batch {batch_id} is not a replay: its rows would be skipped or "
        "written twice. Nothing was written. Restore the checkpoint that wrote batch "
        f"{highest}; or start over with a new checkpoint and a new sinkId (or, once the "
        f"old log is finished: sqlsink recover --sink-id {sink_id}, then sqlsink forget "
        f"--sink-id {sink_id})",
        sink_id=sink_id,
        batch=batch_id,
        highest=highest,
    )
