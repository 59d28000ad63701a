"""``sqlsink recover`` and the sink lock after recovery moved into the core (core/recovery.py,
one take: ``locks.acquire_sink_lock``): who it ends, who it waits for, that it lets the
lock go on every path. Real sessions hold the lock; the real command line acts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.gid import Gid
from sqlsink.core.model import NewDecision
from sqlsink.core.recovery import Done, Recovery
from sqlsink.core.resolution import Scope
from sqlsink.postgres import locks, run_registry
from sqlsink.postgres.backend import PostgresBackend
from tests.pg.protocol import Writer, ids_of, prepare_by_hand, prepared_of
from tests.pg.test_checkpoint_check import new_run
from tests.pg.test_cli import sqlsink
from tests.pg.test_failover_leftovers import lost_batch_2, recover
from tests.pg.test_paused_holder import decided, lock_holder_pids, paused_committer, wait_until

ROOT = Path(__file__).resolve().parents[2]


def cli_lock_holders(url: str) -> list[int]:
    """Sessions of the command line that still hold an advisory lock."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND a.application_name LIKE 'sqlsink%%recover%%'"
        ).fetchall()
    return [int(r[0]) for r in rows]


def fenced_zombie(url: str, sink: str, run: str) -> psycopg.Connection:
    """A session that holds the sink lock for ``run`` (recorded, as a committer records
    it), then ``run`` is fenced: the session is provably a fenced run's."""
    zombie = psycopg.connect(url, autocommit=True)
    assert locks.try_sink_lock(zombie, sink)
    run_registry.register_run(zombie, sink, run, 300.0, holds_lock=True)
    with psycopg.connect(url, autocommit=True) as operator:
        assert run_registry.fence_runs(operator, sink, [run]) == [run]
    return zombie


def alive(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def test_a_dry_run_of_commit_lost_ends_no_session(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """--dry-run changes nothing (its header says so): a fenced run's session that holds
    the sink lock is not ended by it, with --commit-lost as without."""
    old, _, lost = lost_batch_2(pg_url, keyed, sink, tmp_path / "chk")
    zombie = fenced_zombie(pg_url, sink, old.run)
    try:
        plain = recover(pg_url, sink, "--dry-run", "--lock-timeout", "1")
        assert alive(zombie), plain.out + plain.err
        dry = recover(pg_url, sink, "--commit-lost", "2", "--dry-run", "--lock-timeout", "1")
        assert alive(zombie), "a dry run ended a session: " + dry.out + dry.err
        # a held lock is a refusal (exit 1), as plain recover's and forget's
        (refused,) = dry.json["sinks"]
        assert dry.code == 1 and dry.json["error"] is None, dry.out + dry.err
        assert refused["status"] == "refused" and "nothing was decided" in refused["message"]
        assert prepared_of(pg_url, sink) == lost
        done = recover(pg_url, sink, "--commit-lost", "2", "--lock-timeout", "1")
        assert not alive(zombie)  # not a dry run: the fenced run's holder is ended
    finally:
        zombie.close()
    assert done.code == 0, done.out + done.err
    assert prepared_of(pg_url, sink) == [] and cli_lock_holders(pg_url) == []


def test_commit_lost_ends_a_fenced_holder_never_a_live_runs_committer(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """--commit-lost waits for a live run's committer and refuses, its session alive and
    the lock let go; a fenced run's holder is ended and the batch decided and committed."""
    old, _, lost = lost_batch_2(pg_url, keyed, sink, tmp_path / "chk")
    live = psycopg.connect(pg_url, autocommit=True)
    try:
        assert locks.try_sink_lock(live, sink)
        run_registry.register_run(live, sink, old.run, 300.0, holds_lock=True)
        refused = recover(pg_url, sink, "--commit-lost", "2", "--lock-timeout", "1")
        assert refused.code != 0 and "nothing was decided" in refused.out + refused.err
        assert alive(live)
        assert cli_lock_holders(pg_url) == []
    finally:
        live.close()
    newer = new_run(old)
    newer.write(3, range(30, 31))  # run-b registers: the old run is superseded
    zombie = fenced_zombie(pg_url, sink, "run-z")
    pid = zombie.info.backend_pid
    try:
        done = recover(pg_url, sink, "--commit-lost", "2", "--lock-timeout", "1")
        assert not alive(zombie)
    finally:
        zombie.close()
    assert done.code in (0, 1), done.out + done.err
    # the session it ended is in its report, as one --force ends (ended_sessions)
    (doc,) = done.json["sinks"]
    assert doc["ended_sessions"] == [pid] and doc["decided_batches"] == [2]
    assert any(f"ended session(s) pid {pid}" in w["message"] for w in done.json["warnings"])
    assert not set(lost) & set(prepared_of(pg_url, sink))
    assert cli_lock_holders(pg_url) == []


def test_recover_refused_by_a_live_committer_lets_every_lock_go(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A live holder: recover waits --lock-timeout, refuses (exit code 2 or 1), names the
    holder; afterwards no session of the command line holds anything."""
    old, _, _ = lost_batch_2(pg_url, keyed, sink, tmp_path / "chk")
    live = psycopg.connect(pg_url, autocommit=True, application_name=f"sqlsink {sink} commit")
    try:
        assert locks.try_sink_lock(live, sink)
        run_registry.register_run(live, sink, old.run, 300.0, holds_lock=True)
        dry_forced = ("--dry-run", "--force", "--run-id", old.run)
        for args in ((), ("--dry-run",), dry_forced, ("--force", "--run-id", old.run)):
            res = sqlsink(
                "recover", "--url", pg_url, "--sink-id", sink, "--lock-timeout", "1", *args,
                "--json",
            )  # fmt: skip
            assert res.code != 0 or args[0] == "--dry-run", (args, res.out, res.err)
            assert cli_lock_holders(pg_url) == [], args
            if args and args[0] == "--force":
                assert not alive(live)  # the run fenced: its session ended
            else:
                assert alive(live), args
    finally:
        live.close()
    done = recover(pg_url, sink, "--commit-lost", "2")  # the lost batch, committed
    assert done.code == 0 and prepared_of(pg_url, sink) == [], done.out + done.err


def decided_batch(url: str, table: str, sink: str, partitions: int) -> list[str]:
    """Batch 1 of a dead run decided, its ``partitions`` transactions left prepared."""
    gids = [
        prepare_by_hand(url, table, Gid(sink, 1, p, "run-dead", 100 + p), range(p * 10, p * 10 + 3))
        for p in range(partitions)
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        assert PostgresBackend(conn).insert_decision(
            NewDecision(sink, 1, gids, 3 * partitions, None, "run-dead")
        )
    return gids


def recover_process(url: str, sink: str, faults: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "sqlsink", "recover", "--url", url, "--sink-id", sink, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        start_new_session=True,
    )  # fmt: skip


def test_a_recover_killed_between_its_commit_prepareds_is_finished_by_the_next(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """SIGKILL after the first COMMIT PREPARED of a decided batch: its session ends and the
    lock with it; the next recover commits the rest, completes the batch, loses nothing."""
    gids = decided_batch(pg_url, keyed, sink, 3)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "mid_commit", "batch": 1, "action": "kill"}]))
    killed = recover_process(pg_url, sink, faults)
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert len(prepared_of(pg_url, sink)) == 2  # one committed, then killed
    deadline = time.monotonic() + 20
    while cli_lock_holders(pg_url):  # the server notices the closed connection
        assert time.monotonic() < deadline, "the killed recover's lock stayed held"
        time.sleep(0.1)
    again = recover(pg_url, sink)
    assert again.code == 0, again.out + again.err
    (doc,) = again.json["sinks"]
    assert doc["status"] == "recovered" and doc["committed"] == 2
    assert doc["completed_batches"] == [1]
    assert prepared_of(pg_url, sink) == [] and ids_of(pg_url, keyed) == [
        i for p in range(3) for i in range(p * 10, p * 10 + 3)
    ]
    assert set(gids) == {a["gid"] for a in again.json["actions"]} | set(gids[:1])


def test_a_transaction_finished_by_hand_while_recover_commits_is_already_finished(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A DBA runs COMMIT PREPARED of a gid the recover is about to commit: its result is
    "already finished", the batch is verified by its marker and completed, exit code 0."""
    gids = decided_batch(pg_url, keyed, sink, 2)
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps(
            [{"point": "mid_commit", "batch": 1, "action": "sleep", "seconds": 4, "once": True}]
        )
    )
    proc = recover_process(pg_url, sink, faults)
    deadline = time.monotonic() + 60
    while len(prepared_of(pg_url, sink)) != 1:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    with psycopg.connect(pg_url, autocommit=True) as dba:
        dba.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gids[1])))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    doc = json.loads(out)
    assert {a["gid"]: a["result"] for a in doc["actions"]} == {
        gids[0]: "committed",
        gids[1]: "already finished",
    }
    (sink_doc,) = doc["sinks"]
    assert sink_doc["completed_batches"] == [1] and sink_doc["status"] == "recovered"
    assert cli_lock_holders(pg_url) == []


def held_by(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    ).fetchone()
    return int(row[0]) if row else 0


def test_the_cores_recovery_lets_the_lock_go_on_an_error_and_records_a_loss(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """core/recovery.py on a session that stays open: an error between two COMMIT
    PREPAREDs lets the lock go (nothing held by the session after); a loss is a record
    (``loss``, what was done in ``finished``, no report), the lock let go too."""
    gids = decided_batch(pg_url, keyed, sink, 3)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "mid_commit", "batch": 1, "action": "raise"}]))
    monkeypatch.setenv("SQLSINK_FAULTS_FILE", str(faults))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        recovery = Recovery(PostgresBackend(conn), sink)
        assert recovery.lock(1).held and held_by(conn) == 1
        with pytest.raises(RuntimeError, match="injected fault at mid_commit"):
            recovery.finish(Scope.everything(frozenset()))
        assert held_by(conn) == 0
        monkeypatch.delenv("SQLSINK_FAULTS_FILE")
        with psycopg.connect(pg_url, autocommit=True) as dba:  # someone rolls one back
            dba.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gids[2])))
        assert recovery.lock(1).held
        done = recovery.finish(Scope.everything(frozenset()))
        assert held_by(conn) == 0
    assert done.report is None and done.failure is None and done.loss is not None
    assert done.loss.context["lost"] == [(1, gids[2])]
    assert dict(done.finished) == {gids[1]: Done.COMMITTED}
    assert prepared_of(pg_url, sink) == []


def test_two_recovers_at_once_take_turns(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A second recover while the first commits: with a short --lock-timeout it refuses
    (exit 1, the first named as the holder, nothing done); with the default it waits,
    then finds nothing to do. Neither leaves a lock or a transaction."""
    gids = decided_batch(pg_url, keyed, sink, 2)
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps([{"point": "mid_commit", "batch": 1, "action": "sleep", "seconds": 5}])
    )
    first = recover_process(pg_url, sink, faults)
    deadline = time.monotonic() + 60
    while len(prepared_of(pg_url, sink)) != 1:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    (holder,) = cli_lock_holders(pg_url)
    refused = recover(pg_url, sink, "--lock-timeout", "0.5")
    assert refused.code == 1, refused.out + refused.err
    (doc,) = refused.json["sinks"]
    assert doc["status"] == "refused" and [h["pid"] for h in doc["lock_holders"]] == [holder]
    assert doc["ended_sessions"] == [] and len(prepared_of(pg_url, sink)) == 1
    waited = recover(pg_url, sink)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, out + err
    assert waited.code == 0, waited.out + waited.err
    assert waited.json["sinks"][0]["status"] == "nothing to do"
    assert prepared_of(pg_url, sink) == [] and cli_lock_holders(pg_url) == []
    assert {a["gid"]: a["result"] for a in json.loads(out)["actions"]} == dict.fromkeys(
        gids, "committed"
    )


def test_recover_ends_a_sigstopped_zombie_of_a_superseded_run_never_the_live_run(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A driver of run-a paused (SIGSTOP) after its decision of batch 1, holding the lock;
    run-b started since (run-a superseded) and has batch 2 in flight. ``recover`` ends
    the zombie's session (ended_sessions), commits batch 1, leaves run-b's batch 2; the
    zombie, resumed, commits nothing; run-b's commit goes on."""
    Writer(pg_url, keyed, sink, query_id="q", run="run-a").batch(0, range(10))
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "after_decision", "action": "sleep", "seconds": 8}]))
    zombie = paused_committer(pg_url, keyed, sink, "run-a", faults)
    try:
        wait_until("the zombie after its decision", lambda: decided(pg_url, sink, 1))
        os.kill(zombie.pid, signal.SIGSTOP)
        (zombie_pid,) = lock_holder_pids(pg_url)
        newer = Writer(pg_url, keyed, sink, query_id="q", run="run-b", extra={"lockTimeout": "2s"})
        in_flight = newer.write(2, range(15, 20))  # ends the zombie too, or leaves it to us
        done = recover(pg_url, sink, "--lock-timeout", "1")
        (doc,) = done.json["sinks"]
        assert done.code == 1, done.out + done.err  # run-b's batch is left for its commit
        assert doc["live_runs"] == ["run-b"]
        assert doc["ended_sessions"] in ([zombie_pid], [])  # [] when run-b's task ended it
        assert lock_holder_pids(pg_url) == []
        assert prepared_of(pg_url, sink) == [in_flight.gid]
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.wait(90)
    assert zombie.returncode != 0
    newer.commit(2, [in_flight])
    assert ids_of(pg_url, keyed) == [*range(15), *range(15, 20)]
    assert prepared_of(pg_url, sink) == []


def test_force_with_commit_lost_fences_before_it_decides(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The night's one command: the run that lost batch 2's decision is stuck holding the
    sink lock; ``--force --run-id RUN --commit-lost 2`` fences it, ends its session and
    commits batch 2, rather than waiting for the lock it is about to free and refusing
    ("stop the query first")."""
    old, _, lost = lost_batch_2(pg_url, keyed, sink, tmp_path / "chk")
    stuck = psycopg.connect(pg_url, autocommit=True)
    pid = stuck.info.backend_pid
    try:
        assert locks.try_sink_lock(stuck, sink)
        run_registry.register_run(stuck, sink, old.run, 300.0, holds_lock=True)
        done = recover(
            pg_url, sink, "--force", "--run-id", old.run, "--commit-lost", "2",
            "--lock-timeout", "1",
        )  # fmt: skip
        ended = not alive(stuck)
    finally:
        stuck.close()
        if set(lost) & set(prepared_of(pg_url, sink)):  # as the operator must now: twice
            recover(pg_url, sink, "--force", "--run-id", old.run)
            recover(pg_url, sink, "--commit-lost", "2")
    assert ended and done.code == 0, done.out + done.err
    (doc,) = done.json["sinks"]
    assert doc["fenced_runs"] == [old.run] and doc["ended_sessions"] == [pid]
    assert doc["decided_batches"] == [2] and doc["committed"] == 2


def test_commit_lost_with_the_lock_held_is_a_refusal_naming_the_holder(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """--commit-lost while a session holds the sink's lock past --lock-timeout: refused
    (exit 1, as plain recover and forget refuse a held lock), the holder named by its pid
    and the fix that ends it (pg_terminate_backend of that pid); nothing decided or done."""
    _, _, lost = lost_batch_2(pg_url, keyed, sink, tmp_path / "chk")
    holder = psycopg.connect(pg_url, autocommit=True, application_name="a holder")
    try:
        assert locks.try_sink_lock(holder, sink)
        pid = holder.info.backend_pid
        done = recover(pg_url, sink, "--commit-lost", "2", "--lock-timeout", "500ms")
        assert alive(holder)
    finally:
        holder.close()
    text = done.out + done.err
    assert done.code == 1, (done.code, text)
    assert done.json["error"] is None and done.json["commit_lost"] == [2], text
    (doc,) = done.json["sinks"]
    assert doc["status"] == "refused" and doc["decided_batches"] == [], doc
    assert doc["lock"] == "held" and [s["pid"] for s in doc["lock_holders"]] == [pid], doc
    assert "still held after 0.5s" in doc["message"] and f"pid {pid}" in doc["message"], doc
    assert "nothing was decided" in doc["message"], doc
    (refusal,) = [w for w in done.json["warnings"] if w["message"] == doc["message"]]
    assert f"pg_terminate_backend({pid})" in refusal["fix"], refusal
    assert "--commit-lost 2" in refusal["fix"], refusal  # the command to run again
    assert prepared_of(pg_url, sink) == lost and not decided(pg_url, sink, 2)
    assert cli_lock_holders(pg_url) == []
    again = recover(pg_url, sink, "--commit-lost", "2", "--lock-timeout", "1")  # lock free
    assert again.code == 0 and prepared_of(pg_url, sink) == [], again.out + again.err
