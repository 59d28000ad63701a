"""The ``sqlsink`` command line against a real PostgreSQL, run as a user runs it.

Leftovers are made the way the sink makes them: partition transactions prepared
by hand (rows + marker + PREPARE TRANSACTION), decisions written with
``PostgresBackend.insert_decision``; plus prepared transactions that are not the
sink's (another application's, a look-alike gid, another sink's, another
database's), which must survive every command. Each test works in a database of
its own, so "every sink" means the test's sinks only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink import cli
from sqlsink.checkpoint.parse import read_checkpoint
from sqlsink.checkpoint.relation import DecisionState, relate
from sqlsink.cli import recover as cli_recover
from sqlsink.core.gid import Gid
from sqlsink.core.model import NewDecision
from sqlsink.postgres import run_registry
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.locks import lock_key
from sqlsink.postgres.schema import ensure_schema, latest_version
from tests.fix_pg import PgServer, prepared_transactions

RUN = "run-1"
ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-pw"
Conn = psycopg.Connection[tuple[Any, ...]]


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.out)
        return doc

    def actions(self) -> dict[str, tuple[str, bool]]:
        return {a["gid"]: (a["action"], a["done"]) for a in self.json["actions"]}


def sqlsink(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
    """Run the command line as a user does: a new process, ``python -m sqlsink``."""
    proc = subprocess.run(
        [sys.executable, "-m", "sqlsink", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def sqlsink_parallel(commands: list[list[str]], env: dict[str, str]) -> list[Result]:
    """Several read-only runs at once (each one spends most of its time starting Python)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sqlsink", *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **env},
        )
        for args in commands
    ]  # fmt: skip
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        results.append(Result(proc.returncode, out, err))
    return results


# -- fixtures -----------------------------------------------------------------------------


@dataclass
class Db:
    name: str
    url: str
    server: PgServer

    def connect(self) -> Conn:
        return psycopg.connect(self.url, autocommit=True)

    def gids(self) -> set[str]:
        return {g for g, d in prepared_transactions(self.server.admin_url) if d == self.name}


def _drop_database(server: PgServer, name: str) -> None:
    for gid, database in prepared_transactions(server.admin_url):
        if database == name:
            with psycopg.connect(server.db_url(name), autocommit=True) as conn:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def bare_db(pg_server: PgServer) -> Iterator[Db]:
    """A database of the test's own, without the sqlsink schema."""
    name = f"cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield Db(name, pg_server.db_url(name), pg_server)
    finally:
        _drop_database(pg_server, name)


@pytest.fixture
def db(bare_db: Db) -> Db:
    """A database of the test's own with the sqlsink schema and a target table ``t``."""
    with bare_db.connect() as conn:
        ensure_schema(conn)
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
    return bare_db


@pytest.fixture
def other_db(pg_server: PgServer) -> Iterator[Db]:
    name = f"cli_other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield Db(name, pg_server.db_url(name), pg_server)
    finally:
        _drop_database(pg_server, name)


# -- making leftovers ---------------------------------------------------------------------


def prepare(
    db: Db, sink: str, batch: int, partition: int, ids: range, run: str = RUN, attempt: int = 0
) -> str:
    """One partition transaction, as the partition writer does it, left prepared."""
    gid = str(Gid(sink, batch, partition, run, attempt or batch * 100 + partition))
    with db.connect() as conn:
        conn.execute("BEGIN")
        with conn.cursor() as cur, cur.copy("COPY t (id) FROM STDIN") as copy:
            for i in ids:
                copy.write_row((i,))
        conn.execute(
            "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
            "VALUES (%s, %s, %s, %s, %s)",
            (gid, sink, batch, partition, len(ids)),
        )
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    return gid


def prepare_foreign(db: Db, gid: str) -> str:
    """Another application's prepared transaction (an empty one)."""
    with db.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    return gid


def decide(
    db: Db, sink: str, batch: int, gids: list[str], rows: int, query: str | None = "q1"
) -> None:
    with db.connect() as conn:
        assert PostgresBackend(conn).insert_decision(
            NewDecision(sink, batch, gids, rows, query, RUN)
        )


def ids_in(db: Db) -> list[int]:
    with db.connect() as conn:
        return [int(r[0]) for r in conn.execute("SELECT id FROM t ORDER BY id")]


def decisions_of(db: Db) -> list[tuple[str, int, bool]]:
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT sink_id, batch_id, completed_at IS NOT NULL FROM sqlsink.decisions "
            "ORDER BY 1, 2"
        ).fetchall()
    return [(str(s), int(b), bool(c)) for s, b, c in rows]


@dataclass
class Scene:
    """Sink "a": batch 4 decided (partitions 0 and 1), an orphan attempt of batch 4, batch 5
    prepared but undecided. Sink "b": batch 0 undecided. Foreign: another application's
    gid, a look-alike of sink a's, sink a's gid in another database."""

    commit: list[str]
    rollback: list[str]
    b_gid: str
    foreign: list[str]


def scene(db: Db, other: Db) -> Scene:
    p0 = prepare(db, "a", 4, 0, range(0, 5))
    p1 = prepare(db, "a", 4, 1, range(5, 10))
    orphan = prepare(db, "a", 4, 0, range(100, 105), attempt=777)  # a denied attempt
    undecided = prepare(db, "a", 5, 0, range(200, 205))
    # a batch load's sink (bound to no streaming query): its undecided leftover of batch 5
    # is rolled back (a streaming sink's would be kept unless a checkpoint shows no commits/5)
    decide(db, "a", 4, [p0, p1], 10, query=None)
    b_gid = prepare(db, "b", 0, 0, range(300, 302))
    foreign = [
        prepare_foreign(db, f"app_tx_{uuid.uuid4().hex[:6]}"),
        prepare_foreign(db, "sqlsink_a_9_0"),  # our prefix, not our shape
        prepare_foreign(other, str(Gid("a", 4, 0, RUN, 1))),  # our shape, another database
    ]
    return Scene([p0, p1], [orphan, undecided], b_gid, foreign)


def cleanup(server: PgServer, gids: list[str]) -> None:
    for gid, database in prepared_transactions(server.admin_url):
        if gid in gids:
            with psycopg.connect(server.db_url(database), autocommit=True) as conn:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


# -- recover ------------------------------------------------------------------------------


def test_dry_run_shows_the_plan_and_changes_nothing(db: Db, other_db: Db) -> None:
    s = scene(db, other_db)
    try:
        before = (db.gids(), other_db.gids(), decisions_of(db), ids_in(db))
        result = sqlsink("recover", "--url", db.url, "--dry-run", "--json")
        assert result.code == 1, result.err  # something left to do
        doc = result.json
        assert doc["dry_run"] is True and doc["database"] == db.name
        assert {x["sink_id"]: x["status"] for x in doc["sinks"]} == {"a": "planned", "b": "planned"}
        actions = {a["gid"]: a for a in doc["actions"]}
        for gid in s.commit:
            assert actions[gid]["action"] == "commit" and actions[gid]["done"] is False
            assert actions[gid]["reason"] == "batch 4 is decided"
        assert actions[s.rollback[0]]["reason"] == "batch 4 is decided without this attempt"
        assert actions[s.rollback[1]]["reason"] == "batch 5 is undecided"
        assert actions[s.b_gid]["action"] == "rollback"
        for gid in s.foreign:
            assert actions[gid]["action"] == "leave", gid
        assert actions[s.foreign[2]]["database"] == other_db.name
        assert actions[s.foreign[2]]["reason"] == f"in database {other_db.name}"
        p1 = actions[s.commit[1]]
        assert (p1["sink_id"], p1["batch_id"], p1["partition_id"], p1["owner"]) == (
            "a",
            4,
            1,
            "postgres",
        )
        assert 0 <= p1["age_seconds"] < 60
        assert (db.gids(), other_db.gids(), decisions_of(db), ids_in(db)) == before

        human = sqlsink("recover", "--url", db.url, "--dry-run")
        assert human.code == 1
        assert "dry run" in human.out
        line = next(x for x in human.out.splitlines() if x.startswith(s.commit[0]))
        assert line.split()[1:4] == ["a", "4", "0"] and "would commit" in line
        assert (db.gids(), other_db.gids(), decisions_of(db), ids_in(db)) == before
    finally:
        cleanup(db.server, s.foreign)


def test_recover_every_sink_acts_and_leaves_foreign_transactions(db: Db, other_db: Db) -> None:
    s = scene(db, other_db)
    try:
        result = sqlsink("recover", "--url", db.url, "--json")
        assert result.code == 0, result.out + result.err
        doc = result.json
        acted = {gid: (a, done) for gid, (a, done) in result.actions().items()}
        assert all(acted[g] == ("commit", True) for g in s.commit)
        assert all(acted[g] == ("rollback", True) for g in [*s.rollback, s.b_gid])
        assert all(acted[g] == ("leave", False) for g in s.foreign)
        sink_a = next(x for x in doc["sinks"] if x["sink_id"] == "a")
        assert sink_a["status"] == "recovered" and sink_a["completed_batches"] == [4]
        assert (sink_a["committed"], sink_a["rolled_back"]) == (2, 2)
        assert ids_in(db) == list(range(10))  # batch 4 only: orphan, batch 5, sink b rolled back
        assert db.gids() | other_db.gids() == set(s.foreign)  # foreign ones untouched
        assert decisions_of(db) == [("a", 4, True)]
        # a second run finds nothing of the sinks' to do
        again = sqlsink("recover", "--url", db.url)
        assert again.code == 0, again.out + again.err
        assert "result: 0 committed, 0 rolled back" in again.out
        assert "not a sqlsink transaction" in again.out  # the foreign ones are listed, left
    finally:
        cleanup(db.server, s.foreign)


def test_recover_one_sink_leaves_the_other_sinks(db: Db, other_db: Db) -> None:
    s = scene(db, other_db)
    try:
        result = sqlsink("recover", "--url", db.url, "--sink-id", "a")
        # exit 1: sink a also has a gid in another database, which is said (and left)
        assert result.code == 1, result.out + result.err
        assert "WARNING: sink a: 1 prepared transaction(s) of sink a are in database" in result.out
        untouched = result.out.split("left untouched")[1]
        b_line = next(x for x in untouched.splitlines() if x.startswith(s.b_gid))
        assert "belongs to sink b" in b_line
        assert db.gids() == {s.b_gid, *s.foreign[:2]}
        # sink a has a gid in another database: it is said, and not touched
        assert f"in database {other_db.name}" in result.out
        assert other_db.gids() == {s.foreign[2]}
    finally:
        cleanup(db.server, [*s.foreign, s.b_gid])


def test_data_loss_is_exit_3_naming_batch_and_partition(db: Db) -> None:
    p0 = prepare(db, "a", 2, 0, range(0, 5))
    p1 = prepare(db, "a", 2, 1, range(5, 10))
    decide(db, "a", 2, [p0, p1], 10)
    with db.connect() as conn:  # someone rolls back a decided transaction
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(p1)))

    dry = sqlsink("recover", "--url", db.url, "--dry-run", "--json")
    assert dry.code == 3, dry.out + dry.err
    assert dry.json["data_loss"] == [{"sink_id": "a", "batch_id": 2, "partition_id": 1, "gid": p1}]
    assert db.gids() == {p0}

    real = sqlsink("recover", "--url", db.url)
    assert real.code == 3, real.out + real.err
    assert "DATA LOSS" in real.out and "batch 2 partition 1" in real.out and p1 in real.out
    assert "result: 1 committed, 0 rolled back" in real.out  # the rest of batch 2 was done
    assert ids_in(db) == list(range(5))  # the rest of the batch was still committed
    assert decisions_of(db) == [("a", 2, False)]  # stays incomplete: reported every time

    status = sqlsink("status", "--url", db.url, "--json")
    assert status.code == 3
    assert status.json["data_loss"] == [
        {"sink_id": "a", "batch_id": 2, "partition_id": 1, "gid": p1}
    ]
    again = sqlsink("recover", "--url", db.url, "--json")
    assert again.code == 3 and again.json["data_loss"][0]["gid"] == p1


# -- liveness -----------------------------------------------------------------------------


def advisory_waiters(db: Db) -> int:
    with db.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_recover_waits_for_the_sink_lock_and_refuses_when_it_stays_held(db: Db) -> None:
    gid = prepare(db, "a", 0, 0, range(3))  # of a run the commit log does not know: dead
    with db.connect() as holder:  # a committer of sink a in the middle of a commit
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (lock_key("a"),))
        pid = holder.info.backend_pid
        refused = sqlsink(
            "recover", "--url", db.url, "--sink-id", "a", "--lock-timeout", "0.5s", "--json"
        )
        assert refused.code == 1, refused.out + refused.err
        sink = refused.json["sinks"][0]
        assert sink["status"] == "refused" and sink["lock"] == "held"
        assert sink["live"] is False  # a held lock is evidence, not liveness
        assert [s["pid"] for s in sink["lock_holders"]] == [pid]
        assert refused.actions()[gid] == ("rollback", False)
        warning = refused.json["warnings"][0]
        assert "still held after 0.5s" in warning["message"] and f"pid {pid}" in warning["message"]
        assert "--force --run-id" in warning["fix"] and "pg_terminate_backend" in warning["fix"]
        assert db.gids() == {gid}

        # recover takes turns with the committer: it waits for the commit to end, then acts
        command = ["recover", "--url", db.url, "--sink-id", "a"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqlsink", *command],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        # until its session waits for the lock (a fixed sleep lost to a slow start under load)
        deadline = time.monotonic() + 60
        while not advisory_waiters(db):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "recover never waited for the sink's lock"
            time.sleep(0.05)
        assert db.gids() == {gid}
        holder.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (lock_key("a"),))
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    assert "waiting up to 30s for the sink's lock" in err
    assert db.gids() == set() and ids_in(db) == []


def test_a_connected_session_is_evidence_not_liveness(db: Db) -> None:
    """Issue 12 item 7: liveness is the runs registry's. A session named like the sink's
    task (here: a leftover connection of a run that is gone) no longer makes recover
    refuse the sink; it is shown, and the dead run's leftover is resolved."""
    gid = prepare(db, "a", 3, 0, range(3))
    task_name = "sqlsink sink a, batch 4, partition 0"
    with psycopg.connect(db.url, autocommit=True, application_name=task_name) as task:
        result = sqlsink("recover", "--url", db.url, "--json")
        assert result.code == 0, result.out + result.err
        (sink,) = result.json["sinks"]
        assert sink["live"] is False and sink["live_runs"] == []
        assert [s["pid"] for s in sink["sessions"]] == [task.info.backend_pid]
        assert result.actions()[gid] == ("rollback", True)
    assert db.gids() == set()


def test_force_is_refused_without_the_runs_it_declares_dead(db: Db) -> None:
    gid = prepare(db, "a", 3, 0, range(3))
    no_run = sqlsink("recover", "--url", db.url, "--sink-id", "a", "--force")
    assert no_run.code == 2 and "--force needs --run-id RUN" in no_run.err
    no_force = sqlsink("recover", "--url", db.url, "--sink-id", "a", "--run-id", "r")
    assert no_force.code == 2 and "add --force" in no_force.err
    no_sink = sqlsink("recover", "--url", db.url, "--force", "--run-id", "r", "--json")
    assert no_sink.code == 2 and "--sink-id" in no_sink.json["error"]["fix"]
    unknown = sqlsink("recover", "--url", db.url, "--sink-id", "a", "--force", "--run-id", "r")
    assert unknown.code == 2 and "sink a has no run r in its commit log" in unknown.err
    assert db.gids() == {gid}  # nothing was done
    cleanup(db.server, [gid])


def test_commit_lost_and_mark_skipped_are_refused_without_one_sink_or_when_both_name_a_batch(
    db: Db,
) -> None:
    gid = prepare(db, "a", 3, 0, range(3))
    both = sqlsink(
        "recover", "--url", db.url, "--sink-id", "a", "--commit-lost", "3", "--mark-skipped", "3"
    )
    assert both.code == 2 and "batch 3 is named by both --commit-lost and --mark-skipped" in (
        both.err
    )
    negative = sqlsink("recover", "--url", db.url, "--sink-id", "a", "--commit-lost", "-1")
    assert negative.code == 2 and "'-1' is not a batch id" in negative.err
    no_sink = sqlsink("recover", "--url", db.url, "--commit-lost", "3", "--json")
    assert no_sink.code == 2, no_sink.out + no_sink.err
    assert "decide batches of one sink" in no_sink.json["error"]["message"]
    assert "--sink-id" in no_sink.json["error"]["fix"]
    assert db.gids() == {gid}  # nothing was done
    cleanup(db.server, [gid])


# -- status -------------------------------------------------------------------------------


def test_status_names_the_tables_a_sink_writes(db: Db) -> None:
    """Issue 15: a sink was known only by its query id. Each decision records the tables
    its batch wrote (schema 8); status shows the newest decision's, [] for a sink whose
    decisions predate it."""
    with db.connect() as conn:
        backend = PostgresBackend(conn)
        assert backend.insert_decision(
            NewDecision("old", 0, [], 0, "q-old", RUN)
        )  # no tables recorded
        assert backend.insert_decision(
            NewDecision("two", 0, [], 0, "q-two", RUN, tables=["public.t"])
        )
        tables = ["public.orders", "sales.order_lines"]
        assert backend.insert_decision(NewDecision("two", 1, [], 0, "q-two", RUN, tables=tables))
    doc = sqlsink("status", "--url", db.url, "--json").json
    by_sink = {s["sink_id"]: s for s in doc["sinks"]}
    assert by_sink["old"]["tables"] == []
    assert by_sink["two"]["tables"] == ["public.orders", "sales.order_lines"]
    human = sqlsink("status", "--url", db.url, "--sink-id", "two", "--batches", "1")
    assert "public.orders, sales.order_lines" in human.out
    assert "TABLES" in human.out


def test_status_reports_batches_prepared_transactions_and_old_ones(db: Db, other_db: Db) -> None:
    with db.connect() as conn:  # the run of the gids below is live: nothing is stranded
        run_registry.register_run(conn, "a", RUN, 300.0, holds_lock=False)
    for batch in range(3):
        gid = prepare(db, "a", batch, 0, range(batch * 10, batch * 10 + 4))
        decide(db, "a", batch, [gid], 4)
        with db.connect() as conn:
            PostgresBackend(conn).commit_prepared(gid)
            PostgresBackend(conn).mark_complete("a", [batch])
    decided = prepare(db, "a", 3, 0, range(30, 33))
    decide(db, "a", 3, [decided], 3)  # decided, not committed yet
    open_gid = prepare(db, "a", 4, 0, range(40, 42))  # prepared, undecided
    foreign = prepare_foreign(db, f"app_tx_{uuid.uuid4().hex[:6]}")
    try:
        fresh = sqlsink("status", "--url", db.url, "--json", "--batches", "3")
        # nothing older than 5 minutes, but batch 3 decided, not complete, and nothing of
        # the sink connected: its driver may be gone (issue 30), the one warning
        assert fresh.code == 1, fresh.out + fresh.err
        doc = fresh.json
        assert doc["command"] == "status" and doc["version"] == 1 and doc["exit_code"] == 1
        [doubt] = doc["warnings"]
        assert doubt["message"].startswith("batch 3 (1 partition(s) still prepared) of sink a")
        (sink,) = doc["sinks"]
        assert sink["sink_id"] == "a" and sink["bound_query_id"] == "q1"
        assert (sink["last_decided_batch"], sink["last_complete_batch"]) == (3, 2)
        assert sink["incomplete_batches"] == [3]
        assert [b["batch_id"] for b in sink["recent_batches"]] == [3, 2, 1]
        assert (
            sink["recent_batches"][0]["rows"] == 3
            and sink["recent_batches"][0]["completed_at"] is None
        )
        assert sink["recent_batches"][1]["completed_at"] is not None
        assert [(p["gid"], p["batch_id"], p["decided"]) for p in sink["prepared"]] == [
            (decided, 3, True), (open_gid, 4, False),
        ]  # fmt: skip
        assert sink["live"] is True and [r["run_id"] for r in sink["runs"]] == [RUN]
        assert not any(p["stranded"] for p in sink["prepared"])
        assert [o["gid"] for o in doc["other_prepared"]] == [foreign]

        old = sqlsink("status", "--url", db.url, "--json", "--max-age", "0s")
        assert old.code == 1
        messages = [w for w in old.json["warnings"] if w["sink_id"] == "a"]
        vacuum = next(w for w in messages if "blocks VACUUM" in w["message"])
        assert "2 prepared transaction(s)" in vacuum["message"]
        assert "sqlsink recover" in vacuum["fix"] and "--sink-id a" in vacuum["fix"]
        assert any("not complete" in w["message"] for w in messages)
        assert any("not a sink's" in w["message"] for w in old.json["warnings"])

        human = sqlsink("status", "--url", db.url, "--sink-id", "a", "--max-age", "0s")
        assert human.code == 1
        assert "holds its locks and blocks VACUUM" in human.out
        assert "NOT COMPLETE" in human.out and open_gid in human.out

        unknown = sqlsink("status", "--url", db.url, "--sink-id", "nope")
        assert unknown.code == 2 and "unknown sink nope" in unknown.err
    finally:
        cleanup(db.server, [decided, open_gid, foreign])


# -- check --------------------------------------------------------------------------------


def test_check_without_and_with_the_schema(bare_db: Db) -> None:
    result = sqlsink("check", "--url", bare_db.url, "--json")
    assert result.code == 0, result.out + result.err
    findings = {f["setting"]: f for f in result.json["findings"]}
    mpt = findings["max_prepared_transactions"]
    assert mpt["level"] == "ok" and int(mpt["value"]) > 0 and mpt["source"]
    assert findings["sqlsink schema"]["value"] == "not installed"
    assert "first run" in findings["sqlsink schema"]["message"]
    assert findings["role"]["level"] == "ok"  # the test server's superuser
    assert findings["CREATE on database"]["level"] == "ok"
    assert set(findings["statement_timeout"]) == {
        "level",
        "setting",
        "value",
        "source",
        "message",
        "fix",
    }

    # recover and status cannot work without the commit log: one line, the fix, exit 2
    for command in ("recover", "status"):
        missing = sqlsink(command, "--url", bare_db.url)
        assert missing.code == 2
        assert "sqlsink schema" in missing.err and "created by the sink's first run" in missing.err
        assert "Traceback" not in missing.err and len(missing.err.strip().splitlines()) == 1

    with bare_db.connect() as conn:
        ensure_schema(conn)
    human = sqlsink("check", "--url", bare_db.url, "--trigger-interval", "10s")
    assert human.code == 0, human.out + human.err
    assert "max_prepared_transactions" in human.out and f"version {latest_version()}" in human.out

    # --partitions: judged against the slots and the connections; 500 is too many for both
    many = sqlsink("check", "--url", bare_db.url, "--partitions", "500", "--json")
    assert many.code == 2, many.out + many.err  # an error finding: no batch could commit
    assert many.json["partitions"] == 500
    judged = {f["setting"]: f for f in many.json["findings"]}
    assert judged["max_prepared_transactions"]["level"] == "error"
    assert judged["max_connections"]["level"] == "warning"
    assert (
        "a batch of 500 partitions may hold 502 connections" in judged["max_connections"]["message"]
    )


def test_check_and_recover_as_a_role_without_privileges(db: Db) -> None:
    role = f"cli_role_{uuid.uuid4().hex[:6]}"
    gid = prepare(db, "a", 0, 0, range(3))  # prepared by postgres
    with db.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db.name))
        )
    url = psycopg.conninfo.make_conninfo(db.url, user=role)
    try:
        check = sqlsink("check", "--url", url, "--json")
        assert check.code == 2, check.out + check.err
        levels = {f["setting"]: f["level"] for f in check.json["findings"]}
        assert levels["role"] == "info" and levels["sqlsink privileges"] == "error"
        assert levels["prepared transaction owner"] == "warning"
        # the top-level warnings say what made the exit code (issue 15 item 4)
        said = {w["level"]: w["message"] for w in check.json["warnings"]}
        assert said["error"].startswith("sqlsink privileges = ")
        assert "prepared transaction owner = " in " ".join(
            w["message"] for w in check.json["warnings"] if w["level"] == "warning"
        )

        denied = sqlsink("recover", "--url", url)
        assert denied.code == 2 and "permission denied" in denied.err
        assert "Traceback" not in denied.err and len(denied.err.strip().splitlines()) == 1

        with db.connect() as conn:
            for grant in (
                "GRANT USAGE ON SCHEMA sqlsink TO {}",
                "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA sqlsink TO {}",
            ):
                conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
        # issue 12 item 15: left with a warning (and the fix), the rest resolved
        not_owner = sqlsink("recover", "--url", url, "--json")
        assert not_owner.code == 1, not_owner.out + not_owner.err
        (sink,) = not_owner.json["sinks"]
        assert sink["status"] == "nothing to do"
        (warning,) = [w for w in not_owner.json["warnings"] if w["sink_id"] == sink["sink_id"]]
        assert "prepared by role(s) postgres" in warning["message"]
        assert "superuser" in str(warning["fix"])
        (left,) = [a for a in not_owner.json["actions"] if a["gid"] == gid]
        assert left["action"] == "leave" and "prepared by role postgres" in left["reason"]
        assert db.gids() == {gid}
    finally:
        cleanup(db.server, [gid])
        with db.connect() as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- the checkpoint -----------------------------------------------------------------------


def make_checkpoint(root: Path, query_id: str, offsets: list[int], commits: list[int]) -> Path:
    """What Spark leaves: metadata, offsets/N, commits/N (with .crc and temporary files)."""
    root.mkdir()
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    (root / "offsets").mkdir()
    (root / "commits").mkdir()
    for n in offsets:
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + n, "conf": {}}
        (root / "offsets" / str(n)).write_text(f'v1\n{json.dumps(meta)}\n{{"logOffset":{n}}}')
        (root / "offsets" / f".{n}.crc").write_bytes(b"crc")
    for n in commits:
        (root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (root / "commits" / f".{max(offsets)}.{uuid.uuid4()}.tmp").write_text("v1\n")
    (root / "sources").mkdir()
    return root


def test_checkpoint_relation_is_reported_per_batch(db: Db, tmp_path: Path) -> None:
    query = str(uuid.uuid4())
    done = prepare(db, query, 40, 0, range(0, 4))
    decide(db, query, 40, [done], 4, query=query)
    with db.connect() as conn:
        PostgresBackend(conn).commit_prepared(done)
        PostgresBackend(conn).mark_complete(query, [40])
    replay = prepare(db, query, 41, 0, range(10, 14))
    decide(db, query, 41, [replay], 4, query=query)  # decided; the driver died before commits/41
    rerun = prepare(db, query, 42, 0, range(20, 24))  # prepared, no decision
    checkpoint = make_checkpoint(tmp_path / "chk", query, [39, 40, 41, 42], [39, 40])

    result = sqlsink("recover", "--url", db.url, "--checkpoint", str(checkpoint), "--json")
    assert result.code == 0, result.out + result.err
    doc = result.json["checkpoint"]
    assert (doc["query_id"], doc["sink_id"], doc["bound_query_id"]) == (query, query, query)
    assert (doc["last_offsets_batch"], doc["last_committed_batch"]) == (42, 40)
    states = {b["batch_id"]: (b["state"], b["decision"]) for b in doc["batches"]}
    assert states == {
        39: ("no_decision", "none"),  # before the sink's first decision
        40: ("consistent", "complete"),
        41: ("replay_skip", "complete"),
        42: ("rerun", "none"),
    }
    messages = {b["batch_id"]: b["message"] for b in doc["batches"]}
    assert messages[41] == (
        "batch 41 is committed in PostgreSQL but not in Spark's commit log; Spark will replay "
        "it and the sink will skip it"
    )
    assert messages[42] == "batch 42 has offsets but no decision: Spark will re-run it"
    assert result.actions()[replay] == ("commit", True)
    assert result.actions()[rerun] == ("rollback", True)
    assert ids_in(db) == [0, 1, 2, 3, 10, 11, 12, 13]

    human = sqlsink("recover", "--url", db.url, "--checkpoint", str(checkpoint), "--dry-run")
    assert human.code == 0, human.out + human.err
    assert "Spark will replay it and the sink will skip it" in human.out
    assert "batch 42 has offsets but no decision: Spark will re-run it" in human.out


def test_checkpoint_of_another_query_is_refused(db: Db, tmp_path: Path) -> None:
    gid = prepare(db, "orders", 0, 0, range(3))
    decide(db, "orders", 0, [gid], 3, query="the-bound-query")
    checkpoint = make_checkpoint(tmp_path / "chk", "another-query", [0, 1], [0])
    result = sqlsink(
        "recover", "--url", db.url, "--sink-id", "orders", "--checkpoint", str(checkpoint)
    )
    assert result.code == 2, result.out + result.err
    assert "bound to streaming query the-bound-query" in result.err
    assert "belongs to query another-query" in result.err
    assert db.gids() == {gid}  # nothing done, not even the decided commit
    cleanup(db.server, [gid])

    not_a_checkpoint = sqlsink("recover", "--url", db.url, "--checkpoint", str(tmp_path))
    assert not_a_checkpoint.code == 2 and "no 'metadata' file" in not_a_checkpoint.err


def test_read_checkpoint_ignores_crc_and_temporary_files(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "chk", "q-1", [5, 6, 7], [5, 6])
    (path / "offsets" / "8").write_text("garbage")  # not a log entry: reported, ignored
    checkpoint = read_checkpoint(f"file://{path}")
    assert checkpoint.query_id == "q-1"
    assert sorted(checkpoint.offsets) == [5, 6, 7] and checkpoint.commits == {5, 6}
    assert checkpoint.offsets[7].timestamp_ms == 1_700_000_000_007
    assert len(checkpoint.problems) == 1 and "offsets/8" in checkpoint.problems[0]


# -- secrets, errors, progress ------------------------------------------------------------


def test_a_password_never_appears_in_any_output(db: Db) -> None:
    info = psycopg.conninfo.conninfo_to_dict(db.url)
    host, port = info.get("host", "127.0.0.1"), info.get("port", "5432")
    url = f"postgresql://{info.get('user', 'postgres')}:{PASSWORD}@{host}:{port}/{db.name}"
    # a conninfo with the password last, in JSON too
    keywords = f"host={host} port={port} user=postgres dbname={db.name} password={PASSWORD}"
    closed = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/{db.name}"
    env = {"PGPASSWORD": "env-" + PASSWORD}
    gid = prepare(db, "a", 0, 0, range(2))
    read_only = sqlsink_parallel(
        [
            ["check", "--url", url],
            ["check", "--url", keywords, "--json"],
            ["status", "--url", url, "--max-age", "0s"],
            ["status", "--url", keywords, "--json"],
            ["recover", "--url", url, "--dry-run"],
        ],
        env=env,
    )
    # status: 1, the gid's run is unknown to the commit log: stranded, said (item 16)
    assert [r.code for r in read_only] == [0, 0, 1, 1, 1], [r.err for r in read_only]
    assert read_only[1].json["url"].endswith("password=***")  # still valid JSON
    real = sqlsink("recover", "--url", url, "--json", env=env)
    assert real.code == 0 and real.actions()[gid] == ("rollback", True)
    failed = sqlsink_parallel(
        [[command, "--url", closed, *flags] for command in ("check", "status", "recover")
         for flags in ((), ("--json",))],
        env=env,
    )  # fmt: skip
    assert [r.code for r in failed] == [2] * 6
    assert "cannot connect to PostgreSQL at postgresql://postgres:***@127.0.0.1:1" in failed[0].err
    assert failed[1].json["error"]["message"].startswith("cannot connect")
    for r in [*read_only, real, *failed]:
        assert PASSWORD not in r.out + r.err
        assert "Traceback" not in r.err
    assert ":***@" in read_only[0].out
    # a fix line is pasteable: the password left out, not masked (issue 15 item 4)
    pasteable = f"sqlsink recover --url 'postgresql://postgres@{host}:{port}/{db.name}' --sink-id a"
    assert pasteable in read_only[2].out
    assert "(password: from PGPASSWORD or ~/.pgpass)" in read_only[2].out


def test_usage_errors_exit_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "sqlsink", "status"], capture_output=True, text=True, env=env,
        cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "--url" in proc.stderr
    with pytest.raises(SystemExit) as exit_:
        cli.main(["recover", "--url", "x", "--sink-id", "bad_id"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        cli.main(["status", "--url", "x", "--max-age", "soon"])
    assert exit_.value.code == 2


def test_long_plans_show_progress_on_stderr(
    db: Db, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gids = [prepare(db, "a", b, 0, range(b * 10, b * 10 + 1)) for b in range(5)]
    monkeypatch.setattr(cli_recover, "PROGRESS_EVERY", 2)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "10")  # main() sets it when unset: keep it local
    assert cli.main(["recover", "--url", db.url]) == 0
    captured = capsys.readouterr()
    assert "finishing 5 prepared transactions" in captured.err
    assert "2/5 prepared transactions finished" in captured.err
    assert "4/5 prepared transactions finished" in captured.err
    assert all(g in captured.out for g in gids)


def test_relate_warns_when_the_commit_log_is_ahead_of_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = read_checkpoint(str(make_checkpoint(tmp_path / "chk", "q", [3, 4], [3, 4])))
    decided = {b: DecisionState(complete=True, rows=1, gids=1, prepared=0) for b in (3, 4, 5, 6)}
    states = {r.batch_id: (r.state, r.level) for r in relate(checkpoint, decided)}
    assert states == {
        3: ("consistent", "ok"),
        4: ("consistent", "ok"),
        5: ("ahead", "warning"),
        6: ("ahead", "warning"),
    }
