"""Batches whose decision was lost: what ``recover`` leaves, and what the operator decides.

After an asynchronous failover or a point-in-time restore the commit log can lack the
decision of a batch that Spark committed (docs/DESIGN.md invariant 9). Spark never runs
it again. If its partitions' transactions are still prepared they hold its rows, the
only copy left: ``recover`` never rolls them back when something shows that Spark went
past the batch, and names them. The evidence, for a batch above the highest decided one:

- with ``--checkpoint``: the checkpoint's ``commits/K`` (and only that);
- without: the commit log's own record, a commit of a later batch that found K's
  decision missing (its checkpoint check, or undecided leftovers below it), or a later
  batch that Spark aborted (Spark runs K+1 only after committing K).

``--commit-lost K`` writes K's decision naming exactly those transactions (one attempt
per partition, of one run), so that the recovery commits them; ``--mark-skipped N``
writes an empty decision for a batch that had nothing for the sink (a foreachBatch
function that did not hand it to the writer). Both under the sink's lock, both refused
unless the evidence holds; each refusal says why and changes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlsink.checkpoint.parse import Checkpoint, read_checkpoint
from sqlsink.cli.output import CliError, Notice, Output
from sqlsink.core.admin import AdminSession, RoleInfo, ServerTerms
from sqlsink.core.backend import TwoPhaseBackend
from sqlsink.core.gid import Gid
from sqlsink.core.lost import Evidence, LostBatch, stranger_gids, undecided_prepared
from sqlsink.core.model import NewDecision, PreparedTransaction
from sqlsink.errors import ConfigError

RUNBOOK = "see the runbook's 'Data loss' (docs/operations/runbook.md)"


@dataclass(frozen=True)
class RecordedCheckpoint:
    """The checkpoint the sink's query recorded (its runs' checkpoint checks), as read here."""

    location: str | None  # the newest recorded (as shown: no secrets); None: none recorded
    checkpoint: Checkpoint | None  # read; None: not recorded, or not readable from here
    unreadable: str | None  # why it could not be read

    def why_unread(self) -> str:
        if self.location is None:
            return (
                "no checkpoint of this sink's query is recorded (no run of it checked one) "
                "and none was given"
            )
        return (
            f"the checkpoint this sink's query recorded, {self.location}, cannot be read: "
            f"{self.unreadable}"
        )


def recorded_checkpoint(
    conn: AdminSession, sink_id: str, query_id: str | None
) -> RecordedCheckpoint:
    """Read the newest checkpoint location the sink's runs recorded, if it is readable from
    here (a local path, a ``file:`` URI, or what ``pyarrow.fs`` reads) and is the bound
    query's."""
    location = next(
        (
            row.location
            for row in conn.checkpoint_checks(sink_id, limit=50)
            if row.location is not None
        ),
        None,
    )
    if location is None:
        return RecordedCheckpoint(None, None, None)
    try:
        read = read_checkpoint(location)
    except (ConfigError, OSError, ValueError) as exc:
        return RecordedCheckpoint(location, None, str(exc))
    if query_id is not None and read.query_id != query_id:
        return RecordedCheckpoint(
            location,
            None,
            f"it belongs to query {read.query_id}, and the sink is bound to query {query_id}",
        )
    return RecordedCheckpoint(location, read, None)


def lost_notice(sink_id: str, lost: LostBatch, out: Output, dry_run: bool) -> Notice:
    verb = "would be" if dry_run else "were"
    return Notice(
        "warning",
        f"batch {lost.batch_id} has no decision, but its {len(lost.gids)} transaction(s) are "
        f"still prepared ({', '.join(lost.gids)}): {lost.why}, so its decision was lost (an "
        f"asynchronous failover or a restore). They hold its rows, the only copy left, and "
        f"{verb} left prepared",
        f"commit them: sqlsink recover --sink-id {sink_id} --commit-lost {lost.batch_id} "
        f"--url {out.paste_url}{out.paste_note} (stop the query first; they hold the rows of "
        "each partition whose PREPARE survived: if the failover lost some, theirs are missing "
        f"and nothing here can tell; re-running batch {lost.batch_id} from the rewound "
        f"checkpoint, when the source still holds it, is exact either way; {RUNBOOK})",
        sink_id,
    )


# -- --commit-lost and --mark-skipped -------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One batch the operator asks to decide."""

    batch_id: int
    commit: bool  # --commit-lost (its prepared transactions), else --mark-skipped (empty)


def requests(commit_lost: Iterable[int], mark_skipped: Iterable[int]) -> list[Request]:
    wanted = [Request(b, True) for b in set(commit_lost)]
    wanted += [Request(b, False) for b in set(mark_skipped)]
    return sorted(wanted, key=lambda r: r.batch_id)


class LockHeld(Exception):
    """The sink's lock stayed held past --lock-timeout: nothing was decided. ``recover``
    refuses the sink (exit 1), naming the holder, as it and ``forget`` refuse a held lock."""


@dataclass
class Decider:
    """Checks and writes the requested decisions, in batch order, under the sink's lock."""

    backend: TwoPhaseBackend
    sink_id: str
    query_id: str | None  # the streaming query the sink is bound to
    me: RoleInfo
    proof: Evidence
    ended: list[int] = field(default_factory=list)  # fenced runs' lock holders it ended
    terms: ServerTerms | None = None  # the database's words, for the fixes it tells

    def run(
        self,
        wanted: list[Request],
        lock_timeout: float,
        *,
        dry_run: bool,
        waiting: Callable[[], None] | None = None,
    ) -> list[str]:
        """What was (or, in a dry run, would be) decided, one sentence per batch; a
        CliError (nothing written) for the first request that cannot be proven; LockHeld
        (nothing written) when the sink's lock stays held past ``lock_timeout``
        (``waiting()`` is told when it was held at first). The sessions of fenced runs
        that held the lock and were ended: ``ended``."""
        backend = self.backend
        # a dry run ends nobody, not even a fenced run's session that holds the lock
        take = backend.acquire_sink_lock(
            self.sink_id, lock_timeout, waiting, end_fenced=not dry_run
        )
        self.ended = list(take.ended)
        if not take.held:
            raise LockHeld(self.sink_id)
        try:
            plans = self._check(wanted)
            if not dry_run:
                for request, gids in plans:
                    self._write(request, gids)
        finally:
            backend.unlock_sink(self.sink_id)
        verb = "would decide" if dry_run else "decided"
        return [
            f"{verb} batch {r.batch_id} with its {len(g)} prepared transaction(s) "
            f"({', '.join(g)}): the recovery commits them (the rows of each partition whose "
            "PREPARE survived the failover: one whose PREPARE it lost cannot be seen here)"
            if r.commit
            else f"{verb} batch {r.batch_id} as a batch without rows (an empty decision)"
            for r, g in plans
        ]

    def _check(self, wanted: list[Request]) -> list[tuple[Request, list[str]]]:
        sink, backend = self.sink_id, self.backend
        highest = backend.highest_decided(sink)
        asked = {r.batch_id for r in wanted}
        decided = backend.decisions(sink, [(sink, b) for b in asked])
        pending = undecided_prepared(backend, sink, None)
        plans: list[tuple[Request, list[str]]] = []
        for request in wanted:
            batch = request.batch_id
            if (sink, batch) in decided:
                state = "complete" if decided[(sink, batch)].complete else "not yet complete"
                self._refuse(
                    f"batch {batch} is decided already ({state}): it has no lost decision",
                    f"sqlsink recover --sink-id {sink} finishes a decided batch",
                )
            if highest is not None and batch <= highest:
                self._refuse(
                    f"batch {batch} is below the highest decided batch {highest}: a failover "
                    "or a restore loses the newest decisions, not one below a decided batch",
                    RUNBOOK,
                )
            txns = pending.get(batch, [])
            gids = sorted(t.gid for t in txns)
            if request.commit:
                self._check_attempts(batch, txns)
            elif gids:
                self._refuse(
                    f"batch {batch} has {len(gids)} prepared transaction(s) ({', '.join(gids)}): "
                    f"it is not a batch without rows (--commit-lost {batch} commits them)",
                    f"sqlsink recover --sink-id {sink} --commit-lost {batch}",
                )
            self._check_below(batch, highest, asked, pending)
            self._check_proof(batch)
            if request.commit:
                self._check_original(batch, txns)
            plans.append((request, gids))
            highest = batch
        return plans

    def _check_attempts(self, batch: int, txns: list[PreparedTransaction]) -> None:
        sink = self.sink_id
        if not txns:
            self._refuse(
                f"batch {batch} has no prepared transaction in database "
                f"{self.backend.database}: --commit-lost has nothing to commit",
                f"if batch {batch} had nothing for this sink (a foreachBatch function that did "
                f"not hand it to the writer), record that: sqlsink recover --sink-id {sink} "
                f"--mark-skipped {batch}; else its rows are lost: {RUNBOOK}",
            )
        by_partition: dict[tuple[int, int], list[str]] = defaultdict(list)
        runs = set()
        for txn in txns:
            gid = Gid.parse(txn.gid)
            assert gid is not None
            by_partition[(gid.part, gid.partition_id)].append(txn.gid)
            runs.add(gid.run_id)
        doubled = {k: sorted(v) for k, v in sorted(by_partition.items()) if len(v) > 1}
        if doubled or len(runs) > 1:
            shown = "; ".join(
                f"part {part} partition {p}: {', '.join(g)}" for (part, p), g in doubled.items()
            )
            self._refuse(
                f"batch {batch}'s prepared transactions are not one attempt per partition of "
                f"one run ({shown or 'runs ' + ', '.join(sorted(runs))}): which attempts "
                "Spark committed is not known here",
                "keep one transaction per partition, of the run that Spark committed the batch "
                "in, and roll back the others by hand"
                + (f" ({self.terms.rollback_example})" if self.terms else "")
                + ", then run this command again",
            )
        if not self.me.superuser and (others := {t.owner for t in txns} - {self.me.role}):
            self._refuse(
                f"batch {batch}'s transactions were prepared by role(s) "
                f"{', '.join(sorted(others))}, and only that role or a superuser can commit them",
                "run the command connected as that role or as a superuser",
            )

    def _check_below(
        self,
        batch: int,
        highest: int | None,
        asked: set[int],
        pending: dict[int, list[PreparedTransaction]],
    ) -> None:
        """No undecided batch that Spark went past may stay between the log and this one:
        below a decided batch, nothing could settle it any more."""
        known = set(pending) | set(self.proof.recorded)
        if self.proof.checkpoint is not None:
            known |= set(self.proof.checkpoint.commits)
        below = sorted(
            b
            for b in known
            if b < batch and (highest is None or b > highest) and b not in asked
            and (b in pending or self.proof.why(b) is not None)
        )  # fmt: skip
        if below:
            self._refuse(
                f"{_batches(below)} below batch {batch} (and above the highest decided one) "
                f"{'has' if len(below) == 1 else 'have'} no decision either: deciding batch "
                f"{batch} first would leave {'it' if len(below) == 1 else 'them'} below a "
                "decided batch, where nothing can settle it any more",
                "name them in the same command: --commit-lost B for a batch with prepared "
                "transactions, --mark-skipped B for one without",
            )

    def _check_original(self, batch: int, txns: list[PreparedTransaction]) -> None:
        """Without a checkpoint, the gids must be of a run that started before what shows
        that Spark committed the batch: a later run's are a re-run's, maybe partial."""
        strangers = stranger_gids(self.proof, batch, txns)
        if not strangers:
            return
        why = self.proof.why(batch)
        self._refuse(
            f"batch {batch}'s prepared transaction(s) {', '.join(sorted(strangers))} are of run "
            f"{', '.join(sorted(set(strangers.values())))}, which started after what shows that "
            f"Spark committed batch {batch} ({why}): a re-run of the batch (its checkpoint "
            "rewound), not the lost copy, and maybe part of it",
            f"restart the query: it runs batch {batch} again, and its first task rolls these "
            f"back; or pass --checkpoint DIR to check batch {batch} against Spark's commit log",
        )

    def _check_proof(self, batch: int) -> None:
        if self.proof.why(batch) is not None:
            return
        checkpoint = self.proof.checkpoint
        if checkpoint is not None:
            self._refuse(
                f"Spark's checkpoint {checkpoint.path} does not record batch {batch} as "
                f"committed (no commits/{batch}): Spark runs it (again), so its decision is "
                "not lost and must not be written here",
                "pass the checkpoint of the query that writes this sink; a batch that Spark "
                "re-runs needs nothing (its tasks roll the old transactions back)",
            )
        self._refuse(
            f"nothing shows that Spark committed batch {batch} (no checkpoint given, no commit "
            "of a later batch found its decision missing, no later batch aborted): it may be "
            "the batch Spark runs next, which must not be decided here",
            "pass --checkpoint DIR (the query's checkpointLocation) to check it against "
            "Spark's commit log, or restart the query: its next commit reports the batches "
            "whose decision was lost",
        )

    def _refuse(self, why: str, fix: str) -> None:
        raise CliError(f"sink {self.sink_id}: {why}; nothing was decided", fix)

    def _write(self, request: Request, gids: list[str]) -> None:
        runs = {g.run_id for x in gids if (g := Gid.parse(x)) is not None}
        self.backend.insert_decision(
            NewDecision(
                self.sink_id,
                request.batch_id,
                tuple(gids),
                0,  # the rows are in the prepared transactions, unreadable until committed
                self.query_id,
                runs.pop() if len(runs) == 1 else None,
                partitions=len(gids),
            )
        )


def _batches(batches: list[int]) -> str:
    return f"batch{'es' if len(batches) > 1 else ''} {', '.join(map(str, batches))}"
