"""Chaos: a stream drained through random, repeated, combined failures.

Each round writes a replayable source of numbered records and runs a real
driver process (its own Spark, ``tests/spark/crash_driver.py``) again and again
from one checkpoint until the source is drained. Every run draws its trouble:
a SIGKILL of the whole driver at a protocol step or at a random moment, the
sink's sessions terminated with ``pg_terminate_backend`` (mid-COPY and
mid-commit through fault points, and at random moments), a task that fails after
PREPARE on its first attempt, and PostgreSQL stopped with ``-m immediate`` and
started again (at a random moment of a run, and after a run died). Then, exactly: every record
once, nothing of the sink left prepared, every batch of Spark's commit log
complete in the sink's, and ``sqlsink status`` clean.

    pytest tests/chaos --chaos-rounds 20 --chaos-seed 7 -s --timeout 0   # a long run
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

from sqlsink.core.faults import POINTS
from tests.fix_pg import PgServer, prepared_transactions
from tests.spark.streams import decided_batches, query_id, write_records

pytestmark = [pytest.mark.spark, pytest.mark.crash]
REPO = Path(__file__).resolve().parents[2]
BATCHES, PER_BATCH = 6, 150
MAX_RUNS = 40  # a round's runs before it counts as stuck (most die on purpose)


@dataclass
class Tally:
    runs: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    postgres_crashes: int = 0
    crashes_mid_run: int = 0
    terminated: Counter[str] = field(default_factory=Counter)
    failed_runs: int = 0

    def line(self) -> str:
        kills = sum(self.kills.values())
        return (
            f"runs {self.runs}, kills {kills} {dict(self.kills)}, postgres crashes "
            f"{self.postgres_crashes} ({self.crashes_mid_run} mid-run), sessions terminated "
            f"{sum(self.terminated.values())} {dict(self.terminated)}, "
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
    # faults aim at the batches Spark has not committed yet: an armed fault fires
    done = tmp / "chk" / "commits"
    pending = [b for b in range(BATCHES) if not (done / str(b)).exists()] or [BATCHES - 1]
    faults: list[dict[str, Any]] = []
    kill_after: float | None = None
    if roll < 0.55:  # a kill at a protocol step of a pending batch
        point = rng.choice(POINTS)
        fault = {"point": point, "batch": rng.choice(pending[:3]), "action": "kill"}
        faults.append(fault)
    elif roll < 0.75:  # a kill at a random moment
        kill_after = rng.uniform(8, 30)
    if rng.random() < 0.3:  # a task that fails after PREPARE on its first attempt
        faults.append(
            {
                "point": "after_prepare",
                "batch": rng.choice(pending[:3]),
                "attempt": 0,
                "partition": rng.randrange(2),
                "action": "raise",
            }
        )
    if rng.random() < 0.25:  # a sink session cut with pg_terminate_backend, mid-COPY or mid-commit
        point = rng.choice(["mid_copy", "mid_commit"])
        faults.append(
            {
                "point": point,
                "batch": rng.choice(pending[:3]),
                "action": "terminate",
                "url": server.admin_url,
                "once": True,
            }
        )
    terminate_at = rng.uniform(10, 35) if rng.random() < 0.15 else None
    crash_at = rng.uniform(10, 35) if rng.random() < 0.1 else None
    driver = start_driver(tmp, server.url, table, faults, mode)
    tally.runs += 1
    stop = threading.Event()

    def trouble() -> None:
        started = time.monotonic()
        nonlocal terminate_at, crash_at
        while not stop.wait(0.2):
            elapsed = time.monotonic() - started
            if kill_after is not None and elapsed > kill_after:
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

    helper = threading.Thread(target=trouble, daemon=True)
    helper.start()
    code = driver.wait(timeout=600)
    stop.set()
    helper.join()
    stderr = driver.stderr.read() if driver.stderr else ""
    fired_log = tmp / "faults.json.fired"
    fired = (
        [json.loads(line) for line in fired_log.read_text().splitlines()]
        if fired_log.exists()
        else []
    )
    fired_log.unlink(missing_ok=True)
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
    if code != 0 and rng.random() < 0.35:
        server.crash_and_restart()
        tally.postgres_crashes += 1
    return code == 0


def source_batches(mode: str) -> list[list[dict[str, Any]]]:
    """append: numbered records, each once. upsert: every batch overlaps the next by a third
    of its keys with new values, so the final table holds each key's last version."""
    if mode == "append":
        return [
            [{"id": i, "payload": f"record {i}"} for i in range(b * PER_BATCH, (b + 1) * PER_BATCH)]
            for b in range(BATCHES)
        ]
    step = PER_BATCH * 2 // 3
    return [
        [
            {"id": i, "payload": f"batch {b}", "amount": float(b)}
            for i in range(b * step, b * step + PER_BATCH)
        ]
        for b in range(BATCHES)
    ]


def expected_table(mode: str, checkpoint: Path) -> dict[int, str]:
    """What a clean run over the same batches leaves: each key's payload from the last batch
    that wrote it, the files of each batch as Spark's source log records them."""
    files = {f"part-{n:05d}.json": batch for n, batch in enumerate(source_batches(mode))}
    final: dict[int, str] = {}
    logs = [p for p in (checkpoint / "sources" / "0").iterdir() if p.name.isdigit()]
    for log in sorted(logs, key=lambda p: int(p.name)):
        for line in log.read_text().splitlines()[1:]:  # after the version line
            for record in files[Path(json.loads(line)["path"]).name]:
                final[record["id"]] = record["payload"]
    return final


def check_exactly_once(tmp: Path, server: PgServer, table: str, mode: str) -> None:
    with psycopg.connect(server.url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(sql.Identifier(table))
        ).fetchall()
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
    rng = random.Random(f"{seed}-{mode}")
    tally = Tally()
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
        for _ in range(MAX_RUNS):
            if one_run(rng, tmp, pg_server, round_table, tally, mode):
                break
        else:
            pytest.fail(
                f"round {number} did not drain in {MAX_RUNS} runs (seed {seed}): {tally.line()}"
            )
        check_exactly_once(tmp, pg_server, round_table, mode)
        print(f"\nchaos {mode} round {number} clean: {tally.line()}", flush=True)
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(round_table)))
    print(
        f"\nchaos {mode}: seed {seed}, rounds {number + 1}: {tally.line()}; "
        "duplicates 0, lost 0, orphans left 0"
    )
