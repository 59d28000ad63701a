"""``sqlsink recover`` and the sink lock after recovery moved into the core (core/recovery.py,
one take: ``locks.acquire_sink_lock``): who it ends, who it waits for, that it lets the
lock go on every path. Real sessions hold the lock; the real command line acts."""

from __future__ import annotations

from pathlib import Path

import psycopg

from sqlsink.postgres import locks, run_registry
from tests.pg.protocol import prepared_of
from tests.pg.test_checkpoint_check import new_run
from tests.pg.test_cli import sqlsink
from tests.pg.test_failover_leftovers import lost_batch_2, recover


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
        assert dry.code == 2 and "nothing was decided" in dry.json["error"]["message"]
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
    try:
        done = recover(pg_url, sink, "--commit-lost", "2", "--lock-timeout", "1")
        assert not alive(zombie)
    finally:
        zombie.close()
    assert done.code in (0, 1), done.out + done.err
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
        for args in ((), ("--dry-run",), ("--force", "--run-id", old.run)):
            res = sqlsink(
                "recover", "--url", pg_url, "--sink-id", sink, "--lock-timeout", "1", *args,
                "--json",
            )  # fmt: skip
            assert res.code != 0 or args == ("--dry-run",), (args, res.out, res.err)
            assert cli_lock_holders(pg_url) == [], args
            if args and args[0] == "--force":
                assert not alive(live)  # the run fenced: its session ended
            else:
                assert alive(live), args
    finally:
        live.close()
    done = recover(pg_url, sink, "--commit-lost", "2")  # the lost batch, committed
    assert done.code == 0 and prepared_of(pg_url, sink) == [], done.out + done.err
