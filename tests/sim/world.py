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
- a second sink on the same database and table, at times;
- at times, a second query on the same sink id started in the first one's driver (a
  notebook, a Spark Connect server): one JVM, so one driver token
  (``spark/driver_token.py``); its tasks are refused, and Spark aborts its batches
  with no message at all.

Drivers are processes (``Process``): a run whose predecessor ended without its process
dying (a failed query restarted in a notebook, a reused Python worker) may start in the
same process, and the sessions its Python workers kept between uses
(``postgres/sessions.py``: commits, aborts, tasks) serve the new run. The stream's
commit relates Spark's checkpoint to the log (``core/checkpoint_check.py``; listing
``commits/`` is slow at times, under the sink lock).

Around them: ``sqlsink recover`` (as ``sqlsink/cli/recover.py`` does it: liveness by
sessions and the lock, ``--force``, one sink or every sink with leftovers), crashes of
any actor at any step (its sessions die; prepared transactions survive), pauses
(a driver paused beyond runTimeout becomes a zombie), sessions cut by the server, a
checkpoint restored from an older copy, an operator who follows the advice a refused
writer prints (a plain DELETE of the log from habit, then ``recover`` and ``forget``),
foreign prepared transactions that look like the sink's, and failovers: the server
goes back to a cut just before some decision (an asynchronous standby promoted; it has
the PREPAREs, not what followed), every session ends, Spark's checkpoint keeps its
``commits/``. The sources of the queries that lost a batch Spark committed get new
records (a stream goes on), the next commit reports the loss (``DataLossError``), and an
operator follows the error's advice: re-deliver (rewind the checkpoint), or accept the
loss (``recover``, ``forget``), which the final check then counts as reported.

A world's server has a flavour (``Profile.flavour``, ``memory.py``): PostgreSQL's, or
MariaDB's XA. On MariaDB the task code mirrors ``mariadb/partition.write_partition``: the
session says whose it is after the participant's checks, and after XA PREPARE the task
disconnects and runs the check after PREPARE on a new session; no session is kept
between uses; foreign branches are another application's formatID and look-alikes of
the sink's (XA has no database: another database's sink of the same id is not a case);
and instead of failovers the server restarts (every session ends, nothing is lost).

The task code mirrors ``postgres/partition.write_partition`` around the real
``Participant``; commit and abort call the real ``Committer`` as ``spark/datasource.py``
does (``DataSource``: what its abort passes). After the world, the clock jumps past
every run's timeout and a final ``recover`` of every sink runs; then ``Checker.final``.
"""

from __future__ import annotations

import itertools
import logging
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sqlsink.checkpoint.parse import Checkpoint
from sqlsink.cli.output import CliError
from sqlsink.cli.recover_lost import Decider, requests
from sqlsink.core.admin import RoleInfo
from sqlsink.core.checkpoint_check import (
    CheckpointCheck,
    CheckpointMode,
    CheckpointPolicy,
    EntryPoint,
)
from sqlsink.core.committer import Committer
from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.core.gid import Gid
from sqlsink.core.lost import Evidence, lost_batches, undecided_prepared, unsure_batches
from sqlsink.core.model import PartitionOutcome, TaskIdentity
from sqlsink.core.participant import Participant, task_gid
from sqlsink.core.resolution import Scope
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.errors import DataLossError, SinkBindingError, SqlsinkError
from sqlsink.spark.driver_token import run_token
from tests.sim.checks import KNOWN, Checker
from tests.sim.memory import (
    OTHER_FORMAT,
    POSTGRES,
    SINK_FORMAT,
    ConnectionLost,
    MemoryBackend,
    Server,
    SqlError,
)
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
    told: frozenset[int] = frozenset()  # an operator told by a data-loss error: these are lost
    checkpoint: bool = False  # a recover given the query's checkpoint (--checkpoint)


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
    # issue 26: failovers, one driver for two queries, sessions kept across runs
    failover: float = 0.0004  # per step: the server fails over to a lagging standby
    p_shared_driver: float = 0.12  # a query q5 on sink s1, started in q1's driver
    shared_from: tuple[int, int] = (0, 8)  # q5's checkpoint starts at one of these batches
    same_process: float = 0.5  # a run after one that ended (its process alive) starts there
    slow_listing: float = 0.1  # listing commits/ takes longer than lockTimeout (a remote store)
    listing_s: tuple[float, float] = (0.01, 0.5)  # else this long
    slow_listing_s: tuple[float, float] = (10.0, 30.0)  # bounded: DEFAULT_READ_TIMEOUT_S
    p_redeliver: float = 0.5  # the operator re-delivers a lost batch (else accepts the loss)
    # a recover without --checkpoint cannot read the checkpoint the sink's runs recorded
    p_checkpoint_unreadable: float = 0.5
    # the server's flavour (memory.py): postgres, or mariadb (where ``failover`` is the
    # probability of a restart of the server instead)
    flavour: str = POSTGRES


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
    first: int = 0  # the batch its checkpoint starts at (a copied checkpoint: q5)
    driver_of: Query | None = None  # started in that query's driver (q5: q1's)
    loss: DataLossError | None = None  # reported; the query waits for the operator

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


KEEP_ALL = 4  # postgres/sessions.py: idle sessions kept per process


@dataclass(eq=False)
class Process:
    """A driver's JVM with its Python workers: its token's host, pid and start
    (``spark/driver_token.py``), and the sessions its workers keep between uses
    (``postgres/sessions.py``, newest last)."""

    name: str
    kept: list[MemoryBackend] = field(default_factory=list)
    dead: bool = False


@dataclass(eq=False)
class Run:
    owner: Query | Load
    run_id: str
    label: str
    actor: Actor | None = None
    attempt_ids: Iterator[int] = field(default_factory=lambda: itertools.count(0))
    jobs: list[Job] = field(default_factory=list)
    process: Process | None = None  # None: a batch load (its writer knows its run)

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
        """A stream's driver token (spark/driver_token.py): its process's, and the sink."""
        if isinstance(self.owner, Load) or self.process is None:
            return None
        return f"driver-{self.process.name}:{self.sink}"

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


class DataSource:
    """What ``spark/datasource.py`` hands the core, as the world models it: the token a
    stream's tasks register their run with (the driver's and the query's:
    ``driver_token.run_token``), and what its abort passes. Spark's abort gets the
    messages of the tasks that reported (None for the others); a stream's writer knows no
    run id; with no task reporting its run, it reads its query id from its checkpoint
    (``datasource.checkpoint_query``: the world's are always readable)."""

    @staticmethod
    def task_token(run: Run) -> str | None:
        return run_token(run.driver_token, run.query_id)

    @staticmethod
    def abort_args(run: Run, messages: list[PartitionOutcome | None]) -> dict[str, Any]:
        query_id = next((o.query_id for o in messages if o and o.query_id), None)
        reported = any(o is not None and o.run_id for o in messages)
        if not run.is_load and not reported:
            query_id = run.query_id  # its checkpoint's metadata
        return {
            "run_id": run.run_id if run.is_load else None,
            "query_id": query_id,
            "load": run.is_load,
            "writer_token": run_token(run.driver_token, query_id),
        }


class World:
    """One seeded world: build it, ``run`` it, get None or the first failure."""

    datasource = DataSource  # the mutation tests put an older one here
    keeps_sessions_on_mariadb = False  # a mutation test keeps them (as on PostgreSQL)

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
            flavour=profile.flavour,
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
        self.processes = (f"jvm{n}" for n in itertools.count(1))
        self.runs_by_id: dict[str, Run] = {}
        self.loss_operating: Actor | None = None
        if profile.failover > 0 and not self.server.mariadb:
            self.server.cut_points = []  # cuts a failover may go back to
        self._setup()

    # -- set-up -----------------------------------------------------------------------

    def _id(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}x{self.rng.getrandbits(24):06x}"

    def _query(self, name: str, sink: str, start: int, first: int = 0) -> Query:
        p = self.profile
        query = Query(
            name,
            self._id("q"),
            sink,
            self.rng.randint(*p.source),
            self.rng.randint(*p.runs),
            start,
            first=first,
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
        if rng.random() < p.p_shared_driver:  # started from a copied checkpoint
            q5 = self._query("q5", "s1", rng.randint(0, third), rng.randint(*p.shared_from))
            q5.driver_of = self.queries[0]
        # prepared transactions the sink must never touch (invariant 6)
        foreign = [
            ("app_payment_7", DB),  # another application's
            ("sqlsink_s1_0_0_rforeign_1", "othershop"),  # the same sink id, another database
            ("sqlsink_s1_99999999999999999999_0_rx_1", DB),  # a look-alike beyond bigint
            ("sqlsink_s1_1_2_rbad_01", DB),  # a leading zero: not one of ours
        ]
        for gid, database in foreign:
            if self.server.mariadb:  # XA has no database: the first two are another
                # formatID's (the second with the gtrid and bqual of a sink's branch)
                other = gid == "app_payment_7" or database != DB
                self.server.put_prepared(gid, DB, owner="app", format_id=OTHER_FORMAT)
                if not other:  # the look-alikes: the sink's formatID, no gid
                    self.server.prepared[gid].format_id = SINK_FORMAT
            else:
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
            # MariaDB: a task's session says whose it is later (enter_task_session)
            announced=not (self.server.mariadb and purpose.kind == "task"),
        )
        return MemoryBackend(self.server, session)

    def committer(self, backend: MemoryBackend, sink: str, query: Query | None = None) -> Committer:
        """The sink's committer; for a stream's commit (``query``), with its checkpoint
        check (spark/plan.py's CommitterSession), whose listing takes a while."""
        check = None
        if query is not None:
            p, rng = self.profile, self.rng
            slow = rng.random() < p.slow_listing * self.storm and not self.calm
            backend.listing_s = rng.uniform(*(p.slow_listing_s if slow else p.listing_s))
            policy = CheckpointPolicy(
                f"sim://{query.name}/checkpoint",
                lambda: frozenset(query.commits),
                CheckpointMode.WARN,
                entry=EntryPoint.DATA_SOURCE,
            )
            check = CheckpointCheck(backend, policy)
        return Committer(
            backend,
            sink,
            timeouts=self.timeouts,
            clock=self.sim.clock,
            run_timeout_s=self.profile.run_timeout_s,
            checkpoint_check=check,
        )

    # -- processes and the sessions they keep (postgres/sessions.py) ------------------------

    def session(self, actor: Actor, purpose: Purpose, run: Run) -> MemoryBackend:
        """``sessions.session`` in a process of the run: a kept session when one is still
        good (the newest first), else a new connection."""
        process = run.process
        while process is not None and process.kept and not process.dead:
            backend = process.kept.pop()
            actor.step(f"take a kept session ({purpose.kind})")
            if backend.take_back(actor, purpose):
                self.stats["kept session reused"] = self.stats.get("kept session reused", 0) + 1
                return backend
        return self.connect(actor, purpose)

    def give_back(self, backend: MemoryBackend, run: Run, clean: bool) -> None:
        """After the use: kept when it ended cleanly (``DISCARD ALL``), else closed."""
        process = run.process
        if backend.session.dead:
            return
        if not clean or process is None or process.dead:
            backend.close()
            return
        if self.server.mariadb and not self.keeps_sessions_on_mariadb:
            backend.close()  # the MariaDB backend keeps no session between uses
            return
        if backend.keep():
            process.kept.append(backend)
            while len(process.kept) > KEEP_ALL:  # the oldest goes
                process.kept.pop(0).close()

    def _process_for(self, owner: Query | Load) -> Process | None:
        """Where a new run starts: a batch load has no driver token; q5 starts in q1's
        driver while it lives; a run after one that ended (its process alive) at times in
        the same process; any other in a new one."""
        if isinstance(owner, Load):
            return None
        if owner.driver_of is not None:
            alive = [r for r in owner.driver_of.runs if r.alive and r.process is not None]
            if alive and alive[-1].process is not None and not alive[-1].process.dead:
                return alive[-1].process
        last = owner.runs[-1] if owner.runs else None
        if (
            last is not None
            and last.process is not None
            and not last.process.dead
            and not last.alive
            and self.rng.random() < self.profile.same_process
        ):
            self.stats["restart in the same process"] = (
                self.stats.get("restart in the same process", 0) + 1
            )
            return last.process
        return Process(next(self.processes))

    def _kill_process(self, process: Process) -> None:
        """The JVM died: its sessions with it, and every driver in it."""
        if process.dead:
            return
        process.dead = True
        for backend in process.kept:
            self.server.end_session(backend.session, terminated=False)
        process.kept.clear()
        for owner in self.queries:
            for run in owner.runs:
                if run.process is process and run.actor is not None:
                    self.crash(run.actor)

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
            if run.process is not None:
                self._kill_process(run.process)
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
            or self.unsettled(query)  # its user first follows the data-loss advice
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
            writer_token=self.datasource.task_token(run),
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
            backend = self.session(actor, purpose, run)
            clean = False
            try:
                participant = Participant(backend, task, self.timeouts, self.profile.run_timeout_s)
                start = participant.before_write()
                self.checker.on_task_start(backend.session, start)
                if self.server.mariadb and not (start.skip or start.adopt):
                    backend.enter_task_session()
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
                        backend = self.after_prepare(actor, backend, participant, gid)
                    except EXPECTED:
                        backend.rollback()
                        raise
                    result = outcome(str(gid), len(records), False, started)
                clean = True
            finally:
                self.give_back(backend, run, clean)
            actor.step("report to the driver")
            return result

        return program

    def after_prepare(
        self, actor: Actor, backend: MemoryBackend, participant: Participant, gid: Gid
    ) -> MemoryBackend:
        """The participant's check after PREPARE; the session the task gives back. On
        MariaDB (``mariadb/partition.py``): the task disconnects first (another session
        can finish its branch only then) and checks on a new session, which it closes."""
        if not self.server.mariadb:
            participant.after_prepare(gid)
            return backend
        purpose = backend.session.purpose
        actor.step("disconnect after XA PREPARE")  # a pause or a crash may strike here
        backend.close()
        after = self.connect(actor, purpose)
        try:
            Participant(
                after, participant.task, self.timeouts, self.profile.run_timeout_s
            ).after_prepare(gid)
        except BaseException:
            after.close()
            raise
        return after

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
            backend = self.session(actor, purpose, run)
        except EXPECTED as exc:
            self.expected(exc)
            return False
        clean = False
        query = run.owner if isinstance(run.owner, Query) else None
        try:
            self.committer(backend, run.sink, query).commit_batch(
                batch,
                messages,
                query_id=next((o.query_id for o in messages if o and o.query_id), None),
                run_id=next((o.run_id for o in messages if o and o.run_id), None),
                load=run.is_load,
            )
            self.checker.after_commit(backend.session, batch)
            clean = True
            return True
        except DataLossError as exc:
            self.loss_reported(run, exc)
            return False
        except EXPECTED as exc:
            self.expected(exc)
            if isinstance(exc, SqlsinkError) and "bound to" in exc.message:
                run.owner.refused = True
            return False
        finally:
            self.give_back(backend, run, clean)

    def spark_abort(
        self, actor: Actor, run: Run, batch: int, messages: list[PartitionOutcome | None]
    ) -> None:
        purpose = Purpose("abort", run.sink, run.owner.writer, run.run_id, batch, messages=messages)
        try:
            backend = self.session(actor, purpose, run)
        except EXPECTED as exc:
            self.expected(exc)
            return
        clean = False
        if all(m is None for m in messages):
            self.stats["abort without messages"] = self.stats.get("abort without messages", 0) + 1
        try:
            self.committer(backend, run.sink).abort_batch(
                batch, messages, **self.datasource.abort_args(run, messages)
            )
            clean = True
        except EXPECTED as exc:
            self.expected(exc)
        finally:
            self.give_back(backend, run, clean)

    def _job_messages(self, run: Run) -> list[PartitionOutcome | None]:
        job = run.jobs[-1]
        return list(job.outcomes)

    def stream_driver(self, run: Run) -> Callable[[Actor], str]:
        query = run.owner
        assert isinstance(query, Query)

        def program(actor: Actor) -> str:
            actor.step("start: read the checkpoint")
            last = max(query.offsets, default=query.first - 1)
            rerun = last >= query.first and last not in query.commits  # it re-runs its last
            batch = last if rerun else last + 1
            while True:
                actor.step(f"plan batch {batch}")
                if not rerun:  # offsetLog.add: refused when another run wrote it
                    if batch in query.offsets:
                        return f"concurrent update of offsets/{batch}"
                    before = query.offsets.get(batch - 1)
                    start = 0 if before is None else before[1]
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

    def start_run(self, owner: Query | Load, process: Process | None = None) -> None:
        owner.runs_left -= 1
        run = Run(owner, self._id("r"), "")
        run.process = process or self._process_for(owner)
        self.runs_by_id[run.run_id] = run
        run.label = f"{owner.name}/{run.run_id[:4]}"
        program = self.load_driver(run) if isinstance(owner, Load) else self.stream_driver(run)
        run.actor = self.spawn(f"{run.label} driver", "driver", program)
        run.actor.data["run"] = run
        owner.runs.append(run)

    # -- recover and the operator ----------------------------------------------------------

    def recover_program(
        self, sink: str | None, superuser: bool, checkpoint: Query | None = None
    ) -> Callable[[Actor], None]:
        """``sqlsink recover`` of one sink or every sink with leftovers; ``checkpoint``:
        with ``--checkpoint`` of that query (of ``sink``)."""

        def program(actor: Actor) -> None:
            backend = self.connect(actor, Purpose("recover", sink or "*"), superuser=superuser)
            try:
                for each in [sink] if sink else self._sinks_with_leftovers(backend):
                    given = checkpoint is not None and each == sink
                    backend.session.purpose = Purpose("recover", each, checkpoint=given)
                    self._recover_sink(backend, each, checkpoint)
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

    def _recover_sink(
        self, backend: MemoryBackend, sink: str, checkpoint: Query | None = None
    ) -> bool:
        """cli/recover.py for one sink, through the core's recovery as it does: the lock
        (``Recovery.lock``: free at once, or within --lock-timeout; a holder that a fenced
        run recorded is ended, and the lock waited for once more; else refused) and the
        plan, then the actions (``Recovery.finish``): live runs' gids left (the registry's
        liveness), and those of batches Spark went past whose decision was lost
        (``cli.recover.Recovery._scope``: the checkpoint's commits/ with --checkpoint, else
        the log's record). False when refused."""
        recovery = self.committer(backend, sink).recovery
        read: dict[str, bool] = {}  # the recorded checkpoint is read once a recover (its cache)
        locked = recovery.lock(self.profile.lock_timeout_s).held
        try:
            recovery.plan(self._recover_scope(backend, sink, checkpoint, read))
            if not locked:
                self.stats["recover refused: the lock is held"] = (
                    self.stats.get("recover refused: the lock is held", 0) + 1
                )
                return False
            scope = self._recover_scope(backend, sink, checkpoint, read)
            locked = False  # finish lets it go
            done = recovery.finish(scope)
            for error in (done.loss, done.failure):
                if error is not None:
                    self.expected(error)
        except (SqlsinkError, SqlError) as exc:
            self.expected(exc)
        finally:
            if locked:
                recovery.release()
        return True

    def _evidence(
        self,
        backend: MemoryBackend,
        sink: str,
        checkpoint: Query | None = None,
        read: dict[str, bool] | None = None,
    ) -> Evidence:
        """``Recovery._evidence``: what shows that Spark went past a batch of the sink: the
        checkpoint given, else the one the sink's runs recorded when it is readable from
        where recover runs (``p_checkpoint_unreadable``, drawn once a recover: ``read``),
        else the commit log's record."""
        recorded, aborted = backend.loss_evidence(sink)
        from_record = False
        if checkpoint is None:
            location = backend.recorded_location(sink)
            bound = backend.binding(sink)
            checkpoint = next(
                (
                    q
                    for q in self.queries
                    if f"sim://{q.name}/checkpoint" == location
                    and bound is not None
                    and bound.query_id == q.query_id
                ),
                None,
            )
            if checkpoint is not None:
                readable = None if read is None else read.get("readable")
                if readable is None:
                    readable = self.rng.random() >= self.profile.p_checkpoint_unreadable
                    if read is not None:
                        read["readable"] = readable
                if not readable:
                    checkpoint = None  # a remote location this recover cannot read
            from_record = checkpoint is not None
        given = None
        if checkpoint is not None:
            given = Checkpoint(f"sim://{checkpoint.name}/checkpoint", checkpoint.query_id)
            given.commits = set(checkpoint.commits)
        runs = [r for (s, _), r in self.server.log(backend.database).runs.items() if s == sink]
        checkers: dict[int, frozenset[str]] = {}
        for r in runs:
            if r.checkpoint_verdict == "loss":
                for b in r.checkpoint_lost:
                    checkers[b] = checkers.get(b, frozenset()) | {r.run_id}
        return Evidence(
            given,
            recorded,
            aborted,
            from_record,
            {r.run_id: r.first_seen for r in runs},
            checkers,
            {r.run_id: r.aborted_batch for r in runs if r.aborted_batch is not None},
        )

    def _recover_scope(
        self,
        backend: MemoryBackend,
        sink: str,
        checkpoint: Query | None = None,
        read: dict[str, bool] | None = None,
    ) -> Scope:
        """``Recovery._scope``: everything but live runs' gids, lost decisions' gids, and,
        when no checkpoint was read for a streaming sink, the gids of undecided batches
        above the highest decided one that Spark may have committed."""
        proof = self._evidence(backend, sink, checkpoint, read)
        lost = frozenset(b.batch_id for b in lost_batches(backend, sink, proof))  # type: ignore[arg-type]
        live = frozenset(run for _, run in backend.live_runs(sink))
        highest = backend.highest_decided(sink)
        unsure: frozenset[int] = frozenset()
        bound = backend.binding(sink)
        if proof.checkpoint is None and bound is not None and bound.query_id is not None:
            runs = self.server.log(backend.database).runs
            unsure = unsure_batches(
                undecided_prepared(backend, sink, highest),  # type: ignore[arg-type]
                lost,
                live,
                {r.run_id: r.aborted_batch for (s, _), r in runs.items() if s == sink},
                frozenset(),
            )
            if unsure:
                self.stats["recover kept undecided batches (no checkpoint read)"] = (
                    self.stats.get("recover kept undecided batches (no checkpoint read)", 0) + 1
                )
        return Scope.everything(live, lost, unsure, highest)

    def _commit_lost(
        self, actor: Actor, query: Query, held: dict[int, list[str]], told: frozenset[int]
    ) -> bool:
        """``sqlsink recover --sink-id S --commit-lost K``, as the data-loss error says
        (``Recovery.decide``: ``recover_lost.Decider`` under the sink lock, then the
        recovery commits them). When the batch has more than one attempt of a partition,
        or attempts of more than one run, the command refuses and says to keep one per
        partition of one run and roll back the others by hand: the operator does (the rows
        of every attempt of a partition are the same). False: refused, comes back."""
        sink = query.sink
        purpose = Purpose("operator", sink, query.writer, told=told)
        backend = self.connect(actor, purpose, superuser=True)
        try:
            bound = backend.binding(sink)
            me = RoleInfo("sink", True, DB, "16", 160000)
            decider = Decider(
                backend,  # type: ignore[arg-type]
                sink,
                None if bound is None else bound.query_id,
                me,
                self._evidence(backend, sink),
            )
            if not backend.acquire_sink_lock(sink, self.profile.lock_timeout_s).held:
                return False
            try:
                try:
                    plans = decider._check(requests(held, []))
                except CliError as exc:
                    self.stats["--commit-lost refused"] = (
                        self.stats.get("--commit-lost refused", 0) + 1
                    )
                    if "one attempt per partition" in str(exc):
                        self._keep_one_attempt(backend, sink, held)
                    return False
                for request, gids in plans:
                    decider._write(request, gids)
            finally:
                backend.unlock_sink(sink)
            self.stats["lost batches committed (--commit-lost)"] = (
                self.stats.get("lost batches committed (--commit-lost)", 0) + 1
            )
            return self._recover_sink(backend, sink)
        finally:
            if not backend.session.dead:
                backend.close()

    def _keep_one_attempt(
        self, backend: MemoryBackend, sink: str, held: dict[int, list[str]]
    ) -> None:
        """By hand, as the refusal says: per batch, the run with the most partitions, one
        attempt per partition (the lowest); ROLLBACK PREPARED the others."""
        for batch in held:
            gids = [
                g
                for t in backend.prepared(sink)
                if (g := Gid.parse(t.gid)) is not None and g.batch_id == batch
            ]
            runs: dict[str, set[tuple[int, int]]] = {}
            for g in gids:
                runs.setdefault(g.run_id, set()).add((g.part, g.partition_id))
            run = max(sorted(runs), key=lambda r: len(runs[r]))
            keep = {
                min(
                    (g for g in gids if g.run_id == run and (g.part, g.partition_id) == p),
                    key=lambda g: g.attempt_id,
                )
                for p in runs[run]
            }
            for g in gids:
                if g not in keep:
                    backend.rollback_prepared(str(g))

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
                    self._recover_sink(backend, sink)
                    with backend.sink_lock(sink):
                        backend.forget_sink(sink)
                self.stats["forgotten"] = self.stats.get("forgotten", 0) + 1
            finally:
                if not backend.session.dead:
                    backend.close()

        return program

    # -- a failover, the loss it causes, and the operator who settles it ----------------------

    def _maybe_fail_over(self) -> None:
        """The server fails over to a standby whose WAL ends at a recent cut (just before
        some decision). Not modelled, and skipped: a cut that takes a batch load's
        decision (an asynchronous standby loses a committed load as it loses any
        committed write; no checkpoint knows), that leaves a sink with decisions none
        (DESIGN invariant 9, "not detected": it looks like a new sink), or that takes a
        decision of a query that is retired or refused (nobody would commit again to
        report it), that comes before the last one's loss is settled (advice given before
        it would be stale), or while a query's checkpoint, restored from an older copy, is
        behind its sink's log (the failover could make its next batch, planned anew, the
        highest decided: a replay to the sink, with other offsets, which DESIGN invariant 9
        cannot tell from Spark's own replay)."""
        cuts = self.server.cut_points
        if not cuts or any(q.loss is not None or self.unsettled(q) for q in self.queries):
            return  # one failover's loss is settled before the next (stale advice: not modelled)
        cut = cuts[-1] if self.rng.random() < 0.7 else self.rng.choice(cuts)
        now, then = self.server.log(DB), cut.logs.get(DB)
        lost = [key for key in now.decisions if then is None or key not in then.decisions]
        for query in self.queries:  # a checkpoint behind its sink's log: restored
            highest = max((b for s, b in now.decisions if s == query.sink), default=None)
            bound = self.checker.owner.get((query.sink, self.checker.epoch[query.sink]))
            behind = max(query.commits, default=query.first - 1) + 1 < (highest or 0)
            if bound == query.writer and not query.retired and behind:
                return
        affected: list[Query] = []  # whose decisions it takes
        for sink, batch in lost:
            shadow = self.checker._shadow(sink, batch)
            owner = self.query_of(shadow.writer if shadow else None)
            if owner is None or owner.retired or owner.refused:
                return
            if then is None or not then.of_sink(sink):
                return
            affected.append(owner)  # commits/K written, or being written
        before = {db: dict(log.decisions) for db, log in self.server.logs.items()}
        self.server.fail_over(cut)
        self.checker.on_failover(before)
        for query in {id(q): q for q in affected}.values():  # a stream goes on: it reports
            query.total += self.rng.randint(1, 3)
            query.finished = False
            query.runs_left = max(query.runs_left, 2)
        self.stats["failover"] = self.stats.get("failover", 0) + 1
        if any(b in q.commits for q in affected for _, b in lost):
            self.stats["failover lost a batch Spark committed"] = (
                self.stats.get("failover lost a batch Spark committed", 0) + 1
            )
        self.sim.record(
            f"world: failover to a standby cut at t={cut.at:.2f} (step {cut.step}); lost "
            f"decisions {sorted(lost)}"
        )

    def _restart_server(self) -> None:
        """MariaDB: mariadbd killed and started again; every session ends, the prepared
        branches and the commit log stay (``memory.Server.restart``)."""
        self.server.restart()
        self.stats["server restart"] = self.stats.get("server restart", 0) + 1
        self.sim.record("world: the server restarts; every session ends")

    def query_of(self, writer: Writer | None) -> Query | None:
        if writer is None or writer.kind != "stream":
            return None
        return next((q for q in self.queries if q.query_id == writer.query_id), None)

    def unsettled(self, query: Query) -> list[int]:
        """Batches of the query that Spark committed, whose decision a failover took, and
        that nobody has settled yet (decided again, re-delivered, accepted as lost)."""
        return self.checker.unsettled(query)

    def loss_reported(self, run: Run, exc: DataLossError) -> None:
        """A commit reported lost batches: expected for exactly those a failover took
        (else the checker fails the world); the query waits for its operator."""
        if not self.checker.on_loss_reported(run, exc):
            return  # a known false alarm, counted: a failed commit, the run ends
        self.stats["DataLossError after a failover"] = (
            self.stats.get("DataLossError after a failover", 0) + 1
        )
        if isinstance(run.owner, Query):
            run.owner.loss = exc

    def loss_operator_program(self, query: Query) -> Callable[[Actor], None]:
        """The operator reads the data-loss error and does what it says: for a batch whose
        transactions are still prepared, ``sqlsink recover --commit-lost K``; for one with
        nothing prepared, re-deliver it (rewind the checkpoint: delete commits/K onward
        and offsets/K+1 onward), or accept the loss (stop the query, ``sqlsink recover``,
        ``sqlsink forget``)."""

        def program(actor: Actor) -> None:
            error = query.loss
            assert error is not None
            lost = sorted(int(b) for b in error.context.get("lost", []))
            named = error.context.get("prepared") or {}
            told = frozenset(lost)
            actor.step("read the data-loss error")
            open_ = set(self.unsettled(query))  # what the last visit settled, it knows
            held = {int(b): list(g) for b, g in named.items() if int(b) in open_}
            # the error's other way out for a batch still prepared: when the source still
            # holds it, re-run it (the checkpoint rewound; its first task rolls the old
            # transactions back)
            rerun = (
                bool(held)
                and "re-running the batch from Spark's checkpoint" in error.message
                and self.rng.random() < self.profile.p_redeliver / 2
            )
            if held and not rerun and not self._commit_lost(actor, query, held, told):
                return  # it comes back
            bare = [b for b in lost if (rerun or b not in named) and b in open_]
            if not bare:
                pass
            elif rerun or (
                "delete commits/" in error.message and self.rng.random() < self.profile.p_redeliver
            ):
                first = bare[0]
                query.commits = {b for b in query.commits if b < first}
                query.offsets = {b: o for b, o in query.offsets.items() if b <= first}
                query.snapshot()
                self.stats["lost batches re-delivered"] = (
                    self.stats.get("lost batches re-delivered", 0) + 1
                )
            else:
                backend = self.connect(actor, Purpose("operator", query.sink, told=told))
                try:
                    if not self._recover_sink(backend, query.sink):
                        return  # it comes back
                    with backend.sink_lock(query.sink):
                        backend.forget_sink(query.sink)
                    self.checker.accept_lost(query, bare)
                    self.stats["lost batches accepted"] = (
                        self.stats.get("lost batches accepted", 0) + 1
                    )
                finally:
                    if not backend.session.dead:
                        backend.close()
            query.loss = None
            query.finished = False
            query.runs_left = max(query.runs_left, 2)
            if self.server.cut_points is not None:  # a failover back across the operator's
                self.server.cut_points.clear()  # settlement: stale advice, not modelled

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
                or (isinstance(owner, Query) and owner.loss is not None)  # for the operator
                or self._waits_for_its_driver(owner)
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
                self.start_run(owner, Process(next(self.processes)))  # the paused: a zombie
                self.stats["zombie"] = self.stats.get("zombie", 0) + 1
        if self.loss_operating is None or self.loss_operating.done:
            for query in self.queries:
                if query.loss is not None and not any(r.alive for r in query.runs):
                    self.loss_operating = self.spawn(
                        f"operator ({query.name} data loss)",
                        "operator",
                        self.loss_operator_program(query),
                    )
                    break
        if self.calm:
            return
        if rng.random() < p.failover:
            if self.server.mariadb:
                self._restart_server()
            else:
                self._maybe_fail_over()
        if (self.recovering is None or self.recovering.done) and rng.random() < p.recover:
            sink = rng.choice(["s1", "s1", None])
            superuser = rng.random() < 0.5
            bound = self.query_of(self.checker.owner.get(("s1", self.checker.epoch["s1"])))
            given = bound if sink and rng.random() < 0.5 else None  # --checkpoint of its query
            self.recovering = self.spawn(
                f"recover {sink or 'all'}{' --checkpoint' if given else ''}",
                "recover",
                self.recover_program(sink, superuser, given),
            )
        if (self.operating is None or self.operating.done) and rng.random() < p.operator:
            self._maybe_operate()
        if rng.random() < p.rollback:
            self._maybe_roll_back()

    def _waits_for_its_driver(self, owner: Query | Load) -> bool:
        """q5 is started in q1's driver: its first run waits for one of q1 (or its end)."""
        if not isinstance(owner, Query) or owner.driver_of is None or owner.runs:
            return False
        host = owner.driver_of
        if any(r.alive for r in host.runs):
            return False
        return not (host.finished or host.retired or host.refused or host.runs_left <= 0)

    def _maybe_operate(self) -> None:
        refused = [w for w in self._writers() if w.refused and w.sink == "s1"]
        if not refused or self.rng.random() >= self.profile.p_operator:
            return
        epoch = self.checker.epoch["s1"]
        owner = self.checker.owner.get(("s1", epoch))
        owners = [w for w in self._writers() if w.sink == "s1" and owner == w.writer]
        if any(r.alive for q in owners for r in q.runs) or any(
            r.alive for w in refused for r in w.runs
        ):
            return
        if any(isinstance(q, Query) and (q.loss is not None or self.unsettled(q)) for q in owners):
            return  # the data-loss advice first
        self.operator_visits += 1
        for writer in refused:
            writer.refused = False
            writer.runs_left += 1
        for each in owners:  # stopped for good before its log is removed (a load too)
            each.retired = True
        self.operating = self.spawn("operator", "operator", self.operator_program("s1"))

    def _maybe_roll_back(self) -> None:
        """A checkpoint restored from an older copy: Spark re-plans decided batches."""
        for query in self.queries:
            if (
                not query.may_roll_back
                or any(r.alive for r in query.runs)
                or query.retired
                or query.loss is not None
            ):
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
        for query in self.queries:  # a loss to report, or its operator to come
            if query.loss is not None:
                return True
            if not query.retired and self.unsettled(query):
                query.runs_left = max(query.runs_left, 1)  # its user starts it again
                query.finished = False
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
        if self.server.branch_waits:
            self.stats["branch still attached, waited"] = self.server.branch_waits
        return self.sim.failure

    def _final(self) -> None:
        sim = self.sim
        # every run is stale now: older than its timeout, runTimeout or three times its
        # batch interval (which is below the time so far)
        sim.now += self.profile.run_timeout_s * 3 + 1 + 3 * sim.now
        sim.record("world: the end; a final sqlsink recover of every sink")
        self.ending = True
        sinks = sorted({w.sink for w in self._writers()} | {"other-app"})
        for sink in sinks:
            # with --checkpoint of the query that owns the sink: without it, a batch a
            # commit once found lost keeps its re-run's leftovers (what the log recorded
            # stays after the operator re-delivered it), and recover tells to commit them
            owner = self.query_of(self.checker.owner.get((sink, self.checker.epoch[sink])))
            row = self.server.log(DB).sinks.get(sink)
            if owner is None and row is not None:  # the query the sink is bound to now
                owner = next(
                    (q for q in self.queries if q.sink == sink and q.query_id == row.query_id),
                    None,
                )
            self.spawn(f"final recover {sink}", "final", self.recover_program(sink, True, owner))
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
        + (" -k mariadb" if world.server.mariadb else "")
        + ("" if world.checker.tolerate else " --sim-strict")
    )
