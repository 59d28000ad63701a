"""Chaos: a stream drained through random, repeated, combined failures.

Each round writes a replayable source of numbered records and runs a real
driver process (its own Spark, ``tests/spark/crash_driver.py``) again and again
from one checkpoint until the source is drained. Every run draws its trouble:

- a SIGKILL of the whole driver at a protocol step or at a random moment;
- the sink's sessions terminated with ``pg_terminate_backend`` (mid-COPY and
  mid-commit through fault points, and at random moments);
- a task that fails after PREPARE on its first attempt, and task retries: the
  master is ``local[2,4]`` (two cores, four failures of a task allowed) in many
  runs, where the retry must adopt the failed attempt's prepared transaction and
  go on (docs/DESIGN.md invariant 12; plain ``local[2]`` never retries);
- PostgreSQL stopped with ``-m immediate`` and started again (at a random moment
  of a run, and after a run died);
- ``sqlsink recover`` (the real CLI, without ``--force``) run at random moments
  beside the live run: it may refuse, or resolve a dead run's leftovers, but it
  must never roll back an undecided transaction of the live run (issue 12 item 7);
- a paused driver (issue 12 item 9): a run is frozen with SIGSTOP (every process
  of its session: the driver, its JVM and its Python workers, which PySpark puts
  in process groups of their own) at a protocol step or at a random moment, and
  a second run is started on the same checkpoint while it is frozen. The second
  run fences the first (it supersedes it in ``sqlsink.runs`` and ends its session
  if it holds the sink lock). Then the first is resumed with SIGCONT: its commit,
  abort and tasks are refused with the fenced error (a task of it that had
  prepared rolls itself back), it fails, and it changes nothing of the sink (the
  table, the decisions, the other runs' prepared transactions, the runs
  registry); then it is killed.

Then, exactly: every record once, nothing of the sink left prepared, Spark's commit
log and the sink's decisions name the same batches, all complete, and ``sqlsink
status`` clean. A run in which a task failed after PREPARE under a retrying master
must drain, unless it was killed or drew trouble that fails runs with errors. The
first two runs of each round are forced: one pauses (then the second run on its
checkpoint is killed at a protocol step), one retries after PREPARE (then it is
killed at a protocol step of a later batch), so that the default run has both and
the round goes on.

    pytest tests/chaos --chaos-rounds 15 --chaos-seed 7 -s --timeout 0   # a long run
    pytest tests/chaos --chaos-rounds 8 --chaos-kill-weights mid_commit=5 -s --timeout 0

``--chaos-kill-weights`` makes some protocol steps likelier for kills (each step is
drawn once by default, so a kill mid-commit is one in seven of them).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.faults import POINTS
from sqlsink.core.gid import Gid
from tests.chaos.drivers import (
    BATCHES,
    PER_BATCH,
    REPO,
    expected_table,
    fired_faults,
    freeze_session,
    kill_points,
    kill_session,
    signal_session,
    sink_of,
    source_batches,
    start_driver,
)
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import commit_log, decided_batches, query_id, write_records

pytestmark = [pytest.mark.spark, pytest.mark.crash]
MAX_RUNS = 40  # a round's runs before it counts as stuck (most die on purpose)
RETRY_MASTER = "local[2,4]"  # two cores, a task may fail 4 times
# the run after a paused one waits this long for the sink lock that the paused
# driver holds, then ends the paused driver's session (it is provably fenced); the
# paused driver's own lock waits, once resumed, are as short
FENCING_LOCK_TIMEOUT = "5s"
PAUSE_REACH_S = 150.0  # for the paused run to reach its pause point
PAUSE_SLEEP_S = 5.0  # a pause point sleeps this long: time enough to SIGSTOP it there
ZOMBIE_WAIT_S = 60.0  # after SIGCONT, for the resumed zombie to fail on its own
PAUSE_P = 0.08  # a run is paused (besides the first run of every other round)
RUN_TIMEOUT_S = 600.0
LIVE_ROLLBACK = "is undecided"  # a rollback for this reason of a live run's gid is a bug


@dataclass
class Tally:
    runs: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    postgres_crashes: int = 0
    crashes_mid_run: int = 0
    terminated: Counter[str] = field(default_factory=Counter)
    failed_runs: int = 0
    retry_runs: int = 0  # runs with a master that retries tasks
    retries_after_prepare: int = 0  # of them, runs where a task failed after PREPARE
    retries_went_on: int = 0  # ... and that run decided the batch of the failed attempt
    paused: Counter[str] = field(default_factory=Counter)  # where drivers were frozen
    zombies: Counter[str] = field(default_factory=Counter)  # how the resumed ones ended
    recovers: Counter[str] = field(default_factory=Counter)  # recover's status beside a run
    recovers_left_live: int = 0  # recovers that left prepared transactions of the live run
    # the reader of the consistent view (append mode), each sample one snapshot of both
    reads: int = 0
    reads_table_partial: int = 0  # the bare table showed part of a batch
    reads_view_partial: int = 0  # the view did (invariant 13: must stay 0)

    def line(self) -> str:
        kills = sum(self.kills.values())
        return (
            f"runs {self.runs}, kills {kills} {dict(self.kills)}, postgres crashes "
            f"{self.postgres_crashes} ({self.crashes_mid_run} mid-run), sessions terminated "
            f"{sum(self.terminated.values())} {dict(self.terminated)}, "
            f"runs failed otherwise {self.failed_runs}, runs with task retries "
            f"{self.retry_runs} (a failure after PREPARE in {self.retries_after_prepare}, "
            f"went on {self.retries_went_on}), paused drivers {sum(self.paused.values())} "
            f"{dict(self.paused)} {dict(self.zombies)}, recover beside a live run "
            f"{sum(self.recovers.values())} {dict(self.recovers)} (left the live run's prepared "
            f"transactions in {self.recovers_left_live}), reads of the view {self.reads} "
            f"(the table showed part of a batch in {self.reads_table_partial}, the view in "
            f"{self.reads_view_partial})"
        )


class ViewReader:
    """A reader beside the round (append mode, option consistentView): every 20 ms, in
    one REPEATABLE READ snapshot, how many rows of each batch the view and the bare table
    show. The view must show each batch whole or not at all (invariant 13), through
    kills, terminated sessions, PostgreSQL crashes and paused drivers; the bare table
    may show part of one (counted, to show the reader met such moments)."""

    QUERY = (
        "SELECT (SELECT coalesce(array_agg(n ORDER BY n), '{{}}') FROM "
        "        (SELECT count(*) AS n FROM {view} GROUP BY id / %(per)s) AS v), "
        "       (SELECT coalesce(array_agg(n ORDER BY n), '{{}}') FROM "
        "        (SELECT count(*) AS n FROM {table} GROUP BY id / %(per)s) AS t)"
    )

    def __init__(self, url: str, table: str, view: str, tally: Tally) -> None:
        self.url, self.tally = url, tally
        self.query = sql.SQL(self.QUERY).format(
            view=sql.Identifier(view), table=sql.Identifier(table)
        )
        self.stop = threading.Event()
        self.partial_views: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> ViewReader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _read(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self.stop.wait(0.02):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(
                        self.url, autocommit=True, application_name="chaos reader",
                        connect_timeout=2,
                    )  # fmt: skip
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    row = conn.execute(self.query, {"per": PER_BATCH}).fetchone()
            except psycopg.Error:  # no view yet, PostgreSQL restarting, ...
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.2)
                continue
            assert row is not None
            view, table = list(row[0]), list(row[1])
            self.tally.reads += 1
            if any(n != PER_BATCH for n in table):
                self.tally.reads_table_partial += 1
            if any(n != PER_BATCH for n in view):
                self.tally.reads_view_partial += 1
                self.partial_views.append(f"view {view}, table {table}")
        if conn is not None:
            conn.close()


# -- processes ---------------------------------------------------------------------------


def terminate_sink_sessions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'sqlsink %%' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(str(rows[0])) if rows else 0


# -- the commit log, as the checks read it -----------------------------------------------


def runs_of(url: str, sink_id: str | None) -> dict[str, bool]:
    """run id -> superseded, from the runs registry (docs/DESIGN.md invariant 10)."""
    if sink_id is None:
        return {}
    with psycopg.connect(url) as conn:
        try:
            rows = conn.execute(
                "SELECT run_id, superseded_at IS NOT NULL FROM sqlsink.runs WHERE sink_id = %s",
                (sink_id,),
            ).fetchall()
        except psycopg.errors.UndefinedTable:  # a first run killed before it made the log
            return {}
    return {str(run): bool(superseded) for run, superseded in rows}


def sink_state(server: PgServer, table: str, tmp: Path, zombie_runs: set[str]) -> dict[str, Any]:
    """Everything of the sink a fenced zombie must leave alone: the table, the sink's
    decisions and runs, the prepared transactions (but the zombie's own). (Not Spark's
    checkpoint: a zombie paused after its commit of batch N had finished may still
    write commits/N and plan N+1 in it; its tasks of N+1 are then refused.)"""
    sink_id = sink_of(tmp)
    with psycopg.connect(server.url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
        decisions = conn.execute(
            "SELECT batch_id, gids, completed_at IS NOT NULL FROM sqlsink.decisions "
            "WHERE sink_id = %s ORDER BY batch_id",
            (sink_id,),
        ).fetchall()
        newest = conn.execute(
            "SELECT newest_run FROM sqlsink.sinks WHERE sink_id = %s", (sink_id,)
        ).fetchone()
    prepared = [
        gid
        for gid, _ in prepared_transactions(server.admin_url)
        if (parsed := Gid.parse(gid)) is None or parsed.run_id not in zombie_runs
    ]
    return {
        "rows": [tuple(r) for r in rows],
        "decisions": [(b, sorted(g), c) for b, g, c in decisions],
        "newest run": newest,
        "runs": runs_of(server.url, sink_id),
        "prepared": prepared,
    }


# -- one run -----------------------------------------------------------------------------


@dataclass
class Trouble:
    """What a run draws."""

    faults: list[dict[str, Any]] = field(default_factory=list)
    master: str = "local[2]"
    kill_after: float | None = None
    terminate_at: float | None = None
    crash_at: float | None = None
    recover_at: list[float] = field(default_factory=list)
    retry_fault: bool = False  # a task that fails after PREPARE on its first attempt

    def errors(self) -> bool:
        """Whether it may fail the run with an error (not a kill): cut sessions, a crash."""
        cut = any(f["action"] == "terminate" for f in self.faults)
        return cut or self.terminate_at is not None or self.crash_at is not None


def draw_trouble(
    rng: random.Random,
    pending: list[int],
    server: PgServer,
    forced: str | None,
    points: tuple[str, ...] = POINTS,
) -> Trouble:
    """A run's trouble. ``forced="retry"``: a task of the first pending batch fails after
    PREPARE under a master that retries it, nothing fails the run with an error, and a
    kill comes at a protocol step of a later batch (so that the retry is judged, and the
    round goes on). ``forced="kill"``: a kill at a protocol step of a later pending batch,
    with the rest drawn as usual (the round goes on)."""
    trouble = Trouble()
    retry = forced == "retry"
    roll = 0.0 if forced in ("retry", "kill") else rng.random()
    if roll < 0.55:  # a kill at a protocol step of a pending batch (forced: a later one
        # than the first, which may be a replay whose tasks skip, or the retry's batch)
        point = rng.choice(points)
        batch = rng.choice((pending[1:4] or pending) if forced else pending[:3])
        if retry and batch == pending[0]:  # no later batch: kill once the retry is judged
            point = rng.choice(["after_decision", "mid_commit", "after_commit"])
        trouble.faults.append({"point": point, "batch": batch, "action": "kill"})
    elif roll < 0.75:  # a kill at a random moment
        trouble.kill_after = rng.uniform(8, 30)
    if retry or rng.random() < 0.3:  # a task that fails after PREPARE on its first attempt
        trouble.retry_fault = True
        trouble.faults.append(
            {
                "point": "after_prepare",
                "batch": pending[0] if retry else rng.choice(pending[:3]),
                "attempt": 0,
                "partition": rng.randrange(2),
                "action": "raise",
            }
        )
    # task retries: mostly with that failure (then the retry must go on), sometimes without
    if retry or rng.random() < (0.7 if trouble.retry_fault else 0.4):
        trouble.master = RETRY_MASTER
    if not retry and rng.random() < 0.25:  # a sink session cut, mid-COPY or mid-commit
        trouble.faults.append(
            {
                "point": rng.choice(["mid_copy", "mid_commit"]),
                "batch": rng.choice(pending[:3]),
                "action": "terminate",
                "url": server.admin_url,
                "once": True,
            }
        )
    if not retry:
        trouble.terminate_at = rng.uniform(10, 35) if rng.random() < 0.15 else None
        trouble.crash_at = rng.uniform(10, 35) if rng.random() < 0.1 else None
    if forced is not None or rng.random() < 0.35:  # sqlsink recover beside the live run
        trouble.recover_at = sorted(rng.uniform(4, 35) for _ in range(rng.choice([1, 2, 3])))
    return trouble


@dataclass
class Recover:
    """One ``sqlsink recover`` beside a live run."""

    process: subprocess.Popen[str]
    out: Path
    err: Path


class Round:
    """One source drained from one checkpoint, run after run."""

    def __init__(
        self,
        rng: random.Random,
        seed: int,
        tmp: Path,
        server: PgServer,
        table: str,
        mode: str,
        tally: Tally,
        points: tuple[str, ...] = POINTS,
    ) -> None:
        self.rng, self.seed, self.tmp, self.server = rng, seed, tmp, server
        self.points = points  # the protocol steps kills are drawn from
        self.table, self.mode, self.tally = table, mode, tally
        self.number = 0  # runs started, for file names
        # append mode writes through a consistent view, read beside the round (ViewReader)
        self.view = f"{table}_whole" if mode == "append" else None

    def pending(self) -> list[int]:
        """The batches Spark has not committed yet: an armed fault fires."""
        done = self.tmp / "chk" / "commits"
        return [b for b in range(BATCHES) if not (done / str(b)).exists()] or [BATCHES - 1]

    def fresh(self) -> list[int]:
        """The pending batches without a decision: their tasks write (a decided batch's
        replay skips, and fault points of its tasks never fire)."""
        pending, sink_id = self.pending(), sink_of(self.tmp)
        if sink_id is None:  # no run started yet
            return pending
        try:
            decided = set(decided_batches(self.server.url, sink_id))
        except psycopg.errors.UndefinedTable:  # a first run killed before it made the log
            return pending
        return [b for b in pending if b not in decided] or pending

    def one_run(self, forced: str | None = None) -> bool:
        """One driver run with its drawn trouble; True when the source is drained."""
        if forced == "pause" or (forced is None and self.rng.random() < PAUSE_P):
            return self.paused_run(forced=forced == "pause")
        pending = self.fresh() if forced == "retry" else self.pending()
        return self.run(draw_trouble(self.rng, pending, self.server, forced, self.points))

    def run(
        self,
        trouble: Trouble,
        options: dict[str, str] | None = None,
        zombie: set[str] | None = None,
    ) -> bool:
        """Start a driver and give it its trouble; True when it drained the source."""
        self.number += 1
        name = f"run-{self.number}"
        tally, server, tmp = self.tally, self.server, self.tmp
        sink_id = sink_of(tmp)
        runs_before = set(runs_of(server.url, sink_id))
        driver = start_driver(
            tmp,
            server.url,
            self.table,
            trouble.faults,
            self.mode,
            name=name,
            master=trouble.master,
            options=options,
            view=self.view,
        )
        tally.runs += 1
        tally.retry_runs += trouble.master == RETRY_MASTER
        stop = threading.Event()
        recovers: list[Recover] = []

        def helper() -> None:
            started = time.monotonic()
            terminate_at, crash_at = trouble.terminate_at, trouble.crash_at
            recover_at = list(trouble.recover_at)
            while not stop.wait(0.2):
                elapsed = time.monotonic() - started
                if trouble.kill_after is not None and elapsed > trouble.kill_after:
                    os.killpg(driver.pid, signal.SIGKILL)
                    tally.kills["random moment"] += 1
                    return
                if terminate_at is not None and elapsed > terminate_at:
                    tally.terminated["random moment"] += terminate_sink_sessions(server.url)
                    terminate_at = None
                if crash_at is not None and elapsed > crash_at:
                    server.crash_and_restart()
                    tally.postgres_crashes += 1
                    tally.crashes_mid_run += 1
                    crash_at = None
                if recover_at and elapsed > recover_at[0]:
                    recover_at.pop(0)
                    if driver.poll() is None and (sink := sink_of(tmp)) is not None:
                        recovers.append(self.start_recover(sink, f"{name}-{len(recovers)}"))

        thread = threading.Thread(target=helper, daemon=True)
        thread.start()
        try:
            code = driver.wait(timeout=RUN_TIMEOUT_S)
        finally:
            stop.set()
            thread.join()
            kill_session(driver)  # whatever is left of it (Python workers of a killed JVM)
        stderr = (tmp / f"{name}.log").read_text(errors="replace")
        fired = fired_faults(tmp, name)
        for fault in fired:
            if fault["action"] == "terminate":
                tally.terminated[fault["point"]] += 1
        if code == -signal.SIGKILL:
            kills = [f["point"] for f in fired if f["action"] == "kill"]
            if kills:
                tally.kills[kills[-1]] += 1
        elif code != 0:
            tally.failed_runs += 1
            assert "Traceback" in stderr or "Exception" in stderr, stderr[-3000:]
        # this driver's runs: what registered while it ran (a paused zombie's excepted)
        live = set(runs_of(server.url, sink_of(tmp))) - runs_before - (zombie or set())
        self.judge_recovers(recovers, live, stderr, trouble.errors())
        # nobody may roll back a live run's prepared transaction before its decision
        assert "is no longer prepared" not in stderr, self.failure(
            "a live run's prepared transaction was rolled back under it", stderr
        )
        retried = [
            f["batch"] for f in fired if (f["point"], f["action"]) == ("after_prepare", "raise")
        ]
        if retried and trouble.master == RETRY_MASTER:
            tally.retries_after_prepare += 1
            # invariant 12: the retry adopts the prepared attempt and goes on, so nothing
            # but a kill or trouble that fails runs with errors may stop this run
            if not trouble.errors() and code != -signal.SIGKILL:
                assert code == 0, self.failure(
                    "a task retried after a failure past PREPARE did not go on", stderr
                )
            # went on: this run decided the batch of the failed attempt
            decided = commit_log(server.url, sink_of(tmp) or "", "run_id")
            tally.retries_went_on += decided.get(retried[0], (None,))[0] in live
        if code != 0 and self.rng.random() < 0.35:
            server.crash_and_restart()
            tally.postgres_crashes += 1
        return code == 0

    def failure(self, what: str, stderr: str) -> str:
        return (
            f"{what} (seed {self.seed}, {self.mode} round, run {self.number}, {self.tmp}); "
            f"{self.tally.line()}\n--- driver stderr (end) ---\n{stderr[-6000:]}"
        )

    # -- recover beside a live run --------------------------------------------------------

    def start_recover(self, sink_id: str, name: str) -> Recover:
        out, err = self.tmp / f"recover-{name}.json", self.tmp / f"recover-{name}.log"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sqlsink",
                    "recover",
                    "--url",
                    self.server.url,
                    "--sink-id",
                    sink_id,
                    "--json",
                ],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        return Recover(process, out, err)

    def judge_recovers(
        self, recovers: list[Recover], live: set[str], stderr: str, errors: bool
    ) -> None:
        """A refusal is fine, and so is resolving what dead runs left; rolling back an
        undecided transaction of the live run is not (issue 12 item 7). ``errors``: the
        run's trouble may cut recover's session too (or restart PostgreSQL under it)."""
        for recover in recovers:
            recover.process.wait(timeout=120)
            answer = recover.out.read_text() + recover.err.read_text()
            try:
                doc = json.loads(recover.out.read_text())
            except ValueError:
                doc = {"error": "no JSON document"}
            for sink in doc.get("sinks", []):
                self.tally.recovers[str(sink["status"])] += 1
            if doc.get("error"):
                self.tally.recovers["error"] += 1
                assert errors, self.failure(f"sqlsink recover failed: {answer[-3000:]}", stderr)
            actions = doc.get("actions", [])
            self.tally.recovers_left_live += any(
                a["action"] == "leave" and a["run_id"] in live for a in actions
            )
            wrong = [
                a
                for a in actions
                if a["result"] == "rolled back"
                and a["run_id"] in live
                and LIVE_ROLLBACK in str(a["reason"])
            ]
            assert not wrong, self.failure(
                f"sqlsink recover (without --force) rolled back the live run's undecided "
                f"transactions {[(a['gid'], a['reason']) for a in wrong]}; recover's report: "
                f"{json.dumps(doc)[:3000]}",
                stderr,
            )

    # -- a paused driver and a second run on the same checkpoint ------------------------------

    def paused_run(self, forced: bool) -> bool:
        """Freeze a run (SIGSTOP), run another on the same checkpoint, resume the first:
        fenced, it must change nothing. True when the source is drained."""
        tally, server, tmp, rng = self.tally, self.server, self.tmp, self.rng
        self.number += 1
        name = f"run-{self.number}-paused"
        runs_before = set(runs_of(server.url, sink_of(tmp)))
        faults: list[dict[str, Any]] = []
        if forced or rng.random() < 0.75:  # at a protocol step of a pending batch
            where = rng.choice(POINTS)
            faults.append(
                {
                    "point": where,
                    "batch": rng.choice(self.fresh()[:3]),
                    "action": "sleep",
                    "seconds": PAUSE_SLEEP_S,
                    "once": True,
                }
            )
            pause_after = None
        else:
            # (a clean run drains in 12-20 s; frozen before its tasks registered, it
            # cannot be fenced by the second run: resumed, it goes on as the newest run)
            where, pause_after = "random moment", rng.uniform(4, 14)
        # (its lock waits are short too: resumed, a task of it may wait on row locks of
        # the second run's leftovers, and should give up within ZOMBIE_WAIT_S)
        zombie = start_driver(
            tmp,
            server.url,
            self.table,
            faults,
            self.mode,
            name=name,
            options={"lockTimeout": FENCING_LOCK_TIMEOUT},
            view=self.view,
        )
        tally.runs += 1
        started = time.monotonic()
        while True:  # until it reaches its pause point (or ends without reaching it)
            if zombie.poll() is not None:
                return self.paused_run_ended(zombie, name)
            elapsed = time.monotonic() - started
            if (pause_after is not None and elapsed > pause_after) or (
                pause_after is None and fired_faults(tmp, name)
            ):
                break
            if elapsed > PAUSE_REACH_S:
                kill_session(zombie)
                tally.zombies["never reached its pause"] += 1
                return False
            time.sleep(0.1)
        if not freeze_session(zombie.pid):
            return self.paused_run_ended(zombie, name)
        tally.paused[where] += 1
        zombie_runs = set(runs_of(server.url, sink_of(tmp))) - runs_before
        try:
            # the second run, with trouble of its own, on the same checkpoint (the round's
            # forced pause: killed at a protocol step, so that the round goes on)
            forced_kill = "kill" if forced else None
            trouble = draw_trouble(rng, self.pending(), server, forced_kill, self.points)
            drained = self.run(
                trouble, options={"lockTimeout": FENCING_LOCK_TIMEOUT}, zombie=zombie_runs
            )
            runs = runs_of(server.url, sink_of(tmp))
            fenced = bool(zombie_runs) and all(runs.get(r, False) for r in zombie_runs)
            if not fenced:
                # it never registered, or the second run died before registering: the
                # frozen run is the newest run, and may go on as a live one
                signal_session(zombie.pid, signal.SIGCONT)
                code = zombie.wait(timeout=RUN_TIMEOUT_S)
                tally.zombies["not fenced, went on"] += 1
                return drained or code == 0
            before = sink_state(server, self.table, tmp, zombie_runs)
            signal_session(zombie.pid, signal.SIGCONT)
            try:
                ended: int | None = zombie.wait(timeout=ZOMBIE_WAIT_S)
            except subprocess.TimeoutExpired:
                ended = None
            kill_session(zombie)
            after = sink_state(server, self.table, tmp, zombie_runs)
            stderr = (tmp / f"{name}.log").read_text(errors="replace")
            assert after == before, self.failure(
                f"a fenced driver ({name}), paused at {where} and resumed, changed "
                f"{[k for k in before if before[k] != after[k]]}: before {before}, after {after}",
                stderr,
            )
            assert ended != 0, self.failure(
                f"a fenced driver ({name}), resumed, drained the source as if it were live",
                stderr,
            )
            # how it was stopped: its commit, abort or tasks refused with FencedError
            # ("superseded by run ..."); or, frozen after PREPARE in a batch that the
            # second run decided, its task rolled its own transaction back (that check
            # names the decision first) and failed, and its abort knew no run to act for;
            # or, frozen in Spark's own checkpoint writes, Spark refused it first
            outcomes = {
                "refused: fenced": "superseded by",
                "rolled itself back: decided without it": "was decided without this attempt",
                "refused by Spark's checkpoint": "Multiple streaming jobs detected",
            }
            seen = [outcome for outcome, text in outcomes.items() if text in stderr]
            assert ended is None or seen, self.failure(
                f"a fenced driver ({name}), paused at {where}, failed without the fenced error",
                stderr,
            )
            tally.zombies[seen[0] if ended is not None else "still running, killed"] += 1
            return drained
        finally:
            kill_session(zombie)

    def paused_run_ended(self, zombie: subprocess.Popen[str], name: str) -> bool:
        """The run meant to be paused ended first: it counts as an ordinary run."""
        code = kill_session(zombie)
        self.tally.zombies["ended before its pause"] += 1
        if code not in (0, None):
            self.tally.failed_runs += 1
        return code == 0


# -- the source and the checks -----------------------------------------------------------


def check_exactly_once(
    tmp: Path, server: PgServer, table: str, mode: str, view: str | None = None
) -> None:
    with psycopg.connect(server.url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
        if view is not None:  # all complete: the view shows the whole table
            shown = conn.execute(
                sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(sql.Identifier(view))
            ).fetchall()
            assert shown == rows, "the consistent view differs from the table at the end"

    ids = [int(str(r[0])) for r in rows]
    sink_id = query_id(tmp / "chk")
    decisions = decided_batches(server.url, sink_id)
    clean = expected_table(mode, tmp / "chk")
    expected = sorted(clean)
    duplicates = len(ids) - len(set(ids))
    missing = sorted(set(expected) - set(ids))
    assert (duplicates, missing[:10]) == (0, []), f"{duplicates} duplicates, missing {missing[:10]}"
    assert ids == expected
    assert dict(rows) == clean, "the table differs from a clean run's"
    assert [g for g, _ in prepared_transactions(server.admin_url)] == [], "orphans left"
    spark_committed = {int(p.name) for p in (tmp / "chk" / "commits").iterdir() if p.name.isdigit()}
    assert spark_committed <= set(decisions), "a batch Spark committed has no decision"
    # and no decision of a batch that Spark never committed (a zombie's, say)
    assert set(decisions) <= spark_committed, f"decided, not in commits/: {decisions}"
    assert all(decisions.values()), f"incomplete decisions: {decisions}"
    status = subprocess.run(
        [sys.executable, "-m", "sqlsink", "status", "--url", server.url, "--sink-id", sink_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stdout + status.stderr


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_chaos(
    request: pytest.FixtureRequest, tmp_path: Path, own_server: PgServer, table: str, mode: str
) -> None:
    pg_server = own_server  # a server this run may crash
    rounds = request.config.getoption("--chaos-rounds")
    seed = request.config.getoption("--chaos-seed")
    seed = seed if seed is not None else random.randrange(10**6)
    points = kill_points(request.config.getoption("--chaos-kill-weights"))
    rng = random.Random(f"{seed}-{mode}")
    tally = Tally()
    # the first two runs of every round: a paused driver and a retry after PREPARE, in
    # an order that alternates by round and mode
    kinds = ["pause", "retry"] if mode == "append" else ["retry", "pause"]
    for number in range(rounds if mode == "append" else max(1, rounds // 2)):
        tmp = tmp_path / f"round-{number}"
        round_table = f"{table}_{number}"
        write_records(tmp / "src", source_batches(mode))
        if mode == "upsert":
            with psycopg.connect(pg_server.url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (id bigint PRIMARY KEY, payload text, "
                        "ts timestamptz, amount double precision)"
                    ).format(sql.Identifier(round_table))
                )
        chaos = Round(rng, seed, tmp, pg_server, round_table, mode, tally, points)
        reader = (
            ViewReader(pg_server.url, round_table, chaos.view, tally)
            if chaos.view
            else contextlib.nullcontext()
        )
        with reader:
            for attempt in range(MAX_RUNS):
                forced = kinds[(attempt + number) % 2] if attempt < 2 else None
                if chaos.one_run(forced=forced):
                    break
            else:
                pytest.fail(
                    f"round {number} did not drain in {MAX_RUNS} runs (seed {seed}): {tally.line()}"
                )
        if isinstance(reader, ViewReader):
            assert reader.partial_views == [], (
                f"the consistent view showed part of a batch (seed {seed}): "
                f"{reader.partial_views[:5]}"
            )
        check_exactly_once(tmp, pg_server, round_table, mode, chaos.view)
        print(f"\nchaos {mode} round {number} clean: {tally.line()}", flush=True)
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            if chaos.view:
                conn.execute(sql.SQL("DROP VIEW {}").format(sql.Identifier(chaos.view)))
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(round_table)))
    print(
        f"\nchaos {mode}: seed {seed}, rounds {number + 1}: {tally.line()}; "
        "duplicates 0, lost 0, orphans left 0"
    )
