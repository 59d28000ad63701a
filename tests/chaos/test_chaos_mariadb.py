"""Chaos on MariaDB: a stream drained through random, repeated, combined failures, as
tests/chaos/test_chaos.py does on PostgreSQL (its drivers, sources and checks:
tests/chaos/drivers.py), against the private ``mariadbd`` of tests/fix_mariadb.py.

Each round writes a replayable source of numbered records and runs a real driver
process (its own Spark, ``tests/spark/crash_driver.py``, ``url=mariadb://...``) again
and again from one checkpoint until the source is drained. Every run draws its trouble:

- a SIGKILL of the whole driver at a protocol step (before the decision, between two
  ``XA COMMIT``s, after the decision, ...) or at a random moment;
- the sink's sessions cut: ``KILL CONNECTION`` of the session itself through the fault
  points (mid-load, mid-commit), and of every session of the sink's user from a root
  session on the private server at a random moment;
- a task that fails after ``XA PREPARE`` on its first attempt, under a master that
  retries tasks (``local[2,4]``): the retry adopts the prepared branch and goes on;
- ``mariadbd`` SIGKILLed and started again (at a random moment of a run, and after a run
  died, when the dead run's branches are mostly still prepared);
- a paused driver: frozen with SIGSTOP at a protocol step or at a random moment, a
  second run started on the same checkpoint (it fences the first), then the first
  resumed with SIGCONT: it must fail with the fenced error and change nothing;
- ``sqlsink recover`` (the real CLI on the MariaDB URL, without ``--force``) beside a
  live run: it must end within its ``--lock-timeout`` and a bound, name the holder
  when it refuses for the held lock, and never finish a branch of the live run (no
  rollback of an undecided one, no commit of a branch whose batch has no decision).

Rounds alternate between append and upsert mode (``mode=upsert`` on a table with a
primary key; every batch overlaps the next by a third of its keys with new values,
tests/chaos/drivers.py), starting from the seed's mode. Then, exactly: the table a
clean run leaves (append: every record once; upsert: each key's last version), none
of the sink's branches left in ``XA RECOVER``, Spark's commit log and the sink's
decisions naming the same batches, all complete, and ``sqlsink status`` exits 0. A
decided branch that a server crash lost must be reported as data loss by the next run
(``DataLossError``, naming batch and partition, every run again), never a silent gap:
the round then checks that the rows that differ from a clean run's are of the reported
batches only, counts them, and ends there (draining needs the operator).

Not on MariaDB (refused by the backend): the consistent view, so no reader beside the
round. The first run of every round is a paused one whose second run has a session cut
mid-load, is killed at a protocol step, has ``sqlsink recover`` beside it and is
followed by a server crash, so that the default single round has each kind of
trouble; in that quick default (``--chaos-rounds 1``, one round in the seed's mode: a
round takes 85-100 s on a loaded machine, both would exceed two minutes) the next run
has no trouble but ``sqlsink recover`` beside it and must drain (the first recover
mostly finds the paused driver holding the sink's lock and refuses; this one meets a
live run alone).

    pytest tests/chaos/test_chaos_mariadb.py --chaos-rounds 12 --chaos-seed 7 -s --timeout 0
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sqlsink.core.gid import Gid
from sqlsink.mariadb import xid
from tests.chaos.drivers import (
    BATCHES,
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
from tests.fix_mariadb import LOG_DB, SINK_USER, TARGET_DB, MariaServer
from tests.spark.streams import query_id, write_records

pytestmark = [pytest.mark.spark, pytest.mark.crash]
MAX_RUNS = 40  # a round's runs before it counts as stuck (most die on purpose)
RETRY_MASTER = "local[2,4]"
FENCING_LOCK_TIMEOUT = "5s"  # as on PostgreSQL: the second run's wait for a paused holder
PAUSE_REACH_S = 150.0
PAUSE_SLEEP_S = 5.0
ZOMBIE_WAIT_S = 60.0
PAUSE_P = 0.1
CRASH_AFTER_DEATH_P = 0.4  # mariadbd SIGKILLed after a run died (its branches prepared)
RUN_TIMEOUT_S = 600.0
CUT_WAIT_S = 30.0  # a cut at a random moment waits this long for a session of the sink
DATA_LOSS = "data loss: decided transaction(s) are neither prepared nor committed"
LOST_RE = re.compile(r"batch (\d+) partition (\d+) \(([^)]+)\)")
NO_TABLE = 1146  # ER_NO_SUCH_TABLE
RECOVER_P = 0.35  # sqlsink recover (the real CLI, without --force) beside a live run
RECOVER_LOCK_TIMEOUT_S = 10.0  # its --lock-timeout: a committer holds the sink lock
RECOVER_GRACE_S = 60.0  # its bound beyond that: start, survey, report (a loaded machine)
LIVE_ROLLBACK = "is undecided"  # a rollback for this reason of a live run's gid is a bug


@dataclass
class Tally:
    runs: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    server_crashes: int = 0
    crashes_mid_run: int = 0
    crashes_with_prepared: int = 0  # crashes while the sink had branches in XA RECOVER
    cut: Counter[str] = field(default_factory=Counter)  # sessions cut, by where
    cut_missed: int = 0  # random-moment cuts that found no session of the sink in time
    failed_runs: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # the error each failed run ended with
    retry_runs: int = 0
    retries_after_prepare: int = 0
    paused: Counter[str] = field(default_factory=Counter)
    zombies: Counter[str] = field(default_factory=Counter)
    data_loss_reports: int = 0  # runs that ended with DataLossError
    lost_branches: int = 0  # decided branches a crash lost (each reported loudly)
    lost_rows: int = 0
    recovers: Counter[str] = field(default_factory=Counter)  # recover's status beside a run
    recovers_waited: int = 0  # recovers that found the sink's lock held, and waited
    recovers_left_live: int = 0  # recovers that left branches of the live run
    recover_longest_s: float = 0.0

    def line(self) -> str:
        return (
            f"runs {self.runs}, driver kills {sum(self.kills.values())} {dict(self.kills)}, "
            f"server crashes {self.server_crashes} ({self.crashes_mid_run} mid-run, "
            f"{self.crashes_with_prepared} with the sink's branches prepared), sessions cut "
            f"{sum(self.cut.values())} {dict(self.cut)} ({self.cut_missed} random cuts found "
            f"none), runs failed otherwise {self.failed_runs}, runs with task retries "
            f"{self.retry_runs} (a failure after PREPARE in {self.retries_after_prepare}), "
            f"paused drivers {sum(self.paused.values())} {dict(self.paused)} "
            f"{dict(self.zombies)}, data loss reported {self.data_loss_reports} times "
            f"({self.lost_branches} branches, {self.lost_rows} rows), recover beside a live "
            f"run {sum(self.recovers.values())} {dict(self.recovers)} (waited for the lock "
            f"{self.recovers_waited}, left the live run's branches {self.recovers_left_live}, "
            f"longest {self.recover_longest_s:.0f} s)"
        )


# -- the server, as root sees it -------------------------------------------------------


def query(server: MariaServer, statement: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A statement in a root session of its own (never one of the sink's, which a cut ends)."""
    conn = server.connect(root=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def missing_table(exc: Exception) -> bool:
    return bool(exc.args) and exc.args[0] == NO_TABLE


def table_rows(server: MariaServer, table: str) -> list[tuple[int, str]]:
    try:
        found = query(server, f"SELECT id, payload FROM `{TARGET_DB}`.`{table}` ORDER BY id")
    except Exception as exc:  # a first run killed before it created the table
        if missing_table(exc):
            return []
        raise
    return [(int(i), str(p)) for i, p in found]


def decisions(server: MariaServer, sink_id: str | None) -> dict[int, tuple[list[str], bool]]:
    """batch -> (gids, complete): the sink's decisions."""
    if sink_id is None:
        return {}
    try:
        found = query(
            server,
            f"SELECT batch_id, gids, completed_at IS NOT NULL FROM `{LOG_DB}`.decisions "
            "WHERE sink_id = %s ORDER BY batch_id",
            (sink_id,),
        )
    except Exception as exc:  # a first run killed before it made the commit log
        if missing_table(exc):
            return {}
        raise
    return {int(b): (sorted(json.loads(g)), bool(c)) for b, g, c in found}


def runs_of(server: MariaServer, sink_id: str | None) -> dict[str, bool]:
    """run id -> superseded, from the runs registry."""
    if sink_id is None:
        return {}
    try:
        found = query(
            server,
            f"SELECT run_id, superseded_at IS NOT NULL FROM `{LOG_DB}`.runs WHERE sink_id = %s",
            (sink_id,),
        )
    except Exception as exc:
        if missing_table(exc):
            return {}
        raise
    return {str(r): bool(s) for r, s in found}


def branches(server: MariaServer, sink_id: str | None) -> list[Gid]:
    """The sink's prepared branches in XA RECOVER (every sink's when ``sink_id`` is None)."""
    found = [xid.from_recover_row(r) for r in query(server, "XA RECOVER")]
    return [g for g in found if g is not None and sink_id in (None, g.sink_id)]


def sink_sessions(server: MariaServer) -> int:
    found = query(
        server, "SELECT count(*) FROM information_schema.PROCESSLIST WHERE USER = %s", (SINK_USER,)
    )
    return int(found[0][0])


def cut_sink_sessions(server: MariaServer) -> int:
    """KILL CONNECTION of every session of the sink's user, from a root session."""
    conn = server.connect(root=True)
    cut = 0
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (SINK_USER,)
            )
            for (conn_id,) in cur.fetchall():
                try:
                    cur.execute(f"KILL CONNECTION {int(conn_id)}")
                    cut += 1
                except Exception:  # ended meanwhile (1094: unknown thread)
                    continue
    finally:
        conn.close()
    return cut


def sink_state(server: MariaServer, table: str, tmp: Path, zombie_runs: set[str]) -> dict[str, Any]:
    """What a fenced zombie must leave alone: the table, the decisions, the runs, the
    newest run, the prepared branches (but the zombie's own)."""
    sink_id = sink_of(tmp)
    newest = (
        query(server, f"SELECT newest_run FROM `{LOG_DB}`.sinks WHERE sink_id = %s", (sink_id,))
        if sink_id
        else []
    )
    return {
        "rows": table_rows(server, table),
        "decisions": decisions(server, sink_id),
        "newest run": newest,
        "runs": runs_of(server, sink_id),
        "prepared": sorted(
            str(g) for g in branches(server, sink_id) if g.run_id not in zombie_runs
        ),
    }


def crash(server: MariaServer, tally: Tally, sink_id: str | None) -> None:
    tally.crashes_with_prepared += bool(sink_id and branches(server, sink_id))
    server.kill_and_restart()
    tally.server_crashes += 1


# -- one run ---------------------------------------------------------------------------


@dataclass
class Trouble:
    faults: list[dict[str, Any]] = field(default_factory=list)
    master: str = "local[2]"
    kill_after: float | None = None
    cut_at: float | None = None
    crash_at: float | None = None
    crash_after: bool = False  # crash the server after the run, whatever it drew
    recover_at: list[float] = field(default_factory=list)  # sqlsink recover beside it

    def errors(self) -> bool:
        cut = any(f["action"] == "terminate" for f in self.faults)
        return cut or self.cut_at is not None or self.crash_at is not None


def draw_trouble(
    rng: random.Random,
    pending: list[int],
    url: str,
    forced: str | None,
    points: tuple[str, ...],
    number: int = 0,
) -> Trouble:
    """A run's trouble. ``forced="kill"`` (the second run of a round's first, paused run):
    a session cut mid-load of the first pending batch under a retrying master, a kill at
    a protocol step of a later batch (before the decision, mid-commit or after the
    decision, by round), and a server crash after it."""
    trouble = Trouble()
    if forced == "kill":
        point = ("before_decision", "mid_commit", "after_decision")[number % 3]
        later = pending[1:3] or pending  # (``pending``: the fresh batches, whose tasks write)
        trouble.faults += [
            {"point": point, "batch": rng.choice(later), "action": "kill"},
            {"point": "mid_copy", "batch": pending[0], "action": "terminate", "url": url,
             "once": True},
        ]  # fmt: skip
        trouble.master, trouble.crash_after = RETRY_MASTER, True
        trouble.recover_at = [rng.uniform(3, 12)]
        return trouble
    roll = rng.random()
    if roll < 0.6:  # a kill at a protocol step of a pending batch
        trouble.faults.append(
            {"point": rng.choice(points), "batch": rng.choice(pending[:3]), "action": "kill"}
        )
    elif roll < 0.75:
        trouble.kill_after = rng.uniform(8, 30)
    retry = rng.random() < 0.2
    if retry:  # a task that fails after XA PREPARE on its first attempt
        trouble.faults.append(
            {
                "point": "after_prepare",
                "batch": rng.choice(pending[:3]),
                "attempt": 0,
                "partition": rng.randrange(2),
                "action": "raise",
            }
        )
    if rng.random() < (0.7 if retry else 0.3):
        trouble.master = RETRY_MASTER
    if rng.random() < 0.25:  # the sink's own session cut, mid-load or mid-commit
        trouble.faults.append(
            {
                "point": rng.choice(["mid_copy", "mid_commit"]),
                "batch": rng.choice(pending[:3]),
                "action": "terminate",
                "url": url,
                "once": True,
            }
        )
    trouble.cut_at = rng.uniform(8, 30) if rng.random() < 0.2 else None
    trouble.crash_at = rng.uniform(8, 30) if rng.random() < 0.15 else None
    if rng.random() < RECOVER_P:
        trouble.recover_at = sorted(rng.uniform(4, 35) for _ in range(rng.choice([1, 2, 3])))
    return trouble


@dataclass
class Recover:
    """One ``sqlsink recover`` beside a live run."""

    process: subprocess.Popen[str]
    out: Path
    err: Path
    started: float  # time.time()


def last_error(stderr: str) -> str:
    """What a driver's run failed with, shortened: the first error of the sink, the
    database driver or an injected fault in its stderr, else its last exception line."""
    first = re.search(
        r"^((?:sqlsink|pymysql)[\w.]*(?:Error|Exception)|RuntimeError|DataLossError)\b[^\n]*",
        stderr,
        re.MULTILINE,
    )
    found = re.findall(r"^\S*(?:Error|Exception)\b[^\n]*", stderr, re.MULTILINE)
    line = first.group(0) if first else found[-1] if found else "(no exception line)"
    return re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", line)[:160]


class Round:
    """One source drained from one checkpoint, run after run."""

    def __init__(
        self,
        rng: random.Random,
        seed: int,
        tmp: Path,
        server: MariaServer,
        table: str,
        mode: str,
        tally: Tally,
        points: tuple[str, ...],
        number: int,
    ) -> None:
        self.rng, self.seed, self.tmp, self.server = rng, seed, tmp, server
        self.table, self.mode, self.tally = table, mode, tally
        self.points, self.round_number = points, number
        self.url = server.url()
        self.number = 0
        self.lost: list[tuple[int, int, str]] = []  # (batch, partition, gid) reported lost
        self.unexplained: list[str] = []  # runs that failed with no trouble to fail them

    def pending(self) -> list[int]:
        done = self.tmp / "chk" / "commits"
        return [b for b in range(BATCHES) if not (done / str(b)).exists()] or [BATCHES - 1]

    def fresh(self) -> list[int]:
        pending, made = self.pending(), decisions(self.server, sink_of(self.tmp))
        return [b for b in pending if b not in made] or pending

    def one_run(self, forced: str | None = None) -> bool:
        if forced == "calm":  # no trouble but recover beside it: it must drain
            drained = self.run(Trouble(recover_at=[self.rng.uniform(3, 10)]))
            assert drained or self.lost, f"a run without trouble did not drain: {self.tally.line()}"
            return drained
        if forced == "pause" or (forced is None and self.rng.random() < PAUSE_P):
            return self.paused_run(forced=forced == "pause")
        return self.run(draw_trouble(self.rng, self.pending(), self.url, None, self.points))

    def run(
        self, trouble: Trouble, options: dict[str, str] | None = None, zombie: bool = False
    ) -> bool:
        self.number += 1
        name = f"run-{self.number}"
        tally, server, tmp = self.tally, self.server, self.tmp
        runs_before = set(runs_of(server, sink_of(tmp)))
        driver = start_driver(
            tmp, self.url, self.table, trouble.faults, self.mode, name=name,
            master=trouble.master, options=options,
        )  # fmt: skip
        tally.runs += 1
        tally.retry_runs += trouble.master == RETRY_MASTER
        stop = threading.Event()
        helper_errors: list[BaseException] = []
        recovers: list[Recover] = []

        def helper() -> None:
            started = time.monotonic()
            cut_at, crash_at = trouble.cut_at, trouble.crash_at
            recover_at = list(trouble.recover_at)
            try:
                while not stop.wait(0.2):
                    elapsed = time.monotonic() - started
                    if trouble.kill_after is not None and elapsed > trouble.kill_after:
                        signal_session(driver.pid, signal.SIGKILL)
                        tally.kills["random moment"] += 1
                        return
                    if cut_at is not None and elapsed > cut_at:
                        # (a driver holds sessions only while it writes or commits: the
                        # cut waits up to CUT_WAIT_S for some, at the next tick each time)
                        cut = cut_sink_sessions(server)
                        tally.cut["random moment"] += cut
                        if cut or elapsed > cut_at + CUT_WAIT_S:
                            tally.cut_missed += not cut
                            cut_at = None
                    if (
                        crash_at is not None
                        and elapsed > crash_at
                        and (sink_sessions(server) or elapsed > crash_at + CUT_WAIT_S)
                    ):  # (while the sink works, as a cut: CUT_WAIT_S at most)
                        crash(server, tally, sink_of(tmp))
                        tally.crashes_mid_run += 1
                        crash_at = None
                    if recover_at and elapsed > recover_at[0]:
                        recover_at.pop(0)
                        if driver.poll() is None and (sink := sink_of(tmp)) is not None:
                            recovers.append(self.start_recover(sink, f"{name}-{len(recovers)}"))
            except BaseException as exc:  # raised in the test's thread below
                helper_errors.append(exc)

        thread = threading.Thread(target=helper, daemon=True)
        thread.start()
        try:
            code = driver.wait(timeout=RUN_TIMEOUT_S)
        finally:
            stop.set()
            thread.join()
            kill_session(driver)
        if helper_errors:
            raise helper_errors[0]
        stderr = (tmp / f"{name}.log").read_text(errors="replace")
        fired = fired_faults(tmp, name)
        for fault in fired:
            if fault["action"] == "terminate":
                tally.cut[fault["point"]] += 1
        if code == -signal.SIGKILL:
            kills = [f["point"] for f in fired if f["action"] == "kill"]
            if kills:
                tally.kills[kills[-1]] += 1
        elif code != 0:
            tally.failed_runs += 1
            assert "Traceback" in stderr or "Exception" in stderr, stderr[-3000:]
            tally.failures[last_error(stderr)] += 1
            if not trouble.errors() and not zombie and DATA_LOSS not in stderr:
                raised = [f for f in fired if f["action"] == "raise"]
                if not (raised and trouble.master != RETRY_MASTER):
                    self.unexplained.append(f"{name}: {last_error(stderr)} ({tmp / name}.log)")
        # this driver's runs: what registered while it ran (a paused zombie's before it)
        live = set(runs_of(server, sink_of(tmp))) - runs_before
        self.judge_recovers(recovers, live, stderr, trouble.errors())
        if DATA_LOSS in stderr:
            tally.data_loss_reports += 1
            self.lost = [(int(b), int(p), g) for b, p, g in LOST_RE.findall(stderr)]
            assert self.lost, self.failure("a data loss error that names no branch", stderr)
        assert "is no longer prepared" not in stderr, self.failure(
            "a live run's prepared branch was rolled back under it", stderr
        )
        retried = [
            f["batch"] for f in fired if (f["point"], f["action"]) == ("after_prepare", "raise")
        ]
        if retried and trouble.master == RETRY_MASTER:
            tally.retries_after_prepare += 1
            if not trouble.errors() and code != -signal.SIGKILL and not self.lost and not zombie:
                assert code == 0, self.failure(
                    "a task retried after a failure past XA PREPARE did not go on", stderr
                )
        if trouble.crash_after or (code != 0 and self.rng.random() < CRASH_AFTER_DEATH_P):
            crash(server, tally, sink_of(tmp))
        return code == 0

    def failure(self, what: str, stderr: str) -> str:
        return (
            f"{what} (seed {self.seed}, round {self.round_number}, run {self.number}, "
            f"{self.tmp}); {self.tally.line()}\n--- driver stderr (end) ---\n{stderr[-6000:]}"
        )

    # -- recover beside a live run ----------------------------------------------------------

    def start_recover(self, sink_id: str, name: str) -> Recover:
        out, err = self.tmp / f"recover-{name}.json", self.tmp / f"recover-{name}.log"
        command = [
            sys.executable, "-m", "sqlsink", "recover", "--url", self.url, "--sink-id", sink_id,
            "--lock-timeout", f"{RECOVER_LOCK_TIMEOUT_S:g}s", "--json",
        ]  # fmt: skip
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen(
                command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                text=True,
            )  # fmt: skip
        return Recover(process, out, err, time.time())

    def judge_recovers(
        self, recovers: list[Recover], live: set[str], stderr: str, errors: bool
    ) -> None:
        """Recover beside a live run: it ends within its lock timeout and a bound; a
        refusal for the held lock names the holder; resolving what dead runs left is fine;
        rolling back (or committing) a branch of the live run is not. ``errors``: the run's
        trouble may cut recover's session too (or restart mariadbd under it)."""
        for recover in recovers:
            try:
                recover.process.wait(timeout=RECOVER_LOCK_TIMEOUT_S + RECOVER_GRACE_S)
            except subprocess.TimeoutExpired:
                recover.process.kill()
                recover.process.wait()
                raise AssertionError(
                    self.failure(
                        f"sqlsink recover beside a live run did not end within "
                        f"{RECOVER_LOCK_TIMEOUT_S + RECOVER_GRACE_S:g} s of the test's wait "
                        f"({recover.err.read_text()[-2000:]})",
                        stderr,
                    )
                ) from None
            took = recover.out.stat().st_mtime - recover.started  # (its last write)
            self.tally.recover_longest_s = max(self.tally.recover_longest_s, took)
            answer = recover.out.read_text() + recover.err.read_text()
            assert took <= RECOVER_LOCK_TIMEOUT_S + RECOVER_GRACE_S, self.failure(
                f"sqlsink recover beside a live run took {took:.0f} s: {answer[-3000:]}", stderr
            )
            try:
                doc = json.loads(recover.out.read_text())
            except ValueError:
                doc = {"error": "no JSON document"}
            for sink in doc.get("sinks", []):
                self.tally.recovers[str(sink["status"])] += 1
                self.tally.recovers_waited += sink["lock"] == "held"
                if sink["status"] == "refused" and "still held after" in str(sink["message"]):
                    assert sink["lock_holders"] and "held by" in str(sink["message"]), self.failure(
                        f"sqlsink recover refused for the held lock without naming its "
                        f"holder: {json.dumps(sink)[:3000]}",
                        stderr,
                    )
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
                if a["run_id"] in live
                and (
                    (a["result"] == "rolled back" and LIVE_ROLLBACK in str(a["reason"]))
                    or (a["result"] == "committed" and not self.decided(a["batch_id"]))
                )
            ]
            assert not wrong, self.failure(
                f"sqlsink recover (without --force) finished the live run's branches "
                f"{[(a['gid'], a['result'], a['reason']) for a in wrong]}; recover's report: "
                f"{json.dumps(doc)[:3000]}",
                stderr,
            )

    def decided(self, batch: int | None) -> bool:
        """Whether the batch has a decision (committing its branch is then completion)."""
        return batch in decisions(self.server, sink_of(self.tmp))

    # -- a paused driver and a second run on the same checkpoint ---------------------------

    def paused_run(self, forced: bool) -> bool:
        tally, server, tmp, rng = self.tally, self.server, self.tmp, self.rng
        self.number += 1
        name = f"run-{self.number}-paused"
        runs_before = set(runs_of(server, sink_of(tmp)))
        faults: list[dict[str, Any]] = []
        if forced or rng.random() < 0.75:
            where = rng.choice(self.points)  # (weighted as kills are)
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
            where, pause_after = "random moment", rng.uniform(4, 14)
        zombie = start_driver(
            tmp, self.url, self.table, faults, self.mode, name=name,
            options={"lockTimeout": FENCING_LOCK_TIMEOUT},
        )  # fmt: skip
        tally.runs += 1
        started = time.monotonic()
        while True:
            if zombie.poll() is not None:
                return self.paused_run_ended(zombie)
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
            return self.paused_run_ended(zombie)
        tally.paused[where] += 1
        zombie_runs = set(runs_of(server, sink_of(tmp))) - runs_before
        try:
            batches = self.fresh() if forced else self.pending()
            trouble = draw_trouble(
                rng, batches, self.url, "kill" if forced else None, self.points, self.round_number
            )
            drained = self.run(trouble, options={"lockTimeout": FENCING_LOCK_TIMEOUT}, zombie=True)
            runs = runs_of(server, sink_of(tmp))
            fenced = bool(zombie_runs) and all(runs.get(r, False) for r in zombie_runs)
            if not fenced:
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

    def paused_run_ended(self, zombie: subprocess.Popen[str]) -> bool:
        code = kill_session(zombie)
        self.tally.zombies["ended before its pause"] += 1
        if code not in (0, None):
            self.tally.failed_runs += 1
        return code == 0


# -- the checks ------------------------------------------------------------------------


def check_exactly_once(server: MariaServer, tmp: Path, table: str, mode: str) -> None:
    rows = table_rows(server, table)
    ids = [i for i, _ in rows]
    clean = expected_table(mode, tmp / "chk")
    duplicates = len(ids) - len(set(ids))
    missing = sorted(set(clean) - set(ids))
    assert (duplicates, missing[:10]) == (0, []), f"{duplicates} duplicates, missing {missing[:10]}"
    assert ids == sorted(clean), f"keys beyond a clean run's: {sorted(set(ids) - set(clean))[:10]}"
    assert dict(rows) == clean, "the table differs from a clean run's"
    sink_id = query_id(tmp / "chk")
    assert [str(g) for g in branches(server, sink_id)] == [], "branches left in XA RECOVER"
    made = decisions(server, sink_id)
    spark_committed = {int(p.name) for p in (tmp / "chk" / "commits").iterdir() if p.name.isdigit()}
    assert spark_committed == set(made), f"commits/ {sorted(spark_committed)}, decided {made}"
    assert all(complete for _, complete in made.values()), f"incomplete decisions: {made}"
    status = subprocess.run(
        [sys.executable, "-m", "sqlsink", "status", "--url", server.url(), "--sink-id", sink_id],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert status.returncode == 0, status.stdout + status.stderr


def keys_of(mode: str, batches: set[int]) -> set[int]:
    return {r["id"] for b, batch in enumerate(source_batches(mode)) if b in batches for r in batch}


def check_loss_reported(chaos: Round) -> None:
    """A decided branch a crash lost: the next run reports it again (loud every time),
    and the rows that differ from a clean run's (missing, or an older version of the key
    in upsert mode) are of the reported batches only."""
    first = sorted(chaos.lost)
    chaos.lost = []
    chaos.run(Trouble())
    assert sorted(chaos.lost) == first, (
        f"the data loss {first} was not reported again by the next run: {chaos.lost}"
    )
    rows = table_rows(chaos.server, chaos.table)
    ids = [i for i, _ in rows]
    assert len(ids) == len(set(ids)), "duplicates beside a data loss"
    clean = expected_table(chaos.mode, chaos.tmp / "chk")
    found = dict(rows)
    differ = {k for k in set(clean) | set(found) if clean.get(k) != found.get(k)}
    lost_batches = {b for b, _, _ in first}
    assert differ, f"data loss reported ({first}) but the table is a clean run's"
    outside = differ - keys_of(chaos.mode, lost_batches)
    assert not outside, (
        f"rows differ outside the batches reported lost {sorted(lost_batches)}: "
        f"{sorted(outside)[:20]}"
    )
    # (what the loss leaves in XA RECOVER: nothing of the lost batches, it was resolved)
    left = [g for g in branches(chaos.server, query_id(chaos.tmp / "chk"))]
    assert all(g.batch_id not in lost_batches for g in left), left
    chaos.tally.lost_branches += len(first)
    chaos.tally.lost_rows += len(differ)


MODES = ("append", "upsert")


def test_chaos_mariadb(
    request: pytest.FixtureRequest, tmp_path: Path, mariadb_server: MariaServer
) -> None:
    """Rounds in both modes, alternating by round from the seed's: a long run
    (``--chaos-rounds N``) has both; the quick default (one round) has the seed's mode,
    so that it stays near two minutes on a loaded machine (a round takes 85-100 s)."""
    if mariadb_server.process is None:
        pytest.skip("only a server this run started can be crashed (SQLSINK_TEST_MARIADB_URL)")
    rounds = request.config.getoption("--chaos-rounds")
    seed = request.config.getoption("--chaos-seed")
    seed = seed if seed is not None else random.randrange(10**6)
    points = kill_points(request.config.getoption("--chaos-kill-weights"))
    rng = random.Random(f"{seed}-mariadb")
    tallies = {mode: Tally() for mode in MODES}
    rounds_of: Counter[str] = Counter()
    unexplained: list[str] = []
    started = time.monotonic()
    took: Counter[str] = Counter()
    base = f"c_{uuid.uuid4().hex[:8]}"
    for number in range(rounds):
        mode = MODES[(seed + number) % 2]
        tally, began = tallies[mode], time.monotonic()
        tmp = tmp_path / f"round-{number}"
        table = f"{base}_{number}"
        write_records(tmp / "src", source_batches(mode))
        if mode == "upsert":  # the key: the table's primary key
            query(
                mariadb_server,
                f"CREATE TABLE `{TARGET_DB}`.`{table}` (id BIGINT PRIMARY KEY, payload TEXT, "
                "ts DATETIME(6), amount DOUBLE)",
            )
        chaos = Round(rng, seed, tmp, mariadb_server, table, mode, tally, points, number)
        for attempt in range(MAX_RUNS):
            # (the quick default, one round: a calm run after the forced pause)
            calm = "calm" if rounds == 1 and attempt == 1 else None
            drained = chaos.one_run(forced="pause" if attempt == 0 else calm)
            if chaos.lost:
                check_loss_reported(chaos)
                break
            if drained:
                check_exactly_once(mariadb_server, tmp, table, mode)
                break
        else:
            pytest.fail(
                f"{mode} round {number} did not drain in {MAX_RUNS} runs (seed {seed}): "
                f"{tally.line()}"
            )
        unexplained += chaos.unexplained
        rounds_of[mode] += 1
        took[mode] += int(time.monotonic() - began)
        print(
            f"\nchaos mariadb round {number} ({mode}) "
            f"{'data loss reported' if chaos.lost else 'clean'} "
            f"({time.monotonic() - began:.0f} s): {tally.line()}",
            flush=True,
        )
    for mode in MODES:
        if not rounds_of[mode]:
            continue
        tally = tallies[mode]
        failures = "; ".join(f"{n} x {e}" for e, n in tally.failures.most_common())
        print(
            f"\nchaos mariadb {mode}: seed {seed}, rounds {rounds_of[mode]}, {took[mode]} s: "
            f"{tally.line()}; duplicates 0, lost rows {tally.lost_rows}, prepared left 0; "
            f"failures seen: {failures or 'none'}"
        )
    print(
        f"\nchaos mariadb: seed {seed}, rounds {rounds}, {time.monotonic() - started:.0f} s; "
        f"failed with no trouble to fail them: {unexplained or 'none'}"
    )
