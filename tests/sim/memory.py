"""An in-memory PostgreSQL, as far as the sink's protocol sees one.

``Server`` is the cluster: prepared transactions (gid, owner role, database, the rows
and marker they hold), row locks, session advisory locks, sessions, and per database
the commit log of schema version 3 (``sinks``, ``decisions``, ``markers``, ``runs``
with ``register_run`` and the triggers that keep incomplete decisions). Its
semantics copy ``sqlsink/postgres/backend.py``, ``postgres/commit_log.py``,
``postgres/run_registry.py``, ``postgres/retention.py``, ``postgres/locks.py`` and
``sql/003_writers_and_runs.sql``; the contract tests (``test_backend_contract.py``)
run the same scenarios against both.

Beyond one PostgreSQL's life, the server can fail over (``Server.fail_over``): a
promoted asynchronous standby has the WAL up to a cut, taken just before a decision
(``Server.cut_points``), and every session ends. And a session can be kept between
uses, as ``postgres/sessions.py`` keeps one (``MemoryBackend.keep`` and ``take_back``:
``DISCARD ALL``, then the next use names it; the server ends one idle for 60 s).

``MemoryBackend`` is one session on it. It implements
``sqlsink.core.backend.TwoPhaseBackend``, ``sqlsink.core.participant.ParticipantBackend``
and ``sqlsink.core.checkpoint_check.CheckpointLedger`` (``postgres/checkpoint_records.py``),
plus what ``postgres/partition.py`` does on its connection (BEGIN, rows, marker,
PREPARE, ROLLBACK) and what the CLI and an operator do (``try_sink_lock``,
``forget_sink``, a plain ``DELETE``). Every call is one step of the simulation: it
first yields to the scheduler (``sched.Actor.step``), then runs atomically.

Time is the simulation's clock. Without an actor (the contract tests) nothing
yields, and a wait that cannot be granted moves the clock to its deadline.

The server has a *flavour*: ``postgres`` (the default, as above) or ``mariadb``, which
models what MariaDB's XA does differently where the protocol looks (the facts pinned in
``tests/mariadb/test_xa_facts.py``; ``sqlsink/mariadb/backend.py`` and ``partition.py``
for the sink's side), each checked against the real server by the contract tests:

- a prepared branch stays attached to the session that prepared it: another session's
  XA COMMIT/ROLLBACK gets XAER_NOTA until that session has ended (and the server has
  noticed: ``DETACH_S`` after it), so ``commit_prepared``/``rollback_prepared`` wait for
  it, at most the session's lock bound, then raise the backend's TransientError; the
  preparing session itself may finish it;
- that session cannot start another branch (XAER_RMFAIL): of no use after PREPARE but
  to end (the partition disconnects);
- XA is server-wide and carries no database, owner or time: ``prepared`` lists every
  branch of the sink's formatID whose xid decodes to a gid, in the session's database,
  owned by its role, prepared "now"; any user may finish any branch (``finisher_role``
  None); a branch of another formatID is never listed, and finishing its gtrid+bqual is
  refused (MariaDB would finish it by those alone);
- a branch that wrote nothing stays prepared, as on PostgreSQL (the contract test
  pins it: MariaDB 10.11 does not end it at PREPARE);
- a task's session is found by ``await_batch_tasks`` only once it said whose it is
  (``enter_task_session``, after the participant's checks), not from its connect;
- the sink lock's holder is recorded by connection id alone (no backend start);
- the server does not fail over to a lagging standby here; it restarts
  (``Server.restart``: mariadbd killed and started again): every session ends, and the
  prepared branches, the tables and the commit log are all kept (InnoDB and the binary
  log, ``test_a_prepared_branch_survives_the_servers_sigkill``).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from sqlsink.core.checkpoint_check import LogCoverage, RunCheck, Verdict
from sqlsink.core.gid import Gid
from sqlsink.core.model import (
    COMMIT_PREPARED,
    ROLLBACK_PREPARED,
    BatchFigures,
    Binding,
    Decision,
    Fate,
    Handover,
    LockTake,
    NewDecision,
    PreparedTransaction,
    TaskState,
)
from sqlsink.errors import ConfigError, TransientError
from tests.sim.sched import Actor, Crash

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)  # simulated time 0
POSTGRES, MARIADB = "postgres", "mariadb"  # the server's flavours
SINK_FORMAT = 0x53514C01  # sqlsink/mariadb/xid.FORMAT_ID: the sink's branches (mariadb)
OTHER_FORMAT = 1  # another application's XA branches
DETACH_S = 0.2  # mariadb: how long after a session ends its branch is still attached
XAER_RMFAIL = "1399"


def stamp(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


class SqlError(Exception):
    """A statement the server refused (psycopg.Error in real life)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate = sqlstate


class ConnectionLost(Exception):
    """The server ended this session (psycopg.OperationalError in real life)."""


def lock_key(sink_id: str | None) -> str:
    return f"sqlsink:sink:{sink_id or '*'}"


# -- the server's state ----------------------------------------------------------------


@dataclass(eq=False)
class Txn:
    """An open transaction of a session, or a prepared one (``gid`` set, no session)."""

    xid: int
    database: str
    owner: str
    session: Session | None
    rows: list[tuple[str, Hashable]] = field(default_factory=list)  # (table, key)
    marker: MarkerRow | None = None
    gid: str | None = None
    prepared_at: float | None = None
    prepared_step: int | None = None
    preparer: object | None = None  # the actor that prepared it
    format_id: int = SINK_FORMAT  # mariadb: the XA formatID it was prepared with
    attached: Session | None = None  # mariadb: the session that prepared it, while it lives
    attached_until: float | None = None  # mariadb: None, or attached until then (inf: live)


@dataclass
class SinkRow:
    writer: str | None
    query_id: str | None
    created_at: float
    bound_at: float
    newest_run: str | None = None
    pruned_through: int | None = None


@dataclass
class DecisionRow:
    sink_id: str
    batch_id: int
    gids: tuple[str, ...]
    rows: int
    query_id: str | None
    run_id: str | None
    decided_at: float
    completed_at: float | None
    partitions: int | None = None
    first_write_at: float | None = None
    commit_ms: float | None = None
    orphans: int | None = None
    tables: tuple[str, ...] | None = None  # NULL: none given (schema version 8)
    figures: dict[str, Any] | None = None  # the jsonb column's value (schema version 9)


@dataclass
class MarkerRow:
    gid: str
    sink_id: str
    batch_id: int
    partition_id: int
    rows: int
    written_at: float


@dataclass
class RunRow:
    sink_id: str
    run_id: str
    first_seen: float
    heartbeat_at: float
    live_for: float
    superseded_at: float | None = None
    superseded_by: str | None = None
    aborted_batch: int | None = None
    lock_pid: int | None = None
    lock_backend_start: float | None = None
    writer_token: str | None = None
    checkpoint_checked_at: float | None = None  # schema 4: the run's checkpoint check
    checkpoint_verdict: str | None = None
    checkpoint_lost: tuple[int, ...] = ()
    checkpoint_batch: int | None = None
    checkpoint_location: str | None = None


@dataclass
class CommitLog:
    """Schema ``sqlsink`` of one database."""

    sinks: dict[str, SinkRow] = field(default_factory=dict)
    decisions: dict[tuple[str, int], DecisionRow] = field(default_factory=dict)
    markers: dict[str, MarkerRow] = field(default_factory=dict)
    runs: dict[tuple[str, str], RunRow] = field(default_factory=dict)
    # (sink, run) -> (its latest handed batch, when): the writer's hand-overs (schema 11)
    handovers: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)

    def of_sink(self, sink_id: str) -> list[DecisionRow]:
        return [d for (s, _), d in self.decisions.items() if s == sink_id]

    def copy(self) -> CommitLog:
        """A copy whose rows change apart from this one's (markers never change)."""
        return CommitLog(
            {k: copy.copy(v) for k, v in self.sinks.items()},
            {k: copy.copy(v) for k, v in self.decisions.items()},
            dict(self.markers),
            {k: copy.copy(v) for k, v in self.runs.items()},
            dict(self.handovers),
        )


@dataclass(eq=False)
class Session:
    pid: int
    backend_start: float
    database: str
    role: str
    superuser: bool
    actor: Actor | None
    purpose: Any  # what the session works for (world.Purpose); read by the checks
    lock_timeout_s: float
    dead: bool = False
    terminated: bool = False  # ended by the server (pg_terminate_backend, a cut)
    noticed: bool = False  # the client saw the connection go (psycopg closes it)
    txn: Txn | None = None
    advisory: dict[str, int] = field(default_factory=dict)  # key -> times taken
    locked_at: dict[str, float] = field(default_factory=dict)  # key -> first taken at
    state_step: int | None = None  # step of the first task_state read
    first_state: TaskState | None = None  # what the task's checks ran on
    live_read: frozenset[str] = frozenset()  # runs live per the last live_runs read
    idle_since: float | None = None  # kept between uses (postgres/sessions.py) since then
    uses: int = 1  # how many uses it served (kept sessions serve several)
    branch: Txn | None = None  # mariadb: its prepared branch, attached to it
    announced: bool = True  # a task's session await_batch_tasks finds (mariadb: once said)

    def new_use(self, actor: Actor | None, purpose: Any) -> None:
        """A kept session taken back: another use, with what it knows per use reset."""
        self.actor, self.purpose, self.idle_since = actor, purpose, None
        self.state_step = self.first_state = None
        self.live_read = frozenset()
        self.uses += 1


IDLE_SESSION_TIMEOUT_S = 60.0  # sessions.IDLE_TIMEOUT_S: the server ends an idle kept one
CUT_POINTS = 4  # the newest cut points a failover may go back to


@dataclass
class Durable:
    """What survives a failover: the WAL up to a cut (prepared transactions, the tables,
    every database's commit log), and when the cut was taken."""

    at: float
    step: int
    logs: dict[str, CommitLog]
    prepared: dict[str, Txn]
    tables: dict[tuple[str, str], dict[Hashable, str]]
    committed: set[str]


class Hooks(Protocol):
    """What the invariant checks want to see happen (``checks.Checker``)."""

    def on_lock(self, session: Session, key: str) -> None: ...
    def on_terminate(self, session: Session, holder: Session, sink_id: str) -> None: ...
    def on_commit_prepared(self, session: Session, txn: Txn) -> None: ...
    def on_rollback_prepared(self, session: Session, txn: Txn) -> None: ...
    def on_insert_decision(self, session: Session, row: DecisionRow) -> None: ...
    def on_register_run(self, session: Session, sink_id: str, run_id: str, new: bool) -> None: ...
    def on_begin_write(self, session: Session) -> None: ...
    def on_row_wait(self, session: Session, holder: Txn) -> None: ...
    def on_mark_complete(self, session: Session, sink_id: str, batch_ids: list[int]) -> None: ...
    def on_log_removed(self, session: Session, sink_id: str, how: str) -> None: ...
    def on_prune(self, session: Session, sink_id: str, batch_ids: list[int]) -> None: ...
    def on_mark_aborted(self, session: Session, sink_id: str, run_id: str, batch: int) -> None: ...


class NoHooks:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class Clock:
    """The contract tests' clock: moved by hand, or by a wait nobody can grant."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Server:
    """One PostgreSQL cluster in memory."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        hooks: Hooks | None = None,
        step_no: Callable[[], int] = lambda: 0,
        cascade: bool = False,
        advance: Callable[[float], None] | None = None,
        flavour: str = POSTGRES,
    ) -> None:
        """``cascade``: the commit log of schema version 1, where deleting a sink cascades
        to its decisions and no trigger keeps incomplete ones (issue 12 item 1 reverted).
        ``flavour``: ``postgres`` or ``mariadb`` (the module's docstring)."""
        assert flavour in (POSTGRES, MARIADB), flavour
        self.flavour = flavour
        self.mariadb = flavour == MARIADB
        self.clock = clock
        self.hooks: Hooks = hooks or NoHooks()
        self.step_no = step_no
        self.cascade = cascade
        self.advance = advance  # moves the clock when a wait cannot be granted (no actors)
        self.logs: dict[str, CommitLog] = {}
        self.prepared: dict[str, Txn] = {}
        self.row_locks: dict[tuple[str, str, Hashable], Txn] = {}
        self.advisory: dict[tuple[str, str], Session] = {}
        self.sessions: dict[int, Session] = {}
        self.tables: dict[tuple[str, str], dict[Hashable, str]] = {}  # committed: key -> gid
        self._pids = itertools.count(100)
        self._xids = itertools.count(1)
        self.committed: set[str] = set()  # gids committed (the WAL's COMMIT PREPAREDs)
        self.cut_points: list[Durable] | None = None  # kept (newest last) when not None
        self.branch_waits = 0  # mariadb: finishes that waited for a branch to detach

    def log(self, database: str) -> CommitLog:
        return self.logs.setdefault(database, CommitLog())

    def connect(
        self,
        database: str,
        *,
        role: str = "sink",
        superuser: bool = False,
        actor: Actor | None = None,
        purpose: Any = None,
        lock_timeout_s: float = 60.0,
        announced: bool = True,
    ) -> Session:
        session = Session(
            next(self._pids),
            self.clock(),
            database,
            role,
            superuser,
            actor,
            purpose,
            lock_timeout_s,
            announced=announced,
        )
        self.sessions[session.pid] = session
        return session

    def end_session(self, session: Session, *, terminated: bool) -> None:
        """The session ends: its open transaction rolls back, its locks go."""
        if session.dead:
            return
        session.dead = True
        session.terminated = terminated
        if session.txn is not None:
            self._release(session.txn)
            session.txn = None
        if session.branch is not None:  # mariadb: detached once the server notices
            session.branch.attached = None
            session.branch.attached_until = self.clock() + DETACH_S
            session.branch = None
        for key in session.advisory:
            self.advisory.pop((session.database, key), None)
        session.advisory.clear()
        self.sessions.pop(session.pid, None)

    def restart(self) -> None:
        """mariadb: mariadbd killed and started again. Every session ends (the clients see
        their connection go); the prepared branches, the tables and every commit log are
        kept (InnoDB and the binary log: tests/mariadb/test_xa_facts.py)."""
        for session in list(self.sessions.values()):
            self.end_session(session, terminated=True)
        self.advisory.clear()
        for txn in self.prepared.values():
            txn.attached, txn.attached_until = None, None  # no session after a restart

    def attached(self, txn: Txn) -> bool:
        """mariadb: whether the branch is still attached to the session that prepared it."""
        return txn.attached_until is not None and self.clock() < txn.attached_until

    def sinks_branches(self, prefix: str, database: str) -> list[tuple[str, Txn]]:
        """The prepared transactions a sink's session lists as the sink's (``prefix``):
        postgres, by gid prefix in its database; mariadb (XA RECOVER, server-wide), the
        branches of the sink's formatID whose xid decodes to a gid of that prefix."""
        if not self.mariadb:
            return [
                (gid, t)
                for gid, t in sorted(self.prepared.items())
                if gid.startswith(prefix) and t.database == database
            ]
        return [
            (gid, t)
            for gid, t in sorted(self.prepared.items())
            if gid.startswith(prefix) and t.format_id == SINK_FORMAT and Gid.parse(gid)
        ]

    def end_sessions_of(self, actor: Actor) -> None:
        for session in list(self.sessions.values()):
            if session.actor is actor:
                self.end_session(session, terminated=False)

    # -- a failover, and kept sessions ----------------------------------------------------

    def cut(self) -> None:
        """A point the WAL of a lagging standby may end at (kept when asked for)."""
        if self.cut_points is None:
            return
        self.cut_points.append(
            Durable(
                self.clock(),
                self.step_no(),
                {db: log.copy() for db, log in self.logs.items()},
                dict(self.prepared),  # a prepared Txn never changes; it only leaves
                {place: dict(rows) for place, rows in self.tables.items()},
                set(self.committed),
            )
        )
        del self.cut_points[:-CUT_POINTS]

    def fail_over(self, to: Durable) -> None:
        """A standby promoted with the WAL up to ``to``: every session ends (the clients
        see their connection go), and what was written after the cut is gone: decisions,
        completions, registrations, COMMIT and ROLLBACK PREPAREDs, PREPAREs."""
        for session in list(self.sessions.values()):
            self.end_session(session, terminated=True)
        self.logs = {db: log.copy() for db, log in to.logs.items()}
        self.prepared = dict(to.prepared)
        self.tables = {place: dict(rows) for place, rows in to.tables.items()}
        self.committed = set(to.committed)
        self.row_locks = {
            (txn.database, table, key): txn
            for txn in self.prepared.values()
            for table, key in txn.rows
        }
        self.advisory.clear()
        if self.cut_points is not None:
            self.cut_points = [c for c in self.cut_points if c.step < to.step]

    def discard(self, session: Session) -> None:
        """``DISCARD ALL``: the session's advisory locks go (settings too); kept idle."""
        for key in session.advisory:
            if self.advisory.get((session.database, key)) is session:
                del self.advisory[(session.database, key)]
        session.advisory.clear()
        session.locked_at.clear()
        session.actor, session.purpose, session.idle_since = None, None, self.clock()

    def _release(self, txn: Txn) -> None:
        for table, key in txn.rows:
            lock = (txn.database, table, key)
            if self.row_locks.get(lock) is txn:
                del self.row_locks[lock]

    def _apply(self, txn: Txn) -> None:
        """Commit: the rows and the marker become visible."""
        if txn.gid is not None:
            self.committed.add(txn.gid)
        for table, key in txn.rows:
            self.tables.setdefault((txn.database, table), {})[key] = txn.gid or f"xid{txn.xid}"
        if txn.marker is not None:
            self.log(txn.database).markers[txn.marker.gid] = txn.marker
        self._release(txn)

    # -- for tests and the world: set-up and inspection, not steps -----------------------

    def put_prepared(
        self,
        gid: str,
        database: str,
        owner: str = "sink",
        rows: Iterable[tuple[str, Hashable]] = (),
        marker: bool = True,
        format_id: int = SINK_FORMAT,
    ) -> Txn:
        """A prepared transaction left by someone (a dead run, another application);
        ``format_id``: its XA formatID (mariadb)."""
        txn = Txn(next(self._xids), database, owner, None, list(rows), format_id=format_id)
        parsed = Gid.parse(gid)
        if marker and parsed is not None:
            txn.marker = MarkerRow(
                gid, parsed.sink_id, parsed.batch_id, parsed.partition_id, 0, self.clock()
            )
        for table, key in txn.rows:
            self.row_locks[(database, table, key)] = txn
        txn.gid, txn.prepared_at, txn.prepared_step = gid, self.clock(), self.step_no()
        self.prepared[gid] = txn
        return txn


# -- a session -------------------------------------------------------------------------


class MemoryBackend:
    """One session: ``TwoPhaseBackend`` and ``ParticipantBackend`` on the in-memory server."""

    def __init__(self, server: Server, session: Session) -> None:
        self.server = server
        self.session = session

    # -- the step ----------------------------------------------------------------------

    def _call(
        self, label: str, wait: Callable[[], bool] | None = None, deadline: float | None = None
    ) -> None:
        """Yield to the scheduler, then check the session is still there."""
        session = self.session
        actor = session.actor
        self._alive()
        if actor is not None:
            actor.step(f"{label}", wait, deadline)
        elif wait is not None and not wait() and deadline is not None and self.server.advance:
            self.server.advance(deadline)
        self._alive()

    def _alive(self) -> None:
        session = self.session
        if session.dead and not session.terminated:
            raise Crash
        if session.dead or session.noticed:
            session.noticed = True
            raise ConnectionLost(f"session {session.pid} was terminated")

    @property
    def _log(self) -> CommitLog:
        return self.server.log(self.session.database)

    def _now(self) -> float:
        return self.server.clock()

    # -- TwoPhaseBackend: properties ----------------------------------------------------

    @property
    def database(self) -> str:
        return self.session.database

    @property
    def commit_statement(self) -> str:
        return "XA COMMIT" if self.server.mariadb else COMMIT_PREPARED

    @property
    def rollback_statement(self) -> str:
        return "XA ROLLBACK" if self.server.mariadb else ROLLBACK_PREPARED

    @property
    def finisher_role(self) -> str | None:
        if self.server.mariadb:
            return None  # any user may finish any branch
        return None if self.session.superuser else self.session.role

    def cut_session(self, url: str) -> None:
        """As pg_terminate_backend from another session: this one ends (``url`` unused)."""
        self.server.end_session(self.session, terminated=True)

    # -- the sink lock (postgres/locks.py) ----------------------------------------------

    @contextmanager
    def sink_lock(self, sink_id: str | None) -> Iterator[None]:
        timeout = self.session.lock_timeout_s
        if not self.acquire_sink_lock(sink_id, timeout).held:
            holder = self.server.advisory.get((self.database, lock_key(sink_id)))
            raise TransientError(
                f"sink {sink_id}: waited {timeout:g} s for the sink lock, held by "
                f"pid {holder.pid if holder else '?'}",
                sink_id=sink_id,
            )
        try:
            yield
        finally:
            self.unlock_sink(sink_id)

    def acquire_sink_lock(
        self,
        sink_id: str | None,
        timeout_s: float | None = None,
        waiting: Callable[[], None] | None = None,
        *,
        end_fenced: bool = True,
    ) -> LockTake:
        """locks.acquire_sink_lock: free at once, else a bounded wait; a holder that a
        fenced run recorded is ended (unless not ``end_fenced``), and the lock waited for
        once more."""
        timeout = self.session.lock_timeout_s if timeout_s is None else timeout_s
        self._call(f"lock {sink_id}")
        if self._take(lock_key(sink_id), sink_id):
            return LockTake(True)
        if waiting is not None:
            waiting()
        held = self._wait(sink_id, timeout)
        ended: tuple[int, ...] = ()
        if not held and end_fenced:
            ended = tuple(self._end_fenced_holders(sink_id))
            held = bool(ended) and self.wait_sink_lock(sink_id, timeout)
        return LockTake(held, waited=True, ended=ended)

    def try_sink_lock(self, sink_id: str | None) -> bool:
        self._call(f"try lock {sink_id}")
        return self._take(lock_key(sink_id), sink_id)

    def wait_sink_lock(self, sink_id: str | None, timeout_s: float) -> bool:
        self._call(f"lock {sink_id}")
        return self._wait(sink_id, timeout_s)

    def _wait(self, sink_id: str | None, timeout_s: float) -> bool:
        """The bounded wait (its first take is the caller's step's)."""
        key = lock_key(sink_id)
        deadline = self._now() + timeout_s
        while not self._take(key, sink_id):
            if self._now() >= deadline:
                return False
            self._call(
                f"wait for lock {sink_id}",
                lambda: self.server.advisory.get((self.database, key)) is None,
                deadline,
            )
        return True

    def _take(self, key: str, sink_id: str | None) -> bool:
        """locks._take: a fresh take (not a stacked one) clears the runs' records of this
        session as the sink lock's holder, in the same round trip (stale: the session let
        the lock go without the unlock, as after PgBouncer's reset)."""
        place = (self.database, key)
        holder = self.server.advisory.get(place)
        if holder is not None and holder is not self.session:
            return False
        self.server.advisory[place] = self.session
        if key not in self.session.advisory:
            self.session.locked_at[key] = self._now()
            self.server.hooks.on_lock(self.session, key)
            if sink_id is not None:
                for (sink, _), run in self._log.runs.items():
                    if sink == sink_id and run.lock_pid == self.session.pid:
                        run.lock_pid = run.lock_backend_start = None
        self.session.advisory[key] = self.session.advisory.get(key, 0) + 1
        return True

    def unlock_sink(self, sink_id: str | None) -> None:
        """locks.unlock_sink: the lock goes once (it stacks); when this session no longer
        holds it, the runs' records of this session (its pid) as the sink lock's holder are
        cleared, in the same round trip (a kept session serves another run next)."""
        if self.session.noticed:
            return  # locks.unlock_sink: a closed connection holds nothing
        self._call(f"unlock {sink_id}")
        key = lock_key(sink_id)
        count = self.session.advisory.get(key, 0)
        if count <= 1:
            self.session.advisory.pop(key, None)
            self.session.locked_at.pop(key, None)
            if self.server.advisory.get((self.database, key)) is self.session:
                del self.server.advisory[(self.database, key)]
            if sink_id is not None:
                for (sink, _), run in self._log.runs.items():
                    if sink == sink_id and run.lock_pid == self.session.pid:
                        run.lock_pid = run.lock_backend_start = None
        else:
            self.session.advisory[key] = count - 1

    def fence_runs(self, sink_id: str, run_ids: Collection[str]) -> list[str]:
        """run_registry.fence_runs: ``recover --force`` declares the runs dead."""
        self._call(f"fence runs {sink_id} {sorted(run_ids)}")
        fenced = []
        for run_id in sorted(set(run_ids)):
            run = self._log.runs.get((sink_id, run_id))
            if run is not None and run.superseded_at is None:
                run.superseded_at, run.superseded_by = self._now(), "operator"
                fenced.append(run_id)
        return fenced

    def end_fenced_holders(self, sink_id: str | None) -> list[int]:
        """locks.end_fenced_holders (also the CLI's, after its wait for the lock)."""
        return self._end_fenced_holders(sink_id)

    def _end_fenced_holders(self, sink_id: str | None) -> list[int]:
        """locks.end_fenced_holders: end the holder of the sink lock (there is at most
        one) when a superseded run of the sink recorded it, by pid and backend start,
        as the session that holds the lock for it, and no run not superseded does."""
        if sink_id is None:
            return []
        self._call(f"end fenced holders {sink_id}")
        holder = self.server.advisory.get((self.database, lock_key(sink_id)))
        if holder is None or holder is self.session:
            return []
        recorded = [
            run
            for (sink, _), run in self._log.runs.items()
            if sink == sink_id
            and run.lock_pid == holder.pid
            and (self.server.mariadb or run.lock_backend_start == holder.backend_start)
        ]
        if any(run.superseded_at is None for run in recorded):
            return []  # a live run's: whatever a superseded one recorded
        for run in recorded:
            if run.superseded_at is not None:
                self.server.hooks.on_terminate(self.session, holder, sink_id)
                self.server.end_session(holder, terminated=True)
                return [holder.pid]
        return []

    # -- prepared transactions ----------------------------------------------------------

    def prepared(self, sink_id: str | None) -> list[PreparedTransaction]:
        self._call(f"prepared {sink_id}")
        prefix = Gid.sink_prefix(sink_id) if sink_id else "sqlsink_"
        if self.server.mariadb:  # XA RECOVER: no database, owner or time
            now = stamp(self._now())
            return [
                PreparedTransaction(gid, self.database, self.session.role, now)
                for gid, _ in self.server.sinks_branches(prefix, self.database)
            ]
        return [
            PreparedTransaction(gid, t.database, t.owner, stamp(t.prepared_at or 0.0))
            for gid, t in sorted(self.server.prepared.items())
            if gid.startswith(prefix)
        ]

    def commit_prepared(self, gid: str) -> bool:
        self._call(f"COMMIT PREPARED {gid}")
        txn = self._finishable(gid)
        if txn is None:
            return False
        self.server.hooks.on_commit_prepared(self.session, txn)
        del self.server.prepared[gid]
        self._detach(txn)
        self.server._apply(txn)
        return True

    def rollback_prepared(self, gid: str) -> bool:
        self._call(f"ROLLBACK PREPARED {gid}")
        txn = self._finishable(gid)
        if txn is None:
            return False
        self.server.hooks.on_rollback_prepared(self.session, txn)
        del self.server.prepared[gid]
        self._detach(txn)
        self.server._release(txn)
        return True

    def _detached(self, txn: Txn) -> Callable[[], bool]:
        return lambda: not self.server.attached(txn)

    @staticmethod
    def _detach(txn: Txn) -> None:
        """mariadb: a branch finished by its own session frees that session for another."""
        if txn.attached is not None and txn.attached.branch is txn:
            txn.attached.branch = None
        txn.attached, txn.attached_until = None, None

    def _finishable(self, gid: str) -> Txn | None:
        if self.server.mariadb:
            return self._finishable_branch(gid)
        txn = self.server.prepared.get(gid)
        if txn is None:
            return None
        if txn.database != self.database:
            raise SqlError("0A000", f"prepared transaction {gid} belongs to another database")
        if not self.session.superuser and txn.owner != self.session.role:
            raise ConfigError(  # PostgresBackend._finish
                f"cannot finish prepared transaction {gid}: permission denied",
                gid=gid,
            )
        return txn

    def _finishable_branch(self, gid: str) -> Txn | None:
        """mariadb's ``MariaDBBackend._finish`` before its XA COMMIT/ROLLBACK: a branch
        XA RECOVER lists with the sink's formatID (another formatID with the same gtrid
        and bqual: refused), waited for while still attached to another session, at most
        the lock bound; no database or owner check (XA is server-wide)."""
        deadline = self._now() + self.session.lock_timeout_s
        while True:
            txn = self.server.prepared.get(gid)
            if txn is None or Gid.parse(gid) is None:
                return None
            if txn.format_id != SINK_FORMAT:
                raise ConfigError(
                    f"a prepared XA branch of formatID {txn.format_id} (not sqlsink's) has "
                    f"the gtrid and bqual of {gid}; MariaDB would finish it by those alone, "
                    "so sqlsink leaves it: whoever prepared it must finish it",
                    gid=gid,
                )
            if not self.server.attached(txn) or txn.attached is self.session:
                return txn
            self.server.branch_waits += 1
            if self._now() >= deadline:
                raise TransientError(
                    f"prepared branch {gid} is still attached to the session that prepared "
                    f"it after {self.session.lock_timeout_s:.0f} s (MariaDB lets another "
                    "session finish a branch only once that session has ended): a partition "
                    "task that did not disconnect after XA PREPARE? End it (SHOW PROCESSLIST, "
                    "KILL CONNECTION id), then run sqlsink recover",
                    gid=gid,
                )
            self._call(f"wait for branch {gid} to detach", self._detached(txn), deadline)

    # -- the commit log -----------------------------------------------------------------

    def _decision(self, row: DecisionRow) -> Decision:
        return Decision(
            row.sink_id,
            row.batch_id,
            frozenset(row.gids),
            row.rows,
            stamp(row.decided_at),
            row.completed_at is not None,
            row.query_id,
            row.run_id,
            self._now() - row.decided_at,
            row.tables,
        )

    def decisions(
        self, sink_id: str | None, batch_ids: Iterable[tuple[str, int]] = ()
    ) -> dict[tuple[str, int], Decision]:
        self._call(f"decisions {sink_id}")
        wanted = set(batch_ids)
        return {
            key: self._decision(row)
            for key, row in self._log.decisions.items()
            if key in wanted
            or (row.completed_at is None and (sink_id is None or row.sink_id == sink_id))
        }

    @staticmethod
    def _binding(row: SinkRow) -> Binding:
        if row.writer in ("stream", "load"):
            return Binding(row.writer, row.query_id)
        return Binding("unknown", row.query_id)

    def binding(self, sink_id: str) -> Binding | None:
        self._call(f"binding {sink_id}")
        row = self._log.sinks.get(sink_id)
        return None if row is None else self._binding(row)

    def bind(self, sink_id: str, writer: Binding) -> None:
        self._call(f"bind {sink_id} {writer.kind} {writer.query_id}")
        row = self._log.sinks.get(sink_id)
        now = self._now()
        if row is None:
            self._log.sinks[sink_id] = SinkRow(writer.kind, writer.query_id, now, now)
        else:
            row.writer, row.query_id, row.bound_at = writer.kind, writer.query_id, now

    def _highest(self, sink_id: str) -> int | None:
        return max((d.batch_id for d in self._log.of_sink(sink_id)), default=None)

    def highest_decided(self, sink_id: str) -> int | None:
        self._call(f"highest decided {sink_id}")
        return self._highest(sink_id)

    def task_state(self, sink_id: str, run_id: str, batch_id: int) -> TaskState:
        self._call(f"task state {sink_id} run {run_id} batch {batch_id}")
        log = self._log
        run = log.runs.get((sink_id, run_id))
        fenced_by = None
        if run is not None and run.superseded_at is not None:
            fenced_by = run.superseded_by or "operator"
        sink = log.sinks.get(sink_id)
        prefix = Gid.sink_prefix(sink_id)
        state = TaskState(
            fenced_by,
            (sink_id, batch_id) in log.decisions,
            None if sink is None else self._binding(sink),
            self._highest(sink_id),
            tuple(gid for gid, _ in self.server.sinks_branches(prefix, self.database)),
        )
        if self.session.state_step is None:
            self.session.state_step = self.server.step_no()
            self.session.first_state = state
        return state

    def attempt_fate(self, sink_id: str, run_id: str, batch_id: int, gid: str) -> Fate:
        self._call(f"attempt fate {gid}")
        log = self._log
        decision = log.decisions.get((sink_id, batch_id))
        run = log.runs.get((sink_id, run_id))
        return Fate(
            None if decision is None else gid in decision.gids,
            run is not None and run.superseded_at is not None,
            run is not None and run.aborted_batch is not None and run.aborted_batch >= batch_id,
        )

    def register_run(
        self,
        sink_id: str,
        run_id: str,
        live_for_s: float,
        *,
        holds_lock: bool,
        admit: Callable[[Binding | None, int | None], None] | None = None,
        token: str | None = None,
    ) -> str | None:
        """sqlsink.register_run of sql/006_registration_row_lock.sql (and 007's token),
        after ``admit`` under the sink row's lock (run_registry.register_run): one step, as
        one transaction is."""
        self._call(f"register run {run_id} of {sink_id}{' (lock)' if holds_lock else ''}")
        log, now = self._log, self._now()
        if sink_id not in log.sinks:
            log.sinks[sink_id] = SinkRow(None, None, now, now)
        if admit is not None:
            admit(self._binding(log.sinks[sink_id]), self._highest(sink_id))
        run = log.runs.get((sink_id, run_id))
        if run is not None and run.superseded_at is not None:
            return run.superseded_by or "operator"
        self.server.hooks.on_register_run(self.session, sink_id, run_id, run is None)
        if run is None:
            for (sink, _), other in log.runs.items():
                if sink == sink_id and other.superseded_at is None:
                    other.superseded_at, other.superseded_by = now, run_id
            run = RunRow(sink_id, run_id, now, now, live_for_s)
            log.runs[(sink_id, run_id)] = run
            log.sinks[sink_id].newest_run = run_id
            known = False
        else:
            known = True
        if holds_lock:
            run.heartbeat_at, run.live_for = now, live_for_s
            run.lock_pid, run.lock_backend_start = self.session.pid, self.session.backend_start
        elif known and run.heartbeat_at < now - 1.0:
            run.heartbeat_at, run.live_for = now, live_for_s
        if token is not None and run.writer_token is None:
            run.writer_token = token
        return None

    def run_of_token(self, sink_id: str, token: str) -> str | None:
        self._call(f"run of token {token}")
        runs = [
            r for r in self._log.runs.values() if (r.sink_id, r.writer_token) == (sink_id, token)
        ]
        return max(runs, key=lambda r: r.first_seen).run_id if runs else None

    def mark_aborted(self, sink_id: str, run_id: str, batch_id: int) -> None:
        self._call(f"mark aborted {run_id} batch {batch_id}")
        run = self._log.runs.get((sink_id, run_id))
        self.server.hooks.on_mark_aborted(self.session, sink_id, run_id, batch_id)
        if run is not None:
            run.aborted_batch = (
                batch_id if run.aborted_batch is None else max(run.aborted_batch, batch_id)
            )

    def _live(self, sink_id: str | None) -> dict[tuple[str, str], float]:
        """run_registry.RUNS_SQL: neither fenced nor over (a batch of it aborted), and
        heard from within its timeout: its runTimeout, or three times its recent batch
        interval (the longest gap between its last four decisions) when that is longer."""
        now = self._now()
        live = {}
        for key, run in self._log.runs.items():
            if run.superseded_at is not None or run.aborted_batch is not None:
                continue
            if sink_id is not None and run.sink_id != sink_id:
                continue
            recent = sorted(
                (d.batch_id, d.decided_at)
                for d in self._log.of_sink(run.sink_id)
                if d.run_id == run.run_id
            )[-4:]
            gaps = [b - a for (_, a), (_, b) in itertools.pairwise(recent)]
            timeout = max(run.live_for, 3 * max(gaps)) if gaps else run.live_for
            if run.heartbeat_at > now - timeout:
                live[key] = now - run.heartbeat_at
        return live

    def await_batch_tasks(
        self, sink_id: str, batch_id: int, timeout_s: float
    ) -> tuple[list[int], list[int]]:
        def tasks() -> list[int]:
            return [
                s.pid
                for s in self.server.sessions.values()
                if s is not self.session
                and s.announced
                and getattr(s.purpose, "kind", None) == "task"
                and getattr(s.purpose, "sink", None) == sink_id
                and getattr(s.purpose, "batch", None) == batch_id
            ]

        self._call(f"tasks of {sink_id} batch {batch_id}")
        seen = left = tasks()
        deadline = self._now() + timeout_s
        while left and self._now() < deadline:
            self._call(f"wait for tasks of batch {batch_id}", lambda: not tasks(), deadline)
            left = tasks()
        return seen, left

    def live_runs(self, sink_id: str | None) -> dict[tuple[str, str], float]:
        self._call(f"live runs {sink_id}")
        live = self._live(sink_id)
        self.session.live_read = frozenset(run for _, run in live)
        return live

    def insert_decision(self, decision: NewDecision) -> bool:
        sink_id, batch_id, gids = decision.sink_id, decision.batch_id, decision.gids
        query_id = decision.query_id
        self._call(f"insert decision {sink_id} batch {batch_id} {sorted(gids)}")
        self.server.cut()  # a standby's WAL may end just before this decision
        log, now = self._log, self._now()
        writer = Binding.of(query_id)
        sink = log.sinks.get(sink_id)
        if sink is None:
            log.sinks[sink_id] = SinkRow(writer.kind, writer.query_id, now, now)
        elif sink.writer is None:
            sink.writer, sink.query_id = writer.kind, writer.query_id
        if (sink_id, batch_id) in log.decisions:
            return False
        row = DecisionRow(
            sink_id,
            batch_id,
            gids,
            decision.rows,
            query_id,
            decision.run_id,
            now,
            now if not gids else None,
            decision.partitions,
            decision.first_write_at,
            tables=decision.tables or None,
        )
        self.server.hooks.on_insert_decision(self.session, row)
        log.decisions[(sink_id, batch_id)] = row
        return True

    def record_metrics(
        self,
        sink_id: str,
        batch_id: int,
        commit_ms: float,
        orphans: int,
        *,
        figures: BatchFigures | None = None,
    ) -> None:
        self._call(f"record metrics {sink_id} batch {batch_id}")
        row = self._log.decisions.get((sink_id, batch_id))
        if row is not None and figures is not None:
            row.commit_ms, row.orphans = commit_ms, orphans
            row.figures = json.loads(json.dumps(figures.to_json()))  # as the column holds
        elif row is not None:  # a replay: what the first commit recorded stands
            row.commit_ms = commit_ms if row.commit_ms is None else row.commit_ms
            row.orphans = orphans if row.orphans is None else row.orphans

    def visible_markers(self, gids: Collection[str]) -> set[str]:
        if not gids:
            return set()
        self._call(f"visible markers {sorted(gids)}")
        return {g for g in gids if g in self._log.markers}

    def record_handover(self, sink_id: str, run_id: str, batch_id: int) -> None:
        self._call(f"record hand-over {sink_id} run {run_id} batch {batch_id}")
        self._log.handovers[(sink_id, run_id)] = (batch_id, self._now())

    def handovers(self, sink_id: str) -> list[Handover]:
        self._call(f"hand-overs {sink_id}")
        return [
            Handover(run, batch, stamp(at))
            for (sink, run), (batch, at) in self._log.handovers.items()
            if sink == sink_id
        ]

    def mark_complete(self, sink_id: str, batch_ids: Collection[int]) -> None:
        self._call(f"mark complete {sink_id} {sorted(batch_ids)}")
        log, now = self._log, self._now()
        done = []
        for batch_id in batch_ids:
            row = log.decisions.get((sink_id, batch_id))
            if row is not None and row.completed_at is None:
                row.completed_at = now
                done.append(batch_id)
        if not done:
            return
        self.server.hooks.on_mark_complete(self.session, sink_id, done)
        for gid, marker in list(log.markers.items()):
            if marker.sink_id == sink_id and marker.batch_id in done:
                del log.markers[gid]

    def prune_decisions(self, sink_id: str, through: int) -> int:
        self._call(f"prune decisions {sink_id} through {through}")
        log = self._log
        gone = [
            b
            for (s, b), row in log.decisions.items()
            if s == sink_id and b <= through and row.completed_at is not None
        ]
        if not gone:
            return 0
        self.server.hooks.on_prune(self.session, sink_id, gone)
        for batch_id in gone:
            del log.decisions[(sink_id, batch_id)]
        sink = log.sinks.get(sink_id)
        if sink is not None:
            sink.pruned_through = max(sink.pruned_through or -1, max(gone))
        return len(gone)

    # -- the checkpoint check's rows (postgres/checkpoint_records.py) ---------------------

    # -- a partition's transaction (postgres/partition.py) --------------------------------

    def enter_task_session(self) -> None:
        """mariadb's ``enter_task_session``: the task's session says whose it is (from
        here ``await_batch_tasks`` finds it; postgres's says so from its connect)."""
        self._call("REPLACE INTO task_sessions")
        self.session.announced = True

    def begin(self) -> None:
        """BEGIN (mariadb: XA START; refused while the session has a prepared branch)."""
        self._call("XA START" if self.server.mariadb else "BEGIN")
        if self.session.branch is not None:
            raise SqlError(
                XAER_RMFAIL,
                "XAER_RMFAIL: The command cannot be executed when global transaction is in "
                "the  PREPARED state",
            )
        self.server.hooks.on_begin_write(self.session)
        self.session.txn = Txn(
            next(self.server._xids), self.database, self.session.role, self.session
        )

    def write_row(self, table: str, key: Hashable) -> None:
        """One row of the COPY (an upsert when the table has a key: it waits for the
        row lock of whoever holds the key, up to lock_timeout, then goes on)."""
        self._call(f"COPY {table} {key}")
        txn = self.session.txn
        assert txn is not None, "write outside a transaction"
        lock = (self.database, table, key)
        deadline = self._now() + self.session.lock_timeout_s
        while (holder := self.server.row_locks.get(lock)) not in (None, txn):
            assert holder is not None
            self.server.hooks.on_row_wait(self.session, holder)
            if self._now() >= deadline:
                self.rollback()
                raise TransientError(
                    f"canceling statement due to lock timeout: row {key} of {table} is "
                    f"locked by {holder.gid or f'transaction {holder.xid}'}",
                    gid=holder.gid,
                )
            self._call(
                f"wait for row {key}", lambda: self.server.row_locks.get(lock) is None, deadline
            )
            txn = self.session.txn
            assert txn is not None
        self.server.row_locks[lock] = txn
        txn.rows.append((table, key))

    def insert_marker(
        self, gid: str, sink_id: str, batch_id: int, partition_id: int, rows: int
    ) -> None:
        self._call(f"INSERT marker {gid}")
        txn = self.session.txn
        assert txn is not None, "marker outside a transaction"
        txn.marker = MarkerRow(gid, sink_id, batch_id, partition_id, rows, self._now())

    def prepare(self, gid: str) -> str:
        """PREPARE TRANSACTION; the command tag."""
        self._call(f"PREPARE TRANSACTION {gid}")
        txn = self.session.txn
        assert txn is not None, "PREPARE outside a transaction"
        self.session.txn = None
        if gid in self.server.prepared:
            self.server._release(txn)
            raise SqlError("42710", f'transaction identifier "{gid}" is already in use')
        txn.session, txn.gid = None, gid
        txn.prepared_at, txn.prepared_step = self._now(), self.server.step_no()
        txn.preparer = self.session.actor
        if self.server.mariadb:  # attached to this session until it ends
            txn.attached, txn.attached_until = self.session, float("inf")
            self.session.branch = txn
        self.server.prepared[gid] = txn
        return "PREPARE TRANSACTION"

    def rollback(self) -> None:
        """A plain ROLLBACK of the open transaction (never ROLLBACK PREPARED)."""
        txn, self.session.txn = self.session.txn, None
        if txn is not None:
            self.server._release(txn)

    def close(self) -> None:
        """The client closes: an open transaction rolls back, a prepared one stays."""
        self.server.end_session(self.session, terminated=False)

    # -- a session kept between uses (postgres/sessions.py) ------------------------------

    def keep(self) -> bool:
        """``sessions._give_back`` after a use that ended cleanly: ``DISCARD ALL`` (the
        sink lock goes with every advisory lock), renamed idle. False, and closed, when
        it cannot be kept (an open transaction, a connection gone)."""
        session = self.session
        if session.dead or session.noticed or session.txn is not None:
            self.close()
            return False
        try:
            self._call("DISCARD ALL")
        except ConnectionLost:  # gone meanwhile: closed, not kept
            self.close()
            return False
        self.server.discard(session)
        return True

    def take_back(self, actor: Actor | None, purpose: Any) -> bool:
        """``sessions._take``: one statement names the kept session for its new use and is
        its health check. False when it is gone (the server ended it: idle too long, a
        failover): the caller makes a new connection, nothing of the use has run."""
        session = self.session
        idle = session.idle_since
        if not session.dead and idle is not None and self._now() - idle > IDLE_SESSION_TIMEOUT_S:
            self.server.end_session(session, terminated=True)  # idle_session_timeout
        if session.dead:
            return False
        session.new_use(actor, purpose)
        try:
            self._call("set application_name (a kept session)")
        except ConnectionLost:
            return False
        return True

    def loss_evidence(self, sink_id: str) -> tuple[frozenset[int], int | None]:
        """``core.lost.evidence`` without a checkpoint: the batches the sink's 50 most
        recent checkpoint checks found lost, and the highest batch Spark aborted."""
        self._call(f"checkpoint checks and runs of {sink_id}")
        runs = [r for (s, _), r in self._log.runs.items() if s == sink_id]
        checked = sorted(
            (r for r in runs if r.checkpoint_checked_at is not None),
            key=lambda r: r.checkpoint_checked_at or 0.0,
            reverse=True,
        )[:50]
        recorded = frozenset(
            b for r in checked if r.checkpoint_verdict == "loss" for b in r.checkpoint_lost
        )
        aborted = max((r.aborted_batch for r in runs if r.aborted_batch is not None), default=None)
        return recorded, aborted

    # -- the checkpoint against the log (core.checkpoint_check.CheckpointLedger) ----------

    listing_s = 0.0  # how long listing the checkpoint's commits/ takes (set by the world)

    def run_check(self, sink_id: str, run_id: str) -> RunCheck:
        self._call(f"checkpoint check of run {run_id}?")
        run = self._log.runs.get((sink_id, run_id))
        checked = run is not None and run.checkpoint_checked_at is not None
        return RunCheck(checked, self._highest(sink_id))

    def coverage(self, sink_id: str, batch_ids: Collection[int]) -> LogCoverage:
        if self.listing_s > 0:  # the listing ran just before (a remote one, slowly)
            deadline = self._now() + self.listing_s
            self._call("list commits/ (slowly)", lambda: False, deadline)
        self._call(f"coverage of {sink_id}")
        batches = [d.batch_id for d in self._log.of_sink(sink_id)]
        sink = self._log.sinks.get(sink_id)
        return LogCoverage(
            min(batches, default=None),
            None if sink is None else sink.pruned_through,
            frozenset(b for b in batch_ids if b in batches),
        )

    def record_check(
        self, sink_id: str, run_id: str, batch_id: int, location: str | None, verdict: Verdict
    ) -> None:
        self._call(f"record checkpoint check of run {run_id}: {verdict.kind}")
        run = self._log.runs.get((sink_id, run_id))
        if run is not None:
            run.checkpoint_checked_at, run.checkpoint_verdict = self._now(), verdict.kind
            run.checkpoint_lost, run.checkpoint_batch = tuple(verdict.lost), batch_id
            run.checkpoint_location = location

    def recorded_location(self, sink_id: str) -> str | None:
        """``recover_lost.recorded_checkpoint``: the newest location a run's check recorded."""
        self._call(f"recorded checkpoint of {sink_id}")
        runs = [
            r
            for (s, _), r in self._log.runs.items()
            if s == sink_id and r.checkpoint_location is not None
        ]
        newest = max(runs, key=lambda r: r.checkpoint_checked_at or 0.0, default=None)
        return None if newest is None else newest.checkpoint_location

    # -- operators and the CLI ----------------------------------------------------------

    def forget_sink(self, sink_id: str) -> int:
        """retention.forget_sink (the caller holds the sink lock): decisions removed."""
        self._call(f"forget {sink_id}")
        log = self._log
        prefix = Gid.sink_prefix(sink_id)
        prepared = [g for g, _ in self.server.sinks_branches(prefix, self.database) if Gid.parse(g)]
        incomplete = [d.batch_id for d in log.of_sink(sink_id) if d.completed_at is None]
        live = [run for _, run in self._live(sink_id)]
        if prepared or incomplete or live:
            raise ConfigError(
                f"sink {sink_id} is not finished: prepared {sorted(prepared)[:3]}, "
                f"incomplete batches {sorted(incomplete)[:10]}, live runs {sorted(live)}. "
                f"Nothing was removed. Fix: run sqlsink recover --sink-id {sink_id} first",
                sink_id=sink_id,
            )
        count = len(log.of_sink(sink_id))
        self.server.hooks.on_log_removed(self.session, sink_id, "sqlsink forget")
        self._remove(sink_id)
        return count

    def _remove(self, sink_id: str) -> None:
        log = self._log
        for gid in [g for g, m in log.markers.items() if m.sink_id == sink_id]:
            del log.markers[gid]
        for decided in [k for k in log.decisions if k[0] == sink_id]:
            del log.decisions[decided]
        for run in [k for k in log.runs if k[0] == sink_id]:
            del log.runs[run]
        log.sinks.pop(sink_id, None)

    def operator_delete_sink(self, sink_id: str) -> None:
        """An operator's plain ``DELETE FROM sqlsink.sinks WHERE sink_id = ...``.

        Schema 3: the trigger keep_decided refuses a sink with decisions, and the
        runs' foreign key one with runs. Schema 1 (``cascade``): its decisions go too."""
        self._call(f"DELETE FROM sqlsink.sinks {sink_id}")
        log = self._log
        if sink_id not in log.sinks:
            return
        if not self.server.cascade:
            if log.of_sink(sink_id):
                raise SqlError("P0001", f"sqlsink: sink {sink_id} has decided batches")
            if any(s == sink_id for s, _ in log.runs):
                raise SqlError("23503", "update or delete on table sinks violates runs_fkey")
            del log.sinks[sink_id]
            return
        self.server.hooks.on_log_removed(self.session, sink_id, "a plain DELETE")
        for decided in [k for k in log.decisions if k[0] == sink_id]:
            del log.decisions[decided]
        for run in [k for k in log.runs if k[0] == sink_id]:
            del log.runs[run]
        del log.sinks[sink_id]

    def operator_delete_decisions(self, sink_id: str) -> None:
        """An operator's plain ``DELETE FROM sqlsink.decisions WHERE sink_id = ...``: the
        trigger keep_incomplete refuses it while a decision of the sink is incomplete."""
        self._call(f"DELETE FROM sqlsink.decisions {sink_id}")
        log = self._log
        rows = log.of_sink(sink_id)
        if not self.server.cascade and any(d.completed_at is None for d in rows):
            raise SqlError("P0001", f"sqlsink: a decision of sink {sink_id} is incomplete")
        if rows:
            self.server.hooks.on_log_removed(self.session, sink_id, "a plain DELETE")
        for row in rows:
            del log.decisions[(row.sink_id, row.batch_id)]
