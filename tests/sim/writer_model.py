"""The foreachBatch writer around the real core: what a user's foreachBatch function does.

``tests/sim/world.py`` models the data source's tasks and commits; this module models
the foreachBatch writer's API as a user's function drives it, for the stateful tests
of ``test_writer_api.py``. One streaming query writes sink ``shop`` through one or two
``ForeachBatchWriter`` objects with that sink id; its checkpoint (``offsets/N``,
``commits/N``) outlives its runs; a run is Spark's (classic: Spark's run id) or, on
Spark Connect, the run id its Python worker process makes for the sink and query
(``ProcessRuns``: one per process, shared by its writer objects). Everything synchronous: one
step at a time, no actors, no faults of the server (``memory.Server`` without a
scheduler: a wait nobody can grant moves the clock to its deadline).

The steps, and what each mirrors (fix/fb's ``sqlsink/spark/batch.py`` and
``sqlsink/spark/foreach_batch.py``); every rule in them is the real core's
(``sqlsink/core/writer_batch.py``, ``Committer``, ``Participant``, ``admission``,
``CheckpointCheck``), looked up in its module at each call so that a mutant
(``tests/sim/mutants.py``) can replace it:

- ``Batch.write``            -> ``Batch.write``: hand the batch over, judge the part
                                (``judge_part``), record its table, run its job
- ``Batch.hand_over``        -> ``Batch._hand_over``: identity, ``HandedBatches.handed``
                                (a second hand-over), the writer checks,
                                ``HandedBatches.hand`` and the gap filled (inside a
                                stream only)
- ``Batch.check_writer``     -> ``Batch._check_writer``: ``check_binding``,
                                ``check_forward``, ``read_decision`` (not mirrored: the
                                server settings check and ``ensure_schema``)
- ``Batch.fill_gap``         -> ``Batch._fill_gap``: ``fill_gap`` through a committer
                                with the checkpoint check and no tables
- ``Batch.decide_empty``     -> ``Batch._decide_empty``: outside a stream
                                ``check_skip_outside`` (and the later batches it
                                passes), ``decide_empty``
- ``Batch.exit``             -> ``Batch.__exit__``
- ``Batch.commit``           -> ``Batch._commit`` with ``_decided_meanwhile``
                                (not mirrored: ``check_after_commit``, server settings)
- ``Batch.abort``            -> ``Batch._abort``: ``Committer.abort_batch``, a new
                                process run id when the run id is not Spark's
                                (``ProcessRuns.renew``)
- ``WriterWorld.committer``  -> ``spark/plan.CommitterSession``: a session, a
                                ``Committer`` with ``CheckpointCheck`` over the model's
                                ``commits/`` (``checkpoint/parse.checkpoint_policy``)
- ``WriterWorld.identity``   -> ``ForeachBatchWriter.identity``: Spark's run id in
                                classic Spark, else the process's run id
                                (``ProcessRuns.get``)
- ``WriterWorld.unhanded``   -> ``ForeachBatchWriter.wrap``: after a wrapped function
                                returned, ``skip`` unless this run handed the batch
- ``WriterWorld.job``        -> ``spark/parts.prepare_part``: one task per partition,
                                in order; the first task that raises fails the job
                                (no task retries: the errors here are not transient)
- ``WriterWorld.task``       -> ``postgres/partition.write_partition`` around the real
                                ``Participant`` (as ``world.task_program``): an empty
                                partition prepares nothing
- ``to`` / ``block`` / ``skip`` calls -> ``ForeachBatchWriter.to(table)(df, id)``,
                                ``with writer.batch(id)``, ``writer.skip(id)``; a
                                ``Function`` with ``wrapped`` is given to foreachBatch
                                as ``writer.wrap(function)``

Spark around them (``WriterWorld.run_batch``): a run plans the checkpoint's last
uncommitted batch again (the same rows) or the next one, calls the function, and
writes ``commits/N`` only when the function returned; an exception ends the run (the
query fails). A driver process that dies (inside a block, or after the function
returned and before ``commits/N``) takes its writer objects and its ``HandedBatches``
with it. A restart in the same process keeps both (classic Spark; a Connect server
runs each query start in a new Python worker, which unpickles fresh writer objects and
makes its own run id). The operator's ``writer.skip`` outside the stream runs in a
script of its own (a new process: its own run id).

The checks are ``WriterWorld.check`` (after every step) and ``WriterWorld.final``
(after a last ``Committer.recover`` with the clock past runTimeout); a broken one
raises ``Broken`` with the invariant's code (``INVARIANTS``).
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlsink.core import admission, writer_batch
from sqlsink.core.checkpoint_check import CheckpointCheck, CheckpointMode, CheckpointPolicy
from sqlsink.core.committer import Committer
from sqlsink.core.gid import Gid
from sqlsink.core.model import Binding, Decision, PartitionOutcome, TaskIdentity
from sqlsink.core.participant import Participant, task_gid
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.core.writer_batch import HandedBatches, PartStart
from sqlsink.errors import DataLossError, SqlsinkError
from tests.sim.memory import Clock, MemoryBackend, Server
from tests.sim.world import Purpose

DB = "shop"
SINK = "shop"
QUERY = "q-orders"  # the streaming query's id (its checkpoint's metadata)
CHECKPOINT = "file:/checkpoints/orders"
ORDERS, LINES = "public.orders", "public.order_lines"
TABLES = (ORDERS, LINES)
RUN_TIMEOUT_S = 60.0

# the invariants the checks hold (a Broken names one)
INVARIANTS = {
    "F1": "a write call that returned normally has every row it was handed in its table, "
    "exactly once",
    "gids": "a gid is committed only for a write call that returned normally",
    "C2": "no data-loss error unless a decision was lost (the model loses none), save a "
    "run's skipped last batches",
    "advice": "the documented data-loss error (a run skipped its last batches and "
    "stopped) names them and its advice (writer.skip) clears it",
    "prepared": "nothing is left prepared but a dead driver's, and nothing after recover",
    "unexpected": "the writer raises only SqlsinkError for its own reasons",
}

# Defects of the rules under test that the machine found and that are not fixed yet: the
# default run counts them instead of failing (``--api-strict`` fails on them);
# test_writer_api.test_a_known_defect_still_happens proves each still happens, and fails
# once it is fixed: then remove it from here.
KNOWN: dict[str, str] = {
    "unhanded-first": "a run's first batches that an unwrapped function did not hand to the "
    "writer (HandedBatches knows a gap only after the run's first hand-over): the next "
    "batch's checkpoint check reports them as lost (DataLossError); writer.wrap(function) "
    "leaves none",
}
# fixed, and out of KNOWN: table-replayed and nested-hand-over (a run's second hand-over
# of a batch in one process is refused, HandedBatches.handed), connect-writers (one
# process run id per process, sink and query: ProcessRuns), tail-skip (a skip outside the
# stream passes over later batches Spark committed with nothing prepared)

Row = tuple[int, str, int, int]  # (batch, table, which DataFrame of the table, i)


class Broken(AssertionError):
    """An invariant of ``INVARIANTS`` does not hold."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"invariant {invariant} ({INVARIANTS[invariant]}): {message}")
        self.invariant = invariant


class UserError(Exception):
    """The user's foreachBatch code raised (its own error, not the writer's)."""


class DriverDied(BaseException):
    """The driver process died here: no ``__exit__``, no abort, nothing after."""


# -- what the user's function does ------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One DataFrame the function hands: into ``table``, the ``k``-th of that table."""

    table: str
    k: int

    def rows(self, batch_id: int, records: int) -> list[Row]:
        """Derived from the batch's records only: a replay hands the same rows."""
        return [(batch_id, self.table, self.k, i) for i in range(records)]

    def __repr__(self) -> str:
        return f"{self.table.split('.')[-1]}#{self.k}"


@dataclass(frozen=True)
class Call:
    """One call of the writer's API: ``to`` (one frame), ``block`` (any), ``skip``."""

    kind: str  # "to" | "block" | "skip"
    writer: int  # which writer object of the sink (0, or the second one: 1)
    frames: tuple[Frame, ...] = ()
    # a block only: another call made inside it, after ``at`` of its parts (a helper of
    # the user's that writes, or another thread's hand-over in between)
    inner: Call | None = None
    at: int = 0

    def __repr__(self) -> str:
        who = "" if self.writer == 0 else "w1."
        if self.kind == "to":
            return f"{who}to({self.frames[0]!r})"
        if self.kind == "skip":
            return f"{who}skip()"
        shown = [repr(f) for f in self.frames]
        if self.inner is not None:
            shown.insert(self.at, f"<{self.inner!r}>")
        return f"{who}batch[{', '.join(shown)}]"


@dataclass(frozen=True)
class Function:
    """What the function does with one batch's data (the same again on a replay):
    its calls in order; none: it returns early (``if df.isEmpty(): return``)."""

    calls: tuple[Call, ...]
    wrapped: bool = False  # given to foreachBatch as writer.wrap(function)

    def __repr__(self) -> str:
        shown = "; ".join(map(repr, self.calls)) or "return early"
        return f"wrap({shown})" if self.wrapped else shown


@dataclass(frozen=True)
class Fault:
    """Something that happens in one execution of the function (not data: a replay may
    differ): ``raise`` (the user's code raises inside call ``call``'s block after
    ``after`` of its parts, or after all calls when ``call`` is None), ``die`` (the
    driver process dies there; ``call`` None: after the function returned, before
    Spark wrote ``commits/N``)."""

    kind: str  # "raise" | "die"
    call: int | None = None
    after: int = 0


# -- the writer's world -----------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """``spark/identity.Identity``."""

    query_id: str
    run_id: str
    checkpoint: str | None
    from_spark: bool


@dataclass(eq=False)
class WriterObject:
    """A ``ForeachBatchWriter(sink_id=SINK, checkpoint_location=CHECKPOINT)``."""

    name: str
    process_run_id: str  # its own: what the writer made before ProcessRuns (mutants)


@dataclass(eq=False)
class Process:
    """A Python process that runs the function: its ``HANDED``, its ``PROCESS_RUNS``
    entry for (SINK, QUERY), its writer objects."""

    number: int
    run_id: str
    handed: HandedBatches = field(default_factory=HandedBatches)
    writers: list[WriterObject] = field(default_factory=list)
    dead: bool = False


@dataclass(eq=False)
class Run:
    """A run of the streaming query (one start)."""

    number: int
    run_id: str  # Spark's
    process: Process  # the driver's
    worker: Process  # where the function runs: the driver (classic) or a Connect worker
    # (batch, the writer's run id) of each hand-over that completed
    handed: list[tuple[int, str]] = field(default_factory=list)
    over: bool = False


@dataclass
class CallRecord:
    """One write call, as the checks see it."""

    batch_id: int
    call: Call
    run: int | None  # the model's run number; None: outside the stream
    rows: dict[str, list[Row]]
    gids: list[str] = field(default_factory=list)  # what its tasks prepared
    outcome: str = "running"  # "returned" | "raised: ..." | "died"
    known: str | None = None  # a KNOWN defect lost its rows (tolerated)
    nested: bool = False  # made inside another call's block, or made one inside its own
    run_id: str | None = None  # the writer's run id (its hand-over's identity)


class WriterWorld:
    """One sink, one streaming query, its runs, processes and writer objects."""

    def __init__(self, mode: str, tolerate: frozenset[str] = frozenset(KNOWN)) -> None:
        """``tolerate``: the ``KNOWN`` defects counted (``stats``), not failed."""
        assert mode in ("classic", "connect")
        self.mode = mode
        self.tolerate = tolerate
        self.clock = Clock()
        self.server = Server(self.clock, advance=self._advance)
        self.timeouts = TimeoutPolicy()
        self.ids = itertools.count(1)
        self.attempt_ids = itertools.count(0)  # Spark's taskAttemptId
        # the query's checkpoint
        self.offsets: dict[int, int] = {}  # batch -> its records (offsets/N)
        self.functions: dict[int, Function] = {}  # what the function does with that data
        self.commits: set[int] = set()
        self.executed_by: dict[int, Run] = {}  # batch -> the run that wrote commits/N
        self.run_of: dict[str, Run | None] = {}  # a writer's run id -> its Spark run
        self.process = self._new_process()
        self.operator: Process | None = None  # the operator's script (writer.skip outside)
        self.wrapped_commits: set[int] = set()  # commits/N after a wrapped function returned
        self.partitions = 1  # of each DataFrame in the batch running now
        self.run: Run | None = None
        self.runs: list[Run] = []
        self.calls: list[CallRecord] = []
        self.current: CallRecord | None = None
        self.broken: Broken | None = None
        self.loss_seen = False  # the last run ended on a data-loss error
        self.stats: Counter[str] = Counter()
        self.log: list[str] = []  # what happened, for a failure's report

    def _advance(self, to: float) -> None:
        self.clock.now = max(self.clock.now, to)

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}"

    def _new_process(self) -> Process:
        number = next(self.ids)
        writers = [WriterObject(f"w{i}", self._id("p")) for i in range(2)]
        return Process(number, self._id("p"), writers=writers)

    def fail(self, invariant: str, message: str) -> Broken:
        self.broken = Broken(invariant, message + self.story())
        return self.broken

    def story(self) -> str:
        return "\n\nwhat happened:\n  " + "\n  ".join(self.log[-40:])

    # -- sessions and committers (spark/plan.CommitterSession) ----------------------------

    @contextmanager
    def session(self, purpose: Purpose) -> Iterator[MemoryBackend]:
        session = self.server.connect(DB, role="sink", purpose=purpose, lock_timeout_s=10.0)
        backend = MemoryBackend(self.server, session)
        try:
            yield backend
        finally:
            if not session.dead:
                backend.close()

    @contextmanager
    def committer(
        self, identity: Identity, batch_id: int, *, check: bool, tables: Sequence[str]
    ) -> Iterator[Committer]:
        with self.session(Purpose("commit", SINK, None, identity.run_id, batch_id)) as backend:
            policy = CheckpointPolicy(CHECKPOINT, self.read_commits, CheckpointMode.WARN)
            yield Committer(
                backend,
                SINK,
                timeouts=self.timeouts,
                clock=self.clock,
                run_timeout_s=RUN_TIMEOUT_S,
                checkpoint_check=CheckpointCheck(backend, policy) if check else None,
                tables=tables,
            )

    def read_commits(self) -> frozenset[int]:
        return frozenset(self.commits)

    def identity(self, writer: WriterObject, batch_id: int) -> Identity:
        """ForeachBatchWriter.identity: inside a classic stream Spark's ids; on Connect,
        and outside a stream, the checkpoint's query id and the process's run id."""
        run = self.run
        if run is not None and self.mode == "classic" and writer in run.worker.writers:
            return Identity(QUERY, run.run_id, CHECKPOINT, True)
        return Identity(QUERY, self.process_run_id(writer), CHECKPOINT, False)

    def process_of(self, writer: WriterObject) -> Process:
        """The process a writer object lives in (the operator's: ``self.operator``)."""
        run = self.run
        if run is not None and writer in run.worker.writers:
            return run.worker
        if self.operator is not None and writer in self.operator.writers:
            return self.operator
        return self.process

    def process_run_id(self, writer: WriterObject) -> str:
        """ProcessRuns.get: one per (process, sink, query)."""
        return self.process_of(writer).run_id

    def renew_run_id(self, writer: WriterObject, old: str) -> None:
        """ProcessRuns.renew, after an abort of a batch by a process-made run."""
        process = self.process_of(writer)
        if process.run_id == old:
            process.run_id = self._id("p")

    # -- Spark's job and tasks ------------------------------------------------------------

    def job(
        self, identity: Identity, batch_id: int, part: int, table: str, rows: list[Row]
    ) -> list[PartitionOutcome | None]:
        """spark/parts.prepare_part: the DataFrame's partitions, one task each."""
        count = self.partitions
        split: list[list[Row]] = [rows[p::count] for p in range(count)]
        return [
            self.task(identity, batch_id, part, partition, table, split[partition])
            for partition in range(count)
        ]

    def task(
        self,
        identity: Identity,
        batch_id: int,
        part: int,
        partition: int,
        table: str,
        rows: list[Row],
    ) -> PartitionOutcome:
        """postgres/partition.write_partition around the real Participant."""
        started = self.clock()
        task = TaskIdentity(
            SINK,
            batch_id,
            partition,
            identity.run_id,
            next(self.attempt_ids),
            0,
            identity.query_id,
            part=part,
        )

        def outcome(gid: str | None, count: int, skipped: bool) -> PartitionOutcome:
            return PartitionOutcome(
                SINK,
                batch_id,
                partition,
                gid,
                count,
                skipped,
                task.query_id,
                task.run_id,
                started,
                self.clock(),
            )

        if not rows:  # nothing to write: no transaction, no gid
            return outcome(None, 0, False)
        purpose = Purpose("task", SINK, None, task.run_id, batch_id, partition, task.attempt_id)
        with self.session(purpose) as backend:
            participant = Participant(backend, task, self.timeouts, RUN_TIMEOUT_S)
            start = participant.before_write()
            if start.skip:
                self.stats["task skips (replay)"] += 1
                return outcome(None, 0, True)
            if start.adopt:
                self.stats["task adopts"] += 1
                if self.current is not None:
                    self.current.gids.append(start.adopt)
                return outcome(start.adopt, len(rows), False)
            gid = task_gid(task)
            backend.begin()
            try:
                for row in rows:
                    backend.write_row(table, (row, str(gid)))  # an append: no key
                backend.insert_marker(str(gid), SINK, batch_id, partition, len(rows))
                backend.prepare(str(gid))
                if self.current is not None:
                    self.current.gids.append(str(gid))
                participant.after_prepare(gid)
            except Exception:
                backend.rollback()
                raise
            return outcome(str(gid), len(rows), False)

    # -- the user's function and Spark around it ------------------------------------------

    def pending(self) -> int | None:
        """The batch a restart re-runs: the last planned one, when not committed."""
        last = max(self.offsets, default=None)
        return last if last is not None and last not in self.commits else None

    def next_batch(self) -> int:
        pending = self.pending()
        return pending if pending is not None else max(self.offsets, default=-1) + 1

    def change_function(self, function: Function) -> None:
        """The user's new code for the batch a restart re-runs (its records stay)."""
        pending = self.pending()
        assert self.run is None and pending is not None
        self.functions[pending] = function
        self.log.append(f"the user changes the function: batch {pending} now {function!r}")

    def start_run(self, same_process: bool) -> Run:
        assert self.run is None
        if not same_process or self.process.dead:
            self.process = self._new_process()
        run = Run(len(self.runs), self._id("spark-run-"), self.process, self.process)
        if self.mode == "connect":  # a Python worker per query start, unpickled writers
            run.worker = self._new_process()
        same = bool(self.runs) and self.runs[-1].process is run.process
        self.runs.append(run)
        self.run = run
        self.log.append(
            f"run {run.number} starts ({self.mode}, "
            f"{'the same' if same else 'a new'} process {run.process.number}) "
            f"at batch {self.next_batch()}"
        )
        return run

    def end_run(self, why: str, *, died: bool = False) -> None:
        run = self.run
        assert run is not None
        run.over = True
        if died:
            run.process.dead = True
        self.run = None
        self.log.append(f"run {run.number} ends: {why}")

    def run_batch(
        self, function: Function, records: int, partitions: int, fault: Fault | None
    ) -> None:
        """Spark runs the next batch (or re-runs the uncommitted one) and calls the
        function; commits/N only when it returned."""
        run = self.run
        assert run is not None
        batch_id = self.next_batch()
        if batch_id not in self.offsets:
            self.offsets[batch_id], self.functions[batch_id] = records, function
        records, function = self.offsets[batch_id], self.functions[batch_id]
        self.partitions = partitions
        self.clock.now += 1.0
        self.log.append(
            f"run {run.number}: batch {batch_id} ({records} records, {partitions} "
            f"partitions): {function!r}" + (f"  [fault: {fault}]" if fault else "")
        )
        try:
            for index, call in enumerate(function.calls):
                here = fault if fault is not None and fault.call == index else None
                self.call(run.worker.writers[call.writer], batch_id, call, records, here, run)
            if fault is not None and fault.call is None and fault.kind == "raise":
                raise UserError("the function raised after its calls")
            if function.wrapped:
                self.unhanded(run, batch_id)
        except DriverDied:
            self.end_run(f"the driver died in batch {batch_id}", died=True)
            return
        except Broken:
            raise
        except Exception as exc:
            self.end_run(f"batch {batch_id}: the function raised {type(exc).__name__}")
            self.loss_seen = isinstance(exc, DataLossError)
            return
        if fault is not None and fault.call is None and fault.kind == "die":
            self.end_run(f"the driver died before commits/{batch_id}", died=True)
            return
        self.commits.add(batch_id)
        self.executed_by[batch_id] = run
        if function.wrapped:
            self.wrapped_commits.add(batch_id)
        else:
            self.wrapped_commits.discard(batch_id)

    def unhanded(self, run: Run, batch_id: int) -> None:
        """ForeachBatchWriter.wrap, after the function returned normally: ``skip`` the
        batch (through the first writer object) unless this run handed it to a writer of
        the sink (``HANDED`` of the process the function runs in)."""
        writer = run.worker.writers[0]
        identity = self.identity(writer, batch_id)
        if not run.worker.handed.handed(SINK, identity.run_id, batch_id):
            self.stats["wrap skipped"] += 1
            self.call(writer, batch_id, Call("skip", 0), 0, None, run)

    def call(
        self,
        writer: WriterObject,
        batch_id: int,
        call: Call,
        records: int,
        fault: Fault | None,
        run: Run | None,
    ) -> None:
        """One call of the writer's API, recorded for the checks."""
        rows: dict[str, list[Row]] = {}
        for frame in call.frames:
            rows.setdefault(frame.table, []).extend(frame.rows(batch_id, records))
        record = CallRecord(batch_id, call, None if run is None else run.number, rows)
        record.nested = call.inner is not None or self.current is not None
        if self.current is not None:
            self.current.nested = True
        self.calls.append(record)
        outer, self.current = self.current, record
        try:
            block = Batch(self, writer, batch_id)
            if fault is not None and fault.after == 0:
                self._strike(fault)
            try:
                for index, frame in enumerate(call.frames):
                    self._inner(call, index, batch_id, records, run)
                    block.write(frame, frame.rows(batch_id, records))
                    if fault is not None and fault.after == index + 1:
                        self._strike(fault)
                self._inner(call, len(call.frames), batch_id, records, run)
            except DriverDied:
                raise
            except BaseException as exc:
                block.exit(exc)
                raise
            block.exit(None)
        except Broken:
            raise
        except DriverDied:
            record.outcome = "died"
            self.log.append(f"  {call!r}: the driver died")
            raise
        except SqlsinkError as exc:
            record.outcome = f"raised {type(exc).__name__}"
            self.log.append(f"  {call!r}: {type(exc).__name__}: {exc.message[:160]}")
            self.stats[type(exc).__name__] += 1
            if isinstance(exc, DataLossError) and not exc.context.get("judged"):
                exc.context["judged"] = True  # once, by the innermost call
                self.judge_loss(exc, run)
            raise
        except UserError:
            record.outcome = "raised UserError"
            self.log.append(f"  {call!r}: the user's code raised inside the block")
            raise
        except Exception as exc:
            record.outcome = f"raised {type(exc).__name__}"
            self.log.append(f"  {call!r}: {type(exc).__name__}: {exc}")
            raise self.fail("unexpected", f"{call!r} of batch {batch_id} raised {exc!r}") from exc
        finally:
            self.current = outer
        record.outcome = "returned"
        self.log.append(f"  {call!r}: returned")
        self.stats[f"{call.kind} returned"] += 1
        self.check_returned(record)

    def _inner(self, call: Call, parts: int, batch_id: int, records: int, run: Run | None) -> None:
        """The call made inside a block once ``parts`` of its parts were given."""
        if call.inner is not None and call.at == parts:
            writers = run.worker.writers if run is not None else self.process.writers
            self.call(writers[call.inner.writer], batch_id, call.inner, records, None, run)

    def _strike(self, fault: Fault) -> None:
        if fault.kind == "die":
            raise DriverDied
        raise UserError("the user's code raised inside the block")

    def skip_outside(self, batch_ids: Sequence[int]) -> None:
        """The documented advice, followed: the query stopped, ``writer.skip(N)`` for each
        batch, in order, from a writer object with ``checkpoint_location=`` in a script
        of the operator's (a process of its own)."""
        assert self.run is None
        self.operator = self._new_process()
        writer = self.operator.writers[0]
        self.log.append(f"outside the stream: writer.skip({', '.join(map(str, batch_ids))})")
        for batch_id in batch_ids:
            try:
                self.call(writer, batch_id, Call("skip", 0), 0, None, None)
            except SqlsinkError as exc:
                raise self.fail(
                    "advice",
                    f"following the advice, writer.skip({batch_id}) raised "
                    f"{type(exc).__name__}: {exc.message}",
                ) from exc

    def check_outside(self, backend: MemoryBackend, batch_id: int) -> frozenset[int]:
        """spark/batch._check_outside: the checkpoint's commits and the sink's prepared
        gids by batch, to ``check_skip_outside``; the later batches it passes over."""
        prepared: dict[int, list[str]] = {}
        for t in backend.prepared(SINK):
            if (g := Gid.parse(t.gid)) is not None and g.sink_id == SINK:
                prepared.setdefault(g.batch_id, []).append(t.gid)
        commits = frozenset(self.commits)
        return writer_batch.check_skip_outside(SINK, batch_id, CHECKPOINT, commits, prepared)

    def stuck(self) -> list[int]:
        """Batches a data-loss error named that the user can skip: those a run skipped
        last, and those a tolerated KNOWN defect left undecided."""
        return [b for b in self.undecided_commits() if self.stranded(b, None) or self.known(b)]

    def recover(self) -> None:
        """sqlsink recover --sink-id shop, once every run's heartbeat is past runTimeout."""
        self.clock.now += RUN_TIMEOUT_S * 3 + 1
        with self.session(Purpose("recover", SINK)) as backend:
            try:
                _, report = Committer(
                    backend, SINK, timeouts=self.timeouts, clock=self.clock
                ).recover()
            except DataLossError as exc:
                raise self.fail("C2", f"recover reports data loss: {exc.message}") from exc
        self.log.append(
            f"recover: {len(report.committed)} committed, {len(report.rolled_back)} rolled back"
        )

    # -- the checks -------------------------------------------------------------------------

    def table_rows(self, table: str) -> Counter[Row]:
        keys = self.server.tables.get((DB, table), {})
        return Counter(key[0] for key in keys)  # type: ignore[index]

    def decisions(self) -> dict[int, Decision]:
        with self.session(Purpose("check", SINK)) as backend:
            asked = [(SINK, b) for b in range(max(self.offsets, default=0) + 1)]
            found = backend.decisions(SINK, asked)
        return {b: d for (s, b), d in found.items() if s == SINK}

    def check_returned(self, record: CallRecord) -> None:
        """F1: a call that returned has every row it was handed in its table, once."""
        if record.known is not None:
            return
        for table, rows in record.rows.items():
            present = self.table_rows(table)
            missing = [r for r in rows if present[r] != 1]
            known = self.replayed(record, table, missing, present) if missing else None
            if known is not None:
                record.known = known
                self.stats[f"known: {known}"] += 1
                return
            if missing:
                counts = ", ".join(f"{r}: {present[r]}" for r in missing[:4])
                raise self.fail(
                    "F1",
                    f"{record.call!r} of batch {record.batch_id} returned, but rows of "
                    f"{table} are not there exactly once ({counts})",
                )

    def judge_loss(self, exc: DataLossError, run: Run | None) -> None:
        """C2: a data-loss error is a violation unless every batch it names was skipped
        last by another run that stopped (the documented case), and then it must say so
        and name the way out (writer.skip)."""
        lost = [int(b) for b in exc.context.get("lost", [])]
        not_documented = [b for b in lost if not self.stranded(b, run)]
        known = {self.known(b) for b in not_documented}
        if not_documented and None not in known:
            self.stats.update(f"known: {k}" for k in known)
            return
        if not lost or not_documented:
            raise self.fail(
                "C2",
                f"a data-loss error, but no decision was lost (batches {not_documented or lost} "
                f"were run by this query and not handed to the writer): {exc.message}",
            )
        if not all(str(b) in exc.message for b in lost) or (
            "writer.skip" not in exc.message and "loss-text" not in self.tolerate
        ):
            raise self.fail(
                "advice",
                f"the data-loss error for the skipped last batches {lost} does not name them "
                f"and writer.skip: {exc.message}",
            )
        if "writer.skip" not in exc.message:
            self.stats["known: loss-text"] += 1
        self.stats["documented data-loss error"] += 1

    def stranded(self, batch_id: int, now: Run | None) -> bool:
        """Run by another run than ``now``, which handed nothing after it (stopped)."""
        by = self.executed_by.get(batch_id)
        if batch_id in self.wrapped_commits:
            return False  # the wrapped function's batch: decided before commits/N
        return (
            by is not None
            and by is not now
            and batch_id in self.commits
            and all(h < batch_id for h, _ in by.handed)
        )

    def replayed(
        self, record: CallRecord, table: str, missing: list[Row], present: Counter[Row]
    ) -> str | None:
        """The KNOWN defect that explains the missing rows (when tolerated): none of them
        written, the batch decided by another writer identity: one of an earlier run
        (empty, or with this table), or another writer object of this run (Connect)."""
        if record.nested and "nested-hand-over" in self.tolerate:
            return "nested-hand-over"
        decision = self.decisions().get(record.batch_id)
        if (
            decision is None
            or any(present[r] for r in missing)
            or record.run_id is None
            or decision.run_id is None
            or decision.run_id == record.run_id
        ):
            return None
        deciding = self.run_of.get(decision.run_id)
        if deciding is not None and record.run is not None and deciding.number == record.run:
            known = "connect-writers"
        elif not decision.gids and decision.tables is None:
            known = "empty-replayed"
        elif table in (decision.tables or ()):
            known = "table-replayed"
        else:
            return None
        return known if known in self.tolerate else None

    def known(self, batch_id: int) -> str | None:
        """The KNOWN defect that explains why a batch its run ran is undecided (when
        tolerated): the writer identity that handed the next batch after it had handed
        nothing before it (HandedBatches found no gap)."""
        by = self.executed_by.get(batch_id)
        if batch_id in self.wrapped_commits:
            return None  # the wrapped function's batch: decided before commits/N
        after = sorted(h for h in by.handed if h[0] > batch_id) if by else []
        if by is None or not after:
            return None
        next_run_id = after[0][1]
        if any(h < batch_id and r == next_run_id for h, r in by.handed):
            return None  # that identity's gap held it: the fill should have decided it
        known = "unhanded-first" if all(h > batch_id for h, _ in by.handed) else "connect-writers"
        return known if known in self.tolerate else None

    def undecided_commits(self) -> list[int]:
        """Batches in commits/ without a decision, from the sink's first decision on
        (``checkpoint_check.missing_decisions``: those before it are not the sink's)."""
        decided = self.decisions()
        first = min(decided, default=None)
        if first is None:
            return []
        return sorted(b for b in self.commits if b >= first and b not in decided)

    def check(self, *, final: bool = False) -> None:
        """After every step (``final``: after the last recover)."""
        ok = {g for c in self.calls if c.outcome == "returned" for g in c.gids}
        bad = {g: c for c in self.calls if c.outcome != "returned" for g in c.gids}
        for table in TABLES:
            for key, gid in self.server.tables.get((DB, table), {}).items():
                if gid in bad and bad[gid].nested and "nested-hand-over" in self.tolerate:
                    continue
                if gid in bad:
                    c = bad[gid]
                    raise self.fail(
                        "gids",
                        f"{gid} of {c.call!r} (batch {c.batch_id}, {c.outcome}) is "
                        f"committed: row {key[0]}",  # type: ignore[index]
                    )
                if gid not in ok:
                    raise self.fail("gids", f"{gid} committed, of no call: row {key}")
            duplicated = [r for r, n in self.table_rows(table).items() if n > 1]
            if duplicated:
                raise self.fail("F1", f"rows of {table} written twice: {duplicated[:4]}")
        for record in self.calls:
            if record.outcome == "returned":
                self.check_returned(record)
        died = {g for c in self.calls if c.outcome == "died" for g in c.gids}
        left = [g for g in self.server.prepared if g.startswith("sqlsink_") and g not in died]
        if final:
            left = list(self.server.prepared)
        if left:
            raise self.fail(
                "prepared",
                f"prepared {'after the final recover' if final else 'between steps'}: {left}",
            )
        if final:
            unknown = [
                b for b in self.undecided_commits() if not (self.stranded(b, None) or self.known(b))
            ]
            if unknown:
                raise self.fail(
                    "C2",
                    f"batches {unknown} are in commits/ without a decision, but the run "
                    "that ran them handed a later batch to the writer",
                )


def failing() -> bool:
    """Whether an exception is on its way out (a teardown after a failed step)."""
    return sys.exc_info()[1] is not None


# -- spark/batch.py's Batch, its steps over the in-memory backend ---------------------------


class Batch:
    """One ``with writer.batch(batch_id)`` block (``to`` and ``skip`` are blocks too)."""

    def __init__(self, world: WriterWorld, writer: WriterObject, batch_id: int) -> None:
        self.world = world
        self.writer = writer
        self.batch_id = batch_id
        self.identity: Identity | None = None
        self.outcomes: list[PartitionOutcome | None] = []
        self.first_table: str | None = None  # first_options
        self.parts = 0
        self.tables: list[str] = []
        self.decision: Decision | None = None
        self.start: PartStart | None = None
        self.handed_before = False

    def write(self, frame: Frame, rows: list[Row]) -> None:
        """Batch.write: hand over, judge the part before its job, run the job."""
        identity = self.hand_over()
        self.judge(frame.table)
        if self.first_table is None:
            self.first_table = frame.table
        if frame.table not in self.tables:
            self.tables.append(frame.table)
        part, self.parts = self.parts, self.parts + 1
        self.outcomes += self.world.job(identity, self.batch_id, part, frame.table, rows)

    def hand_over(self) -> Identity:
        """Batch._hand_over."""
        if self.identity is not None:
            return self.identity
        world = self.world
        identity = world.identity(self.writer, self.batch_id)
        if world.current is not None:
            world.current.run_id = identity.run_id
        run = world.run
        # a stream's run hands its batches in order, once each; an operator's writer
        # outside the stream (writer.skip) is neither counted nor judged so
        handed = run.worker.handed if run is not None else None
        self.handed_before = handed is not None and handed.handed(
            SINK, identity.run_id, self.batch_id
        )
        self.identity = identity
        if run is not None:  # the function handed it, whatever the writer says of it
            run.handed.append((self.batch_id, identity.run_id))
        world.run_of[identity.run_id] = run
        self.decision = self.check_writer()
        gap = handed.hand(SINK, identity.run_id, self.batch_id) if handed else range(0)
        if gap:
            self.fill_gap(gap, identity)
        return identity

    def check_writer(self) -> Decision | None:
        """Batch._check_writer: binding and forward-only checks, the batch's decision."""
        assert self.identity is not None
        purpose = Purpose("commit", SINK, None, self.identity.run_id, self.batch_id)
        with self.world.session(purpose) as backend:
            highest = backend.highest_decided(SINK)
            admission.check_binding(
                SINK, backend.binding(SINK), highest, Binding.of(self.identity.query_id)
            )
            admission.check_forward(SINK, self.batch_id, highest)
            if self.world.run is not None:  # in the stream: the recorded hand-overs
                run_id = self.identity.run_id
                unfinished = writer_batch.unfinished_handovers(
                    backend, SINK, self.batch_id, highest
                )
                if unfinished:
                    raise writer_batch.handed_loss_error(SINK, unfinished, self.batch_id, run_id)
                backend.record_handover(SINK, run_id, self.batch_id)
            return writer_batch.read_decision(backend, SINK, self.batch_id)

    def judge(self, table: str | None) -> PartStart:
        """Batch._judge."""
        assert self.identity is not None
        self.start = writer_batch.judge_part(
            SINK,
            self.batch_id,
            self.identity.run_id,
            table,
            self.decision,
            handed_before=self.handed_before,
        )
        return self.start

    def fill_gap(self, gap: range, identity: Identity) -> None:
        """Batch._fill_gap."""
        with self.world.committer(identity, self.batch_id, check=True, tables=[]) as committer:
            filled = writer_batch.fill_gap(
                committer, gap, query_id=identity.query_id, run_id=identity.run_id
            )
        self.world.log.append(f"  gap {list(gap)} of run {identity.run_id}: filled {list(filled)}")
        self.world.stats["gap filled"] += len(filled)

    def decide_empty(self) -> None:
        """Batch._decide_empty."""
        identity = self.hand_over()
        if self.judge(None) is PartStart.REPLAY:
            return
        with self.world.committer(identity, self.batch_id, check=True, tables=[]) as committer:
            passing: frozenset[int] = frozenset()
            if self.world.run is None:  # outside the stream
                passing = self.world.check_outside(committer.backend, self.batch_id)
            writer_batch.decide_empty(
                committer,
                self.batch_id,
                query_id=identity.query_id,
                run_id=identity.run_id,
                passing=passing,
            )

    def exit(self, exc: BaseException | None) -> None:
        """Batch.__exit__."""
        if self.identity is None or self.first_table is None:
            if exc is None:
                self.decide_empty()
            return
        if exc is None:
            self.commit(self.identity)
        else:
            self.abort(self.identity)

    def commit(self, identity: Identity) -> None:
        """Batch._commit."""
        try:
            with self.world.committer(
                identity, self.batch_id, check=True, tables=self.tables
            ) as committer:
                if self.start is PartStart.WRITE and any(o and o.skipped for o in self.outcomes):
                    self.decided_meanwhile(committer)
                committer.commit_batch(
                    self.batch_id,
                    self.outcomes,
                    query_id=identity.query_id,
                    run_id=identity.run_id,
                )
        except BaseException:
            self.abort(identity)
            raise

    def decided_meanwhile(self, committer: Committer) -> None:
        """Batch._decided_meanwhile."""
        assert self.identity is not None
        for table in self.tables:
            writer_batch.check_part(
                committer.backend, SINK, self.batch_id, self.identity.run_id, table
            )

    def abort(self, identity: Identity) -> None:
        """Batch._abort."""
        try:
            with self.world.committer(
                identity, self.batch_id, check=False, tables=self.tables[:1]
            ) as committer:
                committer.abort_batch(
                    self.batch_id,
                    self.outcomes,
                    run_id=identity.run_id,
                    query_id=identity.query_id,
                )
        except Exception as exc:  # the original error matters more
            self.world.log.append(f"  the abort failed too: {exc!r}")
        if not identity.from_spark:
            self.world.renew_run_id(self.writer, identity.run_id)
