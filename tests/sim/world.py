"""Spark around the real core: streaming queries, batch loads, tasks, ``recover``, operators.

A world is one seed. It has one PostgreSQL (``memory.Server``) with a commit log in
database ``shop``, a target table, and writers:

- streaming queries: a checkpoint (``offsets/N`` then ``commits/N``, shared by all runs
  of the query), a replayable source (records ``(query, offset)``) and runs; a run is a
  driver actor with a run id of its own. It re-runs the checkpoint's last uncommitted
  batch with the same offsets, else plans the next one, launches one task actor per
  partition (split at random: a re-run may split differently), retries failed
  attempts (Spark's maxFailures 4), launches speculative copies, calls ``commit`` in a
  fresh session and ``abort`` when the job or the commit fails (then the run ends,
  as a failed streaming query does). A restart is a new run on the same checkpoint;
  one started while the previous run is only paused makes that one a zombie.
- a second writer on the same sink id, at times: another query, or a named batch load
  (batch 0, ``load=True``, re-run as an idempotent load);
- a second sink on the same database and table, at times.

Around them: ``sqlsink recover`` (as ``sqlsink/cli/recover.py`` does it: liveness by
sessions and the lock, ``--force``, one sink or every sink with leftovers), crashes of
any actor at any step (its sessions die; prepared transactions survive), pauses
(a driver paused beyond runTimeout becomes a zombie), sessions cut by the server, a
checkpoint restored from an older copy, an operator who follows the advice a refused
writer prints (a plain DELETE of the log from habit, then ``recover`` and ``forget``),
and foreign prepared transactions that look like the sink's.

The task code mirrors ``postgres/partition.write_partition`` around the real
``Participant``; commit and abort call the real ``Committer`` as ``spark/datasource.py``
does. After the world, the clock jumps past runTimeout and a final ``recover`` of
every sink runs; then ``Checker.final``.
"""

from __future__ import annotations

import itertools
import logging
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from sqlsink.core.committer import Committer
from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.core.gid import Gid
from sqlsink.core.model import PartitionOutcome, TaskIdentity
from sqlsink.core.participant import Participant, task_gid
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.errors import DataLossError, SinkBindingError, SqlsinkError
from tests.sim.checks import KNOWN, Checker
from tests.sim.memory import ConnectionLost, MemoryBackend, Server, SqlError
from tests.sim.sched import Actor, Failure, Sim, Violation

DB = "shop"
MAX_FAILURES = 4  # spark.task.maxFailures
OPERATOR_VISITS = 3  # times an operator comes to follow a refused writer's advice
Record = tuple[str, int]  # (source, offset): one row of the target
EXPECTED = (SqlsinkError, ConnectionLost, SqlError)  # what Spark sees as a failed call


@dataclass(frozen=True)
class Writer:
    """Who writes a sink: a streaming query (its id) or a named batch load."""

    kind: str  # "stream" | "load"
    query_id: str | None = None

    def __str__(self) -> str:
        return f"query {self.query_id}" if self.kind == "stream" else "the batch load"


@dataclass
class Purpose:
    """What a session works for (the checks read it)."""

    kind: str  # task | commit | abort | recover | operator
    sink: str
    writer: Writer | None = None
    run: str | None = None
    batch: int | None = None
    partition: int | None = None
    attempt: int | None = None
    messages: list[PartitionOutcome | None] | None = None


@dataclass
class Profile:
    """The knobs of a world (the mutation tests turn some of them up)."""

    max_steps: int = 6000  # a world still running then waits endlessly (invariant 11)
    calm_after: int = 1400  # from here on: no more faults, pauses, new writers
    source: tuple[int, int] = (6, 14)  # records of a query's source
    per_batch: tuple[int, int] = (1, 4)
    partitions: tuple[int, int] = (1, 3)
    runs: tuple[int, int] = (3, 6)  # runs a query may start
    p_keyed: float = 0.7  # the table has a key: rows of one key wait on each other
    p_second_writer: float = 0.5
    p_second_is_load: float = 0.5
    p_second_sink: float = 0.3
    p_rollback: float = 0.25
    p_operator: float = 0.7
    p_replace: float = 0.25  # a crashed query is replaced by a new one on its sink id
    p_other_role: float = 0.3
    p_superuser: float = 0.3  # the sink's role is a superuser
    # per step
    crash_task: float = 0.012
    crash_driver: float = 0.005
    crash_other: float = 0.008
    crash_killed: float = 0.3
    # more crashes at the steps of the crash table (docs/DESIGN.md 3.2): a step whose
    # label starts so is struck with this probability instead
    crash_at: tuple[tuple[str, float], ...] = (
        ("PREPARE", 0.04),
        ("attempt fate", 0.04),
        ("report", 0.04),
        ("insert decision", 0.04),
        ("COMMIT PREPARED", 0.04),
        ("mark complete", 0.04),
        ("write commits", 0.04),
    )
    pause: float = 0.004
    long_pause: float = 0.35
    terminate: float = 0.002
    speculate: float = 0.06
    restart: float = 0.08
    zombie_restart: float = 0.03
    recover: float = 0.004
    operator: float = 0.02
    rollback: float = 0.02
    storms: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)  # fault rates times one of these
    lock_timeout_s: float = 10.0
    run_timeout_s: float = 60.0
    cascade: bool = False  # the commit log of schema 1 (issue 12 item 1 reverted)


@dataclass
class Query:
    name: str
    query_id: str
    sink: str
    total: int
    runs_left: int
    start_step: int
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    commits: set[int] = field(default_factory=set)
    history: list[tuple[dict[int, tuple[int, int]], frozenset[int]]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    finished: bool = False
    retired: bool = False
    may_roll_back: bool = False
    refused: bool = False

    @property
    def writer(self) -> Writer:
        return Writer("stream", self.query_id)

    def snapshot(self) -> None:
        self.history.append((dict(self.offsets), frozenset(self.commits)))


@dataclass
class Load:
    name: str
    sink: str
    records: list[Record]
    runs_left: int
    start_step: int
    runs: list[Run] = field(default_factory=list)
    finished: bool = False
    retired: bool = False
    refused: bool = False

    @property
    def writer(self) -> Writer:
        return Writer("load")


@dataclass(eq=False)
class Run:
    owner: Query | Load
    run_id: str
    label: str
    actor: Actor | None = None
    attempt_ids: Iterator[int] = field(default_factory=lambda: itertools.count(0))
    jobs: list[Job] = field(default_factory=list)

    @property
    def is_load(self) -> bool:
        return isinstance(self.owner, Load)

    @property
    def sink(self) -> str:
        return self.owner.sink

    @property
    def query_id(self) -> str | None:
        return None if isinstance(self.owner, Load) else self.owner.query_id

    @property
    def driver_token(self) -> str | None:
        """A stream's driver token (spark/driver_token.py): one driver per run here."""
        return None if isinstance(self.owner, Load) else f"driver-of-{self.run_id}"

    @property
    def alive(self) -> bool:
        return self.actor is not None and not self.actor.done


@dataclass(eq=False)
class Job:
    """The tasks of one batch of one run (Spark's TaskSetManager)."""

    run: Run
    batch: int
    parts: list[list[Record]]
    outcomes: list[PartitionOutcome | None]
    attempts: list[list[Actor]]
    failures: list[int]
    changed: bool = False
    failed: bool = False
    over: bool = False  # the driver no longer listens (done, failed, or dead)


class World:
    """One seeded world: build it, ``run`` it, get None or the first failure."""

    def __init__(
        self, seed: int, profile: Profile | None = None, tolerate: frozenset[str] | None = None
    ) -> None:
        """``tolerate``: the checks (``checks.KNOWN`` codes) only counted, not failed;
        by default the known windows of the current core."""
        self.seed = seed
        self.profile = profile = profile or Profile()
        self.sim = Sim(seed)
        self.rng = rng = self.sim.rng
        self.checker = Checker(self, frozenset(KNOWN) if tolerate is None else tolerate)
        self.server = Server(
            self.sim.clock,
            hooks=self.checker,
            step_no=lambda: self.sim.steps,
            cascade=profile.cascade,
        )
        self.storm = rng.choice(profile.storms)  # how hard faults strike this world
        self.superuser = rng.random() < profile.p_superuser
        self.table = "keyed" if rng.random() < profile.p_keyed else "append"
        self.timeouts = TimeoutPolicy()
        self.ids = itertools.count(1)
        self.queries: list[Query] = []
        self.loads: list[Load] = []
        self.recovering: Actor | None = None
        self.operating: Actor | None = None
        self.stats: dict[str, int] = {}
        self.ending = False
        self.operator_visits = 0
        self._setup()

    # -- set-up -----------------------------------------------------------------------

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}x{self.rng.getrandbits(24):06x}"

    def _query(self, name: str, sink: str, start: int) -> Query:
        p = self.profile
        query = Query(
            name,
            self._id("q"),
            sink,
            self.rng.randint(*p.source),
            self.rng.randint(*p.runs),
            start,
        )
        query.may_roll_back = self.rng.random() < p.p_rollback
        self.queries.append(query)
        return query

    def _setup(self) -> None:
        p, rng = self.profile, self.rng
        third = max(1, p.calm_after // 3)
        self._query("q1", "s1", 0)
        if rng.random() < p.p_second_writer:
            start = rng.randint(0, third)
            if rng.random() < p.p_second_is_load:
                records: list[Record] = [("load", i) for i in range(rng.randint(1, 5))]
                self.loads.append(Load("load", "s1", records, rng.randint(1, 2), start))
            else:
                self._query("q2", "s1", start)
        if rng.random() < p.p_second_sink:
            self._query("q3", "s2", rng.randint(0, third))
        # prepared transactions the sink must never touch (invariant 6)
        foreign = [
            ("app_payment_7", DB),  # another application's
            ("sqlsink_s1_0_0_rforeign_1", "othershop"),  # the same sink id, another database
            ("sqlsink_s1_99999999999999999999_0_rx_1", DB),  # a look-alike beyond bigint
            ("sqlsink_s1_1_2_rbad_01", DB),  # a leading zero: not one of ours
        ]
        for gid, database in foreign:
            self.server.put_prepared(gid, database, owner="app")
            self.checker.foreign.add(gid)
        # a leftover of another sink (recover of every sink resolves it), and, at times,
        # one of this sink prepared by another role (left unless by a superuser)
        self.server.put_prepared("sqlsink_other-app_3_0_rdead_1", DB)
        if rng.random() < p.p_other_role:
            self.server.put_prepared("sqlsink_s1_0_5_rold_9", DB, owner="old_role")

    # -- sessions and errors -------------------------------------------------------------

    def connect(
        self, actor: Actor, purpose: Purpose, *, superuser: bool | None = None
    ) -> MemoryBackend:
        actor.step(f"connect ({purpose.kind})")
        session = self.server.connect(
            DB,
            role="sink",
            superuser=self.superuser if superuser is None else superuser,
            actor=actor,
            purpose=purpose,
            lock_timeout_s=self.profile.lock_timeout_s,
        )
        return MemoryBackend(self.server, session)

    def committer(self, backend: MemoryBackend, sink: str) -> Committer:
        return Committer(
            backend,
            sink,
            timeouts=self.timeouts,
            clock=self.sim.clock,
            run_timeout_s=self.profile.run_timeout_s,
        )

    def expected(self, exc: BaseException) -> None:
        """A failure Spark (or the CLI) sees and survives; data loss never is one."""
        if isinstance(exc, DataLossError):
            raise Violation("5", f"the sink reports data loss: {exc.message}")
        name = type(exc).__name__
        self.stats[name] = self.stats.get(name, 0) + 1
        if isinstance(exc, SqlsinkError) and "is rolled back" in exc.message:
            self.stats["late attempt rolled itself back"] = (
                self.stats.get("late attempt rolled itself back", 0) + 1
            )
        if isinstance(exc, SqlsinkError) and "waited" in exc.message and "sink lock" in exc.message:
            self.stats["sink lock wait timed out"] = (
                self.stats.get("sink lock wait timed out", 0) + 1
            )

    def _exit(self, actor: Actor) -> None:
        """Every actor's end: an exception the code under test should not raise fails."""
        if actor.kind == "driver":
            end = "crashed" if actor.crashed else str(actor.result).split(":")[0]
            self.stats[f"run {end}"] = self.stats.get(f"run {end}", 0) + 1
        if actor.error is None:
            return
        if isinstance(actor.error, EXPECTED):
            self.expected(actor.error)
            return
        text = "".join(traceback.format_exception(actor.error))
        self.sim.fail(Failure("exception", f"{actor.name}: unexpected exception\n{text}"))

    def spawn(self, name: str, kind: str, program: Callable[[Actor], object]) -> Actor:
        actor = self.sim.spawn(name, kind, program)
        actor.on_exit.append(self._exit)
        return actor

    def crash(self, actor: Actor) -> None:
        if actor.done:
            return
        self.server.end_sessions_of(actor)
        self.sim.resume(actor, crash=True)
        if actor.kind == "driver":  # the executors lose their driver: most tasks die
            run: Run = actor.data["run"]
            self._maybe_replace(run)
            for job in run.jobs:
                job.over = True
                for attempts in job.attempts:
                    for task in attempts:
                        if not task.done and self.rng.random() < 0.6:
                            self.crash(task)

    def _maybe_replace(self, run: Run) -> None:
        """The query died; its user starts a new query (new checkpoint) on the same sink
        id instead of restarting it: the new one is refused, and prints its advice."""
        query = run.owner
        if (
            self.calm
            or not isinstance(query, Query)
            or query.name != "q1"
            or any(q.name == "q4" for q in self.queries)
            or self.rng.random() >= self.profile.p_replace
        ):
            return
        query.retired = True
        self._query("q4", query.sink, self.sim.steps)
        self.sim.record("world: q1 crashed; its user starts query q4 on the same sink id")

    # -- tasks: postgres/partition.write_partition around the real Participant ------------

    def task_program(
        self, job: Job, partition: int, attempt_id: int, attempt_number: int
    ) -> Callable[[Actor], PartitionOutcome]:
        run, records = job.run, sorted(job.parts[partition])
        task = TaskIdentity(
            run.sink,
            job.batch,
            partition,
            run.run_id,
            attempt_id,
            attempt_number,
            run.query_id,
            writer_token=run.driver_token,
        )

        def outcome(gid: str | None, rows: int, skipped: bool, started: float) -> PartitionOutcome:
            now = self.sim.now
            return PartitionOutcome(
                task.sink_id,
                task.batch_id,
                partition,
                gid,
                rows,
                skipped,
                task.query_id,
                task.run_id,
                started,
                now,
            )

        def program(actor: Actor) -> PartitionOutcome:
            started = self.sim.now
            if not records:  # an empty partition: no connection, no gid
                actor.step("empty partition")
                return outcome(None, 0, False, started)
            purpose = Purpose(
                "task",
                run.sink,
                run.owner.writer,
                run.run_id,
                job.batch,
                partition,
                attempt_id,
            )
            backend = self.connect(actor, purpose)
            try:
                participant = Participant(backend, task, self.timeouts, self.profile.run_timeout_s)
                start = participant.before_write()
                self.checker.on_task_start(backend.session, start)
                if start.skip:
                    result = outcome(None, 0, True, started)
                elif start.adopt:
                    result = outcome(start.adopt, len(records), False, started)
                else:
                    gid = task_gid(task)
                    backend.begin()
                    try:
                        for record in records:
                            key = record if self.table == "keyed" else (record, attempt_id)
                            backend.write_row(self.table, key)
                        backend.insert_marker(
                            str(gid), task.sink_id, task.batch_id, partition, len(records)
                        )
                        backend.prepare(str(gid))
                        participant.after_prepare(gid)
                    except EXPECTED:
                        backend.rollback()
                        raise
                    result = outcome(str(gid), len(records), False, started)
            finally:
                if not backend.session.dead:
                    backend.close()
            actor.step("report to the driver")
            return result

        return program

    def launch(self, job: Job, partition: int) -> None:
        run = job.run
        attempt_id = next(run.attempt_ids)
        number = len(job.attempts[partition])
        actor = self.spawn(
            f"{run.label} b{job.batch} p{partition} a{attempt_id}",
            "task",
            self.task_program(job, partition, attempt_id, number),
        )
        job.attempts[partition].append(actor)
        actor.on_exit.append(lambda a: self._attempt_ended(job, partition, a))

    def _attempt_ended(self, job: Job, partition: int, actor: Actor) -> None:
        job.changed = True
        if isinstance(actor.error, SinkBindingError):
            job.run.owner.refused = True
        if job.over:
            return
        if not actor.crashed and actor.error is None:
            if job.outcomes[partition] is None:
                job.outcomes[partition] = actor.result
                self._kill_others(job, partition)
            return
        if job.outcomes[partition] is not None:
            return  # a loser that failed: nobody cares
        job.failures[partition] += 1
        if job.failures[partition] >= MAX_FAILURES:
            job.failed = True
        elif all(a.done for a in job.attempts[partition]):
            self.launch(job, partition)

    def _kill_others(self, job: Job, partition: int | None = None) -> None:
        """Spark kills the attempts it no longer needs; they may still finish."""
        parts = range(len(job.parts)) if partition is None else [partition]
        for p in parts:
            for attempt in job.attempts[p]:
                attempt.killed = True

    def run_job(
        self, actor: Actor, run: Run, batch: int, records: list[Record]
    ) -> list[PartitionOutcome | None] | None:
        """Launch the batch's tasks and wait for them: the messages, or None if it failed."""
        count = self.rng.randint(*self.profile.partitions)
        parts: list[list[Record]] = [[] for _ in range(count)]
        for record in records:
            parts[self.rng.randrange(count)].append(record)
        job = Job(run, batch, parts, [None] * count, [[] for _ in range(count)], [0] * count)
        run.jobs.append(job)
        for partition in range(count):
            self.launch(job, partition)
        while True:
            actor.step(
                f"await the tasks of batch {batch}",
                lambda: job.changed,
                self.sim.now + self.rng.uniform(1.0, 4.0),
            )
            job.changed = False
            if job.failed or all(o is not None for o in job.outcomes):
                job.over = True
                self._kill_others(job)
                return None if job.failed else list(job.outcomes)
            if self.calm or self.rng.random() >= self.profile.speculate:
                continue
            running = [
                p
                for p in range(count)
                if job.outcomes[p] is None
                and len(job.attempts[p]) == 1
                and not job.attempts[p][0].done
            ]
            if running:
                self.launch(job, self.rng.choice(running))

    # -- the driver: commit and abort as spark/datasource.py calls them --------------------

    def spark_commit(
        self, actor: Actor, run: Run, batch: int, messages: list[PartitionOutcome | None]
    ) -> bool:
        purpose = Purpose(
            "commit", run.sink, run.owner.writer, run.run_id, batch, messages=messages
        )
        try:
            backend = self.connect(actor, purpose)
        except EXPECTED as exc:
            self.expected(exc)
            return False
        try:
            self.committer(backend, run.sink).commit_batch(
                batch,
                messages,
                query_id=next((o.query_id for o in messages if o and o.query_id), None),
                run_id=next((o.run_id for o in messages if o and o.run_id), None),
                load=run.is_load,
            )
            self.checker.after_commit(backend.session, batch)
            return True
        except EXPECTED as exc:
            self.expected(exc)
            if isinstance(exc, SqlsinkError) and "bound to" in exc.message:
                run.owner.refused = True
            return False
        finally:
            if not backend.session.dead:
                backend.close()

    def spark_abort(
        self, actor: Actor, run: Run, batch: int, messages: list[PartitionOutcome | None]
    ) -> None:
        purpose = Purpose("abort", run.sink, run.owner.writer, run.run_id, batch, messages=messages)
        try:
            backend = self.connect(actor, purpose)
        except EXPECTED as exc:
            self.expected(exc)
            return
        try:
            self.committer(backend, run.sink).abort_batch(
                batch,
                messages,
                run_id=run.run_id if run.is_load else None,
                load=run.is_load,
                writer_token=run.driver_token,
            )
        except EXPECTED as exc:
            self.expected(exc)
        finally:
            if not backend.session.dead:
                backend.close()

    def _job_messages(self, run: Run) -> list[PartitionOutcome | None]:
        job = run.jobs[-1]
        return list(job.outcomes)

    def stream_driver(self, run: Run) -> Callable[[Actor], str]:
        query = run.owner
        assert isinstance(query, Query)

        def program(actor: Actor) -> str:
            actor.step("start: read the checkpoint")
            last = max(query.offsets, default=-1)
            rerun = last >= 0 and last not in query.commits  # Spark re-runs its last batch
            batch = last if rerun else last + 1
            while True:
                actor.step(f"plan batch {batch}")
                if not rerun:  # offsetLog.add: refused when another run wrote it
                    if batch in query.offsets:
                        return f"concurrent update of offsets/{batch}"
                    start = query.offsets[batch - 1][1] if batch > 0 else 0
                    if start >= query.total:
                        query.finished = True
                        return "done: the source has nothing more"
                    end = min(query.total, start + self.rng.randint(*self.profile.per_batch))
                    query.offsets[batch] = (start, end)
                    query.snapshot()
                rerun = False
                start, end = query.offsets[batch]
                records: list[Record] = [(query.name, i) for i in range(start, end)]
                messages = self.run_job(actor, run, batch, records)
                if messages is None:
                    self.spark_abort(actor, run, batch, self._job_messages(run))
                    return f"batch {batch}: a task failed {MAX_FAILURES} times"
                if not self.spark_commit(actor, run, batch, messages):
                    self.spark_abort(actor, run, batch, messages)
                    return f"batch {batch}: commit failed"
                actor.step(f"write commits/{batch}")
                if batch in query.commits:
                    return f"concurrent update of commits/{batch}"
                query.commits.add(batch)
                query.snapshot()
                self.checker.on_spark_committed(query.name, batch, records)
                batch += 1

        return program

    def load_driver(self, run: Run) -> Callable[[Actor], str]:
        load = run.owner
        assert isinstance(load, Load)

        def program(actor: Actor) -> str:
            actor.step("plan the load")
            messages = self.run_job(actor, run, 0, list(load.records))
            if messages is None:
                self.spark_abort(actor, run, 0, self._job_messages(run))
                return "a task failed"
            if not self.spark_commit(actor, run, 0, messages):
                self.spark_abort(actor, run, 0, messages)
                return "commit failed"
            load.finished = True
            self.checker.on_spark_committed("the load", 0, list(load.records))
            return "done"

        return program

    def start_run(self, owner: Query | Load) -> None:
        owner.runs_left -= 1
        run = Run(owner, self._id("r"), "")
        run.label = f"{owner.name}/{run.run_id[:4]}"
        program = self.load_driver(run) if isinstance(owner, Load) else self.stream_driver(run)
        run.actor = self.spawn(f"{run.label} driver", "driver", program)
        run.actor.data["run"] = run
        owner.runs.append(run)

    # -- recover and the operator ----------------------------------------------------------

    def recover_program(
        self, sink: str | None, force: bool, superuser: bool
    ) -> Callable[[Actor], None]:
        def program(actor: Actor) -> None:
            backend = self.connect(actor, Purpose("recover", sink or "*"), superuser=superuser)
            try:
                for each in [sink] if sink else self._sinks_with_leftovers(backend):
                    self._recover_sink(backend, each, force)
            finally:
                if not backend.session.dead:
                    backend.close()

        return program

    def _sinks_with_leftovers(self, backend: MemoryBackend) -> list[str]:
        found = {s for s, _ in backend.decisions(None)}
        for txn in backend.prepared(None):
            gid = Gid.parse(txn.gid)
            if gid is not None and txn.database == backend.database:
                found.add(gid.sink_id)
        return sorted(found)

    def _recover_sink(self, backend: MemoryBackend, sink: str, force: bool) -> None:
        """cli/recover.py for one sink: liveness, the lock, the committer's recover."""
        backend.session.purpose = Purpose("recover", sink)
        locked = backend.try_sink_lock(sink)
        live = not locked or bool(backend.sink_sessions(sink))
        if live and not force:
            if locked:
                backend.unlock_sink(sink)
            return
        if not locked and not backend.wait_sink_lock(sink, self.profile.lock_timeout_s):
            return
        try:
            self.committer(backend, sink).recover()
        except DataLossError as exc:
            self.expected(exc)
        except (SqlsinkError, SqlError) as exc:
            self.expected(exc)
        finally:
            backend.unlock_sink(sink)

    def operator_program(self, sink: str) -> Callable[[Actor], None]:
        """A refused writer printed its advice; the owner's query is retired. The operator
        first types the old advice (a plain DELETE), then follows the current one."""

        def program(actor: Actor) -> None:
            backend = self.connect(actor, Purpose("operator", sink))
            try:
                try:
                    backend.operator_delete_sink(sink)
                except SqlError as exc:
                    self.expected(exc)
                    self._recover_sink(backend, sink, force=False)
                    backend.session.purpose = Purpose("operator", sink)
                    with backend.sink_lock(sink):
                        backend.forget_sink(sink)
                self.stats["forgotten"] = self.stats.get("forgotten", 0) + 1
            finally:
                if not backend.session.dead:
                    backend.close()

        return program

    # -- the world's own events -------------------------------------------------------------

    @property
    def calm(self) -> bool:
        return self.sim.steps >= self.profile.calm_after

    def _writers(self) -> list[Query | Load]:
        return [*self.queries, *self.loads]

    def _tick(self) -> None:
        """Start what is due: runs, restarts and zombies, recover, the operator, a rollback."""
        p, rng, steps = self.profile, self.rng, self.sim.steps
        if self.ending:
            return
        for owner in self._writers():
            if (
                owner.retired
                or owner.finished
                or owner.refused  # its user reads the advice instead of restarting it
                or owner.runs_left <= 0
                or steps < owner.start_step
            ):
                continue
            alive = [r for r in owner.runs if r.alive]
            if not alive:
                if rng.random() < p.restart:
                    self.start_run(owner)
            elif (
                not self.calm
                and isinstance(owner, Query)
                and all(r.actor is not None and r.actor.paused_until > self.sim.now for r in alive)
                and rng.random() < p.zombie_restart
            ):
                self.start_run(owner)  # the paused run becomes a zombie
                self.stats["zombie"] = self.stats.get("zombie", 0) + 1
        if self.calm:
            return
        if (self.recovering is None or self.recovering.done) and rng.random() < p.recover:
            sink = rng.choice(["s1", "s1", None])
            force, superuser = rng.random() < 0.3, rng.random() < 0.5
            self.recovering = self.spawn(
                f"recover {sink or 'all'}{' --force' if force else ''}",
                "recover",
                self.recover_program(sink, force, superuser),
            )
        if (self.operating is None or self.operating.done) and rng.random() < p.operator:
            self._maybe_operate()
        if rng.random() < p.rollback:
            self._maybe_roll_back()

    def _maybe_operate(self) -> None:
        refused = [w for w in self._writers() if w.refused and w.sink == "s1"]
        if not refused or self.rng.random() >= self.profile.p_operator:
            return
        epoch = self.checker.epoch["s1"]
        owner = self.checker.owner.get(("s1", epoch))
        owners = [q for q in self.queries if q.sink == "s1" and owner == q.writer]
        if any(r.alive for q in owners for r in q.runs) or any(
            r.alive for w in refused for r in w.runs
        ):
            return
        self.operator_visits += 1
        for writer in refused:
            writer.refused = False
            writer.runs_left += 1
        for query in owners:  # stopped for good before its log is removed
            query.retired = True
        self.operating = self.spawn("operator", "operator", self.operator_program("s1"))

    def _maybe_roll_back(self) -> None:
        """A checkpoint restored from an older copy: Spark re-plans decided batches."""
        for query in self.queries:
            if not query.may_roll_back or any(r.alive for r in query.runs) or query.retired:
                continue
            sink_epoch = (query.sink, self.checker.epoch[query.sink])
            if self.checker.owner.get(sink_epoch) != query.writer:
                continue
            highest = self.checker._highest(query.sink)
            if highest is None:
                continue
            older = []
            for offsets, commits in query.history:
                last = max(offsets, default=-1)
                upcoming = last if last >= 0 and last not in commits else last + 1
                if upcoming < highest:
                    older.append((offsets, commits))
            if not older:
                continue
            offsets, commits = self.rng.choice(older)
            query.offsets, query.commits = dict(offsets), set(commits)
            query.may_roll_back = query.finished = False
            query.runs_left = max(query.runs_left, 2)
            self.stats["rollback"] = self.stats.get("rollback", 0) + 1
            self.sim.record(f"world: {query.name}'s checkpoint restored from an older copy")
            return

    def _fault(self, actor: Actor) -> str | None:
        """Maybe strike the actor about to run: crash it, pause it, or cut its session."""
        if self.calm:
            return None
        p, rng = self.profile, self.rng
        crash = {"task": p.crash_task, "driver": p.crash_driver}.get(actor.kind, p.crash_other)
        crash *= self.storm
        if actor.killed:
            crash = max(crash, p.crash_killed)
        for prefix, chance in p.crash_at:
            if actor.label.startswith(prefix):
                crash = max(crash, chance)
        if rng.random() < crash:
            return "crash"
        if actor.kind in ("driver", "task", "recover") and rng.random() < p.pause * self.storm:
            return "pause"
        if rng.random() < p.terminate * self.storm:
            sessions = [s for s in self.server.sessions.values() if s.actor is actor]
            if sessions:
                return "terminate"
        return None

    def _strike(self, actor: Actor, fault: str) -> None:
        if fault == "crash":
            self.crash(actor)
        elif fault == "pause":
            p = self.profile
            if self.rng.random() < p.long_pause:
                span = self.rng.uniform(p.run_timeout_s, 3 * p.run_timeout_s)
            else:
                span = self.rng.uniform(1.0, 20.0)
            actor.paused_until = self.sim.now + span
        else:
            for session in [s for s in self.server.sessions.values() if s.actor is actor]:
                self.server.end_session(session, terminated=True)

    def _pending(self) -> bool:
        """Whether anything may still start."""
        if self.ending:
            return False
        for owner in self._writers():
            if not (owner.retired or owner.finished or owner.refused or owner.runs_left <= 0):
                return True
        # a refused writer waits for the operator, who acts a few times at most
        return (
            not self.calm
            and self.profile.operator > 0
            and self.operator_visits < OPERATOR_VISITS
            and any(w.refused for w in self._writers())
        )

    # -- running a world ---------------------------------------------------------------------

    def _loop(self, limit: int) -> None:
        sim, rng = self.sim, self.rng
        while sim.failure is None:
            if sim.steps >= limit:
                sim.fail(
                    Failure(
                        "stuck",
                        f"the world did not finish in {limit} steps (an endless wait? "
                        "invariant 11); still running: "
                        + ", ".join(f"{a.name} ({a.label})" for a in sim.live()),
                    )
                )
                return
            self._tick()
            live = sim.live()
            if not live:
                if not self._pending():
                    return
                sim.now += 1.0
                sim.steps += 1
                continue
            ready = [a for a in live if a.ready(sim.now)]
            if not ready:
                wakes = [w for a in live if (w := a.wakes_at(sim.now)) is not None]
                if not wakes:
                    sim.fail(
                        Failure(
                            "stuck",
                            "every actor waits and nothing can wake them: "
                            + ", ".join(f"{a.name} ({a.label})" for a in live),
                        )
                    )
                    return
                sim.now = max(sim.now, min(wakes))
                continue
            actor = rng.choice(ready)
            fault = self._fault(actor)
            sim.record(f"{actor.name}: {actor.label}" + (f"  <<{fault}>>" if fault else ""))
            if fault is None:
                sim.resume(actor)
            else:
                self._strike(actor, fault)
            sim.steps += 1
            sim.now += rng.expovariate(1 / 0.2)
            if sim.failure is None:
                try:
                    self.checker.check_state()
                except Violation as exc:
                    sim.fail(Failure("violation", str(exc), exc.invariant))

    def run(self) -> Failure | None:
        """Run the world to its end, then the final recover and the final checks."""
        with isolated():
            try:
                self._loop(self.profile.max_steps)
                if self.sim.failure is None:
                    self._final()
            finally:
                self.sim.teardown()
        return self.sim.failure

    def _final(self) -> None:
        sim = self.sim
        sim.now += self.profile.run_timeout_s * 3 + 1  # every run is stale now
        sim.record("world: the end; a final sqlsink recover of every sink")
        self.ending = True
        sinks = sorted({w.sink for w in self._writers()} | {"other-app"})
        for sink in sinks:
            self.spawn(f"final recover {sink}", "final", self.recover_program(sink, True, True))
        saved = self.profile
        self.profile = replace(saved, calm_after=0)
        try:
            self._loop(sim.steps + 2000)
        finally:
            self.profile = saved
        if sim.failure is None:
            try:
                self.checker.final(sinks)
            except Violation as exc:
                sim.fail(Failure("violation", str(exc), exc.invariant))


@contextmanager
def isolated() -> Iterator[None]:
    """Meanwhile: no fault injection of the crash tests (a faults file another test left
    in the environment must not strike the core here), and none of the sink's own log
    lines (they would cost more than the simulation)."""
    logger = logging.getLogger("sqlsink")
    before = logger.disabled
    faults = os.environ.pop(FAULTS_ENV, None)
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before
        if faults is not None:
            os.environ[FAULTS_ENV] = faults


def report(world: World, failure: Failure) -> str:
    """What a failing world prints: the seed, the step, the trace, how to replay."""
    return (
        f"simulation failed: seed {world.seed}, step {world.sim.steps} "
        f"(simulated time {world.sim.now:.1f} s): {failure.kind}\n{failure.text}\n\n"
        f"last {len(world.sim.trace)} steps (each: the actor and what it was about to do):\n"
        f"{world.sim.describe()}\n\n"
        f"replay: pytest tests/sim --sim-seed {world.seed}"
        + ("" if world.checker.tolerate else " --sim-strict")
    )
