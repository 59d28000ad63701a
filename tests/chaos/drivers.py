"""What both backends' chaos rounds share (tests/chaos/test_chaos.py for PostgreSQL,
tests/chaos/test_chaos_mariadb.py for MariaDB): the driver in a process session of its
own, frozen, resumed and killed; the source of numbered records and what a clean run
leaves of it; the protocol steps kills are drawn from."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlsink.core.faults import POINTS
from tests.spark.streams import query_id

REPO = Path(__file__).resolve().parents[2]
BATCHES, PER_BATCH = 6, 150


def start_driver(
    tmp: Path,
    url: str,
    table: str,
    faults: list[dict[str, Any]],
    mode: str,
    *,
    name: str,
    master: str = "local[2]",
    options: dict[str, str] | None = None,
    view: str | None = None,
) -> subprocess.Popen[str]:
    """A driver in a session of its own (``start_new_session``: its id is the pid);
    its faults in ``tmp/<name>.json``, its stderr in ``tmp/<name>.log``."""
    faults_file = tmp / f"{name}.json"
    faults_file.write_text(json.dumps(faults))
    Path(f"{faults_file}.fired").unlink(missing_ok=True)
    env = {**os.environ, "SQLSINK_FAULTS_FILE": str(faults_file)}
    extra = {**({"mode": "upsert"} if mode == "upsert" else {}), **(options or {})}
    if view is not None:
        extra["consistentView"] = view
    with open(tmp / f"{name}.log", "w") as log:  # a file: a pipe could fill and block it
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.spark.crash_driver",
                "--master",
                master,
                str(tmp / "src"),
                str(tmp / "chk"),
                url,
                table,
                *(f"{k}={v}" for k, v in extra.items()),
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
            start_new_session=True,
        )


def fired_faults(tmp: Path, name: str) -> list[dict[str, Any]]:
    log = tmp / f"{name}.json.fired"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def session_pids(session: int) -> list[int]:
    """Every process of a session (Linux /proc): the driver, its JVM, its Python workers."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session:  # after the name: state, ppid, pgrp, session
            found.append(int(entry))
    return found


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def signal_session(session: int, sig: signal.Signals) -> None:
    for pid in session_pids(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def freeze_session(session: int) -> bool:
    """SIGSTOP every process of the session, again until none is left running (a
    Python daemon may fork a worker meanwhile); False if the session is gone."""
    for _ in range(50):
        signal_session(session, signal.SIGSTOP)
        time.sleep(0.05)
        states = [process_state(p) for p in session_pids(session)]
        if not states:
            return False
        if all(s in "TtZX" for s in states):
            return True
    raise AssertionError(f"session {session} could not be frozen")


def kill_session(driver: subprocess.Popen[str]) -> int | None:
    """SIGKILL every process of the driver's session; the driver's exit code if it had
    ended before."""
    code = driver.poll()
    signal_session(driver.pid, signal.SIGKILL)
    driver.wait(timeout=60)
    return code


def sink_of(tmp: Path) -> str | None:
    """The sink id (the query id in the checkpoint's metadata), once a run started."""
    return query_id(tmp / "chk") if (tmp / "chk" / "metadata").exists() else None


def kill_points(weights: str | None) -> tuple[str, ...]:
    """The protocol steps a kill is drawn from: each of ``POINTS`` once, and a step
    named in ``--chaos-kill-weights`` ("mid_commit=4,after_decision=2") that many times."""
    weight = dict.fromkeys(POINTS, 1)
    for item in filter(None, (weights or "").split(",")):
        name, _, times = item.partition("=")
        assert name in weight and times.isdigit(), f"--chaos-kill-weights: {item!r}"
        weight[name] = int(times)
    return tuple(point for point in POINTS for _ in range(weight[point]))


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
