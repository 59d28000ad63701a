"""Chaos: a stream drained through random, repeated, combined failures.

Each round writes a replayable source of numbered records and runs a real
driver process (its own Spark, ``tests/spark/crash_driver.py``) again and again
from one checkpoint until the source is drained. Every run draws its trouble:
a SIGKILL of the whole driver at a protocol step or at a random moment, the
sink's sessions terminated with ``pg_terminate_backend`` mid-run, a task that
fails after PREPARE on its first attempt, and, after a run died, PostgreSQL
stopped with ``-m immediate`` and started again. Then, exactly: every record
once, nothing of the sink left prepared, every batch of Spark's commit log
complete in the sink's, and ``sqlsink status`` clean.

    pytest tests/chaos --chaos-rounds 20 --chaos-seed 7 -s   # a long run
"""

from __future__ import annotations

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

from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import query_id, write_source

pytestmark = [pytest.mark.spark, pytest.mark.crash]
REPO = Path(__file__).resolve().parents[2]
BATCHES, PER_BATCH = 6, 150
POINTS = ["after_prepare", "before_decision", "after_decision", "mid_commit", "after_commit"]


@dataclass
class Tally:
    runs: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    postgres_crashes: int = 0
    terminated_sessions: int = 0
    failed_runs: int = 0

    def line(self) -> str:
        kills = sum(self.kills.values())
        return (
            f"runs {self.runs}, kills {kills} {dict(self.kills)}, postgres crashes "
            f"{self.postgres_crashes}, sessions terminated {self.terminated_sessions}, "
            f"runs failed otherwise {self.failed_runs}"
        )


def start_driver(tmp: Path, url: str, table: str, faults: list[dict[str, Any]], mode: str) -> Any:
    (tmp / "faults.json").write_text(json.dumps(faults))
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(tmp / "faults.json")}
    extra = ["mode=upsert"] if mode == "upsert" else []
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.spark.crash_driver",
            str(tmp / "src"),
            str(tmp / "chk"),
            url,
            table,
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def terminate_sink_sessions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'sqlsink %%' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(str(rows[0])) if rows else 0


def one_run(
    rng: random.Random, tmp: Path, server: PgServer, table: str, tally: Tally, mode: str
) -> bool:
    """One driver run with its drawn trouble; True when it drained the source."""
    roll = rng.random()
    faults: list[dict[str, Any]] = []
    kill_after: float | None = None
    if roll < 0.45:  # a kill at a protocol step of a random batch
        point = rng.choice(POINTS)
        fault = {"point": point, "batch": rng.randrange(BATCHES), "action": "kill"}
        faults.append(fault)
    elif roll < 0.65:  # a kill at a random moment
        kill_after = rng.uniform(8, 30)
    if rng.random() < 0.3:  # a task that fails after PREPARE on its first attempt
        faults.append(
            {
                "point": "after_prepare",
                "batch": rng.randrange(BATCHES),
                "attempt": 0,
                "partition": rng.randrange(2),
                "action": "raise",
            }
        )
    terminate_at = rng.uniform(10, 35) if rng.random() < 0.25 else None
    driver = start_driver(tmp, server.url, table, faults, mode)
    tally.runs += 1
    stop = threading.Event()

    def trouble() -> None:
        started = time.monotonic()
        while not stop.wait(0.2):
            elapsed = time.monotonic() - started
            if kill_after is not None and elapsed > kill_after:
                os.killpg(driver.pid, signal.SIGKILL)
                tally.kills["random moment"] += 1
                return
            if terminate_at is not None and elapsed > terminate_at:
                tally.terminated_sessions += terminate_sink_sessions(server.url)
                return

    helper = threading.Thread(target=trouble, daemon=True)
    helper.start()
    code = driver.wait(timeout=600)
    stop.set()
    helper.join()
    stderr = driver.stderr.read() if driver.stderr else ""
    if code == -signal.SIGKILL:
        fired = tmp / "faults.json.fired"
        if fired.exists() and '"kill"' in fired.read_text():
            tally.kills[json.loads(fired.read_text().splitlines()[-1])["point"]] += 1
        fired.unlink(missing_ok=True)
    elif code != 0:
        tally.failed_runs += 1
        assert "Traceback" in stderr or "Exception" in stderr, stderr[-3000:]
    if code != 0 and rng.random() < 0.35 and server.embedded is not None:
        server.crash_and_restart()
        tally.postgres_crashes += 1
    return code == 0


def check_exactly_once(tmp: Path, server: PgServer, table: str, mode: str) -> None:
    with psycopg.connect(server.url) as conn:
        ids = [
            int(str(r[0]))
            for r in conn.execute(
                sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table))
            )
        ]
        sink_id = query_id(tmp / "chk")
        decisions = dict(
            conn.execute(
                "SELECT batch_id, completed_at IS NOT NULL FROM sqlsink.decisions "
                "WHERE sink_id = %s",
                (sink_id,),
            ).fetchall()
        )
    expected = list(range(BATCHES * PER_BATCH))
    duplicates = len(ids) - len(set(ids))
    missing = sorted(set(expected) - set(ids))
    assert (duplicates, missing[:10]) == (0, []), f"{duplicates} duplicates, missing {missing[:10]}"
    assert ids == expected
    assert [g for g, _ in prepared_transactions(server.admin_url)] == [], "orphans left"
    spark_committed = {int(p.name) for p in (tmp / "chk" / "commits").iterdir() if p.name.isdigit()}
    assert spark_committed <= set(decisions), "a batch Spark committed has no decision"
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
    request: pytest.FixtureRequest, tmp_path: Path, pg_server: PgServer, table: str, mode: str
) -> None:
    rounds = request.config.getoption("--chaos-rounds")
    seed = request.config.getoption("--chaos-seed")
    seed = seed if seed is not None else random.randrange(10**6)
    rng = random.Random(f"{seed}-{mode}")
    tally = Tally()
    for number in range(rounds if mode == "append" else max(1, rounds // 2)):
        tmp = tmp_path / f"round-{number}"
        round_table = f"{table}_{number}"
        write_source(
            tmp / "src", [range(b * PER_BATCH, (b + 1) * PER_BATCH) for b in range(BATCHES)]
        )
        if mode == "upsert":
            with psycopg.connect(pg_server.url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (id bigint PRIMARY KEY, payload text, "
                        "ts timestamptz, amount double precision)"
                    ).format(sql.Identifier(round_table))
                )
        for _ in range(12):
            if one_run(rng, tmp, pg_server, round_table, tally, mode):
                break
        else:
            pytest.fail(f"round {number} did not drain in 12 runs (seed {seed}): {tally.line()}")
        check_exactly_once(tmp, pg_server, round_table, mode)
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(round_table)))
    print(
        f"\nchaos {mode}: seed {seed}, rounds {number + 1}: {tally.line()}; "
        "duplicates 0, lost 0, orphans left 0"
    )
