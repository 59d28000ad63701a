"""A driver paused while it holds the sink lock (issue 12 items 5 and 9), paused for
real with SIGSTOP: the next run is not stuck behind it, and nobody waits forever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest

from sqlsink.errors import TransientError
from tests.pg.protocol import Writer, ids_of, prepared_of

ROOT = Path(__file__).resolve().parents[2]


def paused_committer(
    url: str, table: str, sink: str, run: str, faults: Path
) -> subprocess.Popen[str]:
    """A driver of ``run`` that commits batch 1 and sleeps inside the commit, holding the
    sink lock (the fault point after the decision); the caller then SIGSTOPs it."""
    script = textwrap.dedent(
        f"""
        from tests.pg.protocol import Writer
        w = Writer({url!r}, {table!r}, {sink!r}, query_id="q", run={run!r})
        outcome = w.write(1, range(10, 15))
        print("prepared", flush=True)
        w.commit(1, [outcome])
        print("committed", flush=True)
        """
    )
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults), "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "prepared"
    return child


def wait_until(what: str, check: object, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def decided(url: str, sink: str, batch: int) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM sqlsink.decisions WHERE sink_id = %s AND batch_id = %s",
            (sink, batch),
        ).fetchone()
    return bool(row and row[0])


def lock_holder_pids(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(r[0]) for r in rows]


def test_a_paused_zombie_holding_the_sink_lock_is_ended_by_the_new_run(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    def after_its_decision() -> bool:  # paused in its sleep after the decision
        return bool(lock_holder_pids(pg_url)) and decided(pg_url, sink, 1)

    new_run_ends_a_paused_zombie(
        pg_url, keyed, sink, tmp_path, "after_decision", after_its_decision
    )


def new_run_ends_a_paused_zombie(
    url: str, table: str, sink: str, tmp_path: Path, point: str, reached: object
) -> None:
    """A zombie of run-a commits batch 1, sleeps at the fault ``point`` and is SIGSTOPped
    there once ``reached()``; run-b re-runs batch 1 and goes on within bounded time,
    ending the zombie's session; every row once, nothing prepared."""
    Writer(url, table, sink, query_id="q", run="run-a").batch(0, range(10))
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": point, "action": "sleep", "seconds": 8}]))
    zombie = paused_committer(url, table, sink, "run-a", faults)
    try:
        wait_until(f"the zombie at {point}", reached)
        os.kill(zombie.pid, signal.SIGSTOP)  # a GC pause, a VM stall
        new = Writer(url, table, sink, query_id="q", run="run-b", extra={"lockTimeout": "2s"})
        started = time.monotonic()
        new.batch(1, range(10, 15))  # Spark re-runs batch 1 (decided or not by the zombie)
        new.batch(2, range(15, 20))
        assert time.monotonic() - started < 15
        assert lock_holder_pids(url) == []  # the zombie's session was ended
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.wait(90)
    assert zombie.returncode != 0  # its connection is gone: it commits nothing more
    assert ids_of(url, table) == list(range(20))
    assert prepared_of(url, sink) == []


def test_a_paused_live_holder_is_waited_for_boundedly_and_named(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Not provably a fenced run's session: nobody ends it; the waiter stops in time."""
    Writer(pg_url, keyed, sink, query_id="q", run="run-a").batch(0, range(10))
    with psycopg.connect(
        pg_url, autocommit=True, application_name=f"sqlsink {sink} commit"
    ) as held:
        held.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"sqlsink:sink:{sink}",))
        holder_pid = held.info.backend_pid
        same = Writer(pg_url, keyed, sink, query_id="q", run="run-a", extra={"lockTimeout": "1s"})
        outcome = same.write(1, range(10, 15))
        started = time.monotonic()
        with pytest.raises(TransientError) as waited:
            same.commit(1, [outcome])
        assert time.monotonic() - started < 5
    message = str(waited.value)
    assert f"session pid {holder_pid}" in message and f"sqlsink {sink} commit" in message
    assert "pg_terminate_backend" in message and "lockTimeout" in message
    same.commit(1, [outcome])  # the holder is gone: the batch goes on
    assert ids_of(pg_url, keyed) == list(range(15))
    assert prepared_of(pg_url, sink) == []


def in_decision_transaction(url: str) -> bool:
    """A session is inside the decision's transaction: it inserted batch 1's row."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
            "AND query ILIKE 'INSERT INTO sqlsink.decisions%%'"
        ).fetchone()
    return bool(row and row[0])


def test_a_zombie_paused_inside_its_decision_transaction_does_not_block_the_new_run(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The zombie's decision transaction held the sink's row (its ON CONFLICT DO UPDATE;
    the foreign key's FOR KEY SHARE against the registration's FOR UPDATE), so the new
    run could not even register to fence it: every attempt ended at lockTimeout, until
    the zombie resumed or was killed (schema version 6 closed it)."""
    new_run_ends_a_paused_zombie(
        pg_url, keyed, sink, tmp_path, "in_decision", lambda: in_decision_transaction(pg_url)
    )
