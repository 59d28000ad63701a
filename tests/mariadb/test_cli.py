"""The operator's commands on a MariaDB URL, run as a user runs them (``python -m sqlsink``)
against the tests' private mariadbd: ``status`` (text and --json, the same contract as
PostgreSQL's), ``recover`` (dry run, real, --json) after a driver SIGKILLed before and
after its decision, ``forget`` (refused while a run is live), ``metrics --once``. Every
--json document is walked against its ``TypedDict`` (``tests/pg/test_cli_contract``'s
walk); after a recovery: the exact rows, and XA RECOVER empty of the sink's branches.
``check`` judges the server's settings (``sqlsink.mariadb.checks``) through the CLI."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sqlsink.cli import contract
from sqlsink.mariadb.backend import enter_task_session
from sqlsink.mariadb.connection import connect, rows
from sqlsink.mariadb.locks import lock_name
from tests.fix_mariadb import MariaServer
from tests.mariadb.crash_proc import outcome_json
from tests.mariadb.protocol import Writer, forget_sink, ids_of, make_table, new_sink, prepared_of
from tests.mariadb.test_crash import killed, run_proc
from tests.pg.test_cli import Result, make_checkpoint, sqlsink
from tests.pg.test_cli_contract import Shape

PARTS = (range(0, 10), range(10, 20), range(20, 30))
ALL = list(range(30))
LIVE_S = 1.0  # the crashed runs' runTimeout: dead soon after their driver is killed
# words of PostgreSQL that no text on a MariaDB url may say
PG_WORDS = (
    "pg_prepared_xacts", "VACUUM", "pg_terminate_backend", "PREPARED '", "psql", "from PGPASSWORD",
    "COMMIT PREPARED",
)  # fmt: skip


@pytest.fixture(scope="module")
def url(mariadb_server: MariaServer) -> str:
    return mariadb_server.url()


@pytest.fixture
def writer(url: str) -> Iterator[Writer]:
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=LIVE_S)
    make_table(url, w.table)
    yield w
    forget_sink(url, w.sink)


def cli(url: str, *args: str) -> Result:
    done = sqlsink(*args, "--url", url)
    for secret in (urllib.parse.urlsplit(url).password, "sink-pw"):
        assert not secret or secret not in done.out + done.err
    text = done.out + done.err
    assert not [w for w in PG_WORDS if w in text], text
    return done


def document(done: Result, command: str) -> dict[str, Any]:
    """The --json document, walked against the command's contract."""
    return Shape().document(done, command)


def crash(w: Writer, point: str, tmp_path: Path) -> list[str]:
    """Batch 0 written by three partitions; its driver SIGKILLed at ``point``; the
    branches it left prepared. Then its run is dead, if its runTimeout is LIVE_S."""
    outcomes = [w.write(0, ids, p) for p, ids in enumerate(PARTS)]
    args = {"url": w.url, "sink": w.sink, "run": w.run, "batch": 0,
            "outcomes": [outcome_json(o) for o in outcomes], "live_s": w.live_s}  # fmt: skip
    killed(run_proc("commit", args, tmp_path, [{"point": point, "batch": 0, "action": "kill"}]))
    time.sleep(LIVE_S + 0.2)
    left = prepared_of(w.url, w.sink)
    assert len(left) == 3
    return left


def test_status_shows_a_sinks_decided_batches_with_postgresqls_contract(url: str) -> None:
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=300)
    make_table(url, w.table)
    try:
        w.batch(0, range(0, 5), range(5, 10))
        w.batch(1, range(10, 15))
        text = cli(url, "status", "--sink-id", w.sink)
        assert text.code == 0, text.out + text.err
        assert "database sqlsink, role sink" in text.out
        assert w.sink in text.out and "exit 0: all well" in text.out
        done = cli(url, "status", "--json", "--sink-id", w.sink)
        doc = document(done, "status")
        assert done.code == 0 and doc["database"] == "sqlsink" and doc["role"] == "sink"
        (sink,) = doc["sinks"]
        assert set(sink) == set(contract.StatusSinkJson.__annotations__)
        assert sink["sink_id"] == w.sink and sink["bound_query_id"] == "q1"
        assert (sink["decisions"], sink["last_decided_batch"]) == (2, 1)
        assert sink["last_complete_batch"] == 1 and sink["incomplete_batches"] == []
        assert [b["rows"] for b in sink["recent_batches"]] == [5, 10]
        assert sink["prepared"] == [] and sink["live"] is True
        assert [r["run_id"] for r in sink["runs"]] == [w.run]
        assert sink["runs"][0]["state"] == "live" and sink["state"] == "live"
        assert sink["consistent_views"] == [] and sink["hidden_batches"] == []
        assert doc["data_loss"] == [] and doc["warnings"] == []
        assert sink["sessions"] == [] and sink["lock_holders"] == []
        # the batch's figures name MariaDB's statement (the text's too: PG_WORDS)
        line = sink["last_batch"]["line"]
        assert "XA COMMIT " in line and "COMMIT PREPARED" not in line, line
        assert "last batch 1: " in text.out and "XA COMMIT " in text.out, text.out
        # a connected partition task (as write_partition says whose it is) and a session
        # holding the sink lock are shown as the sink's, by their connection ids
        task, holder = connect(url), connect(url)
        try:
            enter_task_session(task, w.sink, 7, 2)
            assert rows(holder, "SELECT GET_LOCK(%s, 0)", (lock_name(w.sink),))[0][0] == 1
            ids = [rows(c, "SELECT CONNECTION_ID()")[0][0] for c in (task, holder)]
            seen = document(cli(url, "status", "--json", "--sink-id", w.sink), "status")
        finally:
            task.close()
            holder.close()
        (sink,) = seen["sinks"]
        assert [(s["pid"], s["application_name"]) for s in sink["sessions"]] == [
            (ids[0], f"sqlsink sink {w.sink}, batch 7, partition 2")
        ]
        assert [s["pid"] for s in sink["lock_holders"]] == [ids[1]]
        assert sink["lock_holders"][0]["user"] == "sink"
        # every sink of the server, and the contract's failure: an unknown sink
        assert cli(url, "status", "--json").code in (0, 1)
        unknown = cli(url, "status", "--json", "--sink-id", "no-such-sink")
        assert unknown.code == 2
        assert "unknown sink no-such-sink" in document(unknown, "status")["error"]["message"]
    finally:
        forget_sink(url, w.sink)


def test_undecided_branches_of_a_killed_driver_warn_then_recover_rolls_them_back(
    writer: Writer, tmp_path: Path
) -> None:
    left = crash(writer, "before_decision", tmp_path)
    done = cli(writer.url, "status", "--json", "--sink-id", writer.sink)
    doc = document(done, "status")
    assert done.code == 1, done.err
    (sink,) = doc["sinks"]
    assert sorted(p["gid"] for p in sink["prepared"]) == left
    assert all(p["stranded"] and not p["decided"] for p in sink["prepared"])
    assert all(p["database"] == "sqlsink" and p["owner"] == "sink" for p in sink["prepared"])
    (warning,) = [w for w in doc["warnings"] if "no live run to finish them" in w["message"]]
    assert "holds its row locks" in warning["message"] and "sqlsink recover" in warning["fix"]
    assert "(password: add it to --url, or pass --password-command)" in warning["fix"]
    text = cli(writer.url, "status", "--sink-id", writer.sink)
    assert "3 prepared transaction(s) have no live run" in text.out and text.code == 1
    # the batch is undecided above every decision: Spark may have committed it, so
    # without its checkpoint the dry run keeps its branches, and changes nothing
    plan = cli(writer.url, "recover", "--dry-run", "--json", "--sink-id", writer.sink)
    planned = document(plan, "recover")
    assert {a["gid"]: (a["action"], a["why"]) for a in planned["actions"]} == dict.fromkeys(
        left, ("leave", "unsure")
    )
    assert "--checkpoint DIR" in planned["warnings"][0]["fix"]
    assert prepared_of(writer.url, writer.sink) == left
    # the query's checkpoint: batch 0 planned (offsets/0), never committed by Spark
    checkpoint = make_checkpoint(tmp_path / "cp", "q1", [0], [])
    done = cli(
        writer.url, "recover", "--json", "--sink-id", writer.sink, "--checkpoint", str(checkpoint)
    )
    acted = document(done, "recover")
    assert done.code == 0, done.out + done.err
    assert {a["gid"]: a["result"] for a in acted["actions"]} == dict.fromkeys(left, "rolled back")
    assert acted["checkpoint"]["path"] == str(checkpoint)
    assert prepared_of(writer.url, writer.sink) == [] and ids_of(writer.url, writer.table) == []


def test_decided_branches_of_a_killed_driver_are_committed_by_recover(
    writer: Writer, tmp_path: Path
) -> None:
    left = crash(writer, "after_decision", tmp_path)
    doc = document(cli(writer.url, "status", "--json", "--sink-id", writer.sink), "status")
    (sink,) = doc["sinks"]
    assert all(p["decided"] for p in sink["prepared"]) and sink["incomplete_batches"] == [0]
    plan = cli(writer.url, "recover", "--dry-run", "--sink-id", writer.sink)
    assert "dry run" in plan.out and plan.code == 1, plan.out + plan.err
    assert prepared_of(writer.url, writer.sink) == left and ids_of(writer.url, writer.table) == []
    done = cli(writer.url, "recover", "--sink-id", writer.sink)
    assert done.code == 0, done.out + done.err
    assert "3 committed" in done.out or "committed" in done.out
    assert prepared_of(writer.url, writer.sink) == [] and ids_of(writer.url, writer.table) == ALL
    again = document(cli(writer.url, "status", "--json", "--sink-id", writer.sink), "status")
    assert again["sinks"][0]["incomplete_batches"] == [] and again["exit_code"] == 0


def test_a_live_runs_branches_are_left_until_force_declares_it_dead(
    url: str, tmp_path: Path
) -> None:
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=300)
    make_table(url, w.table)
    try:
        left = crash(w, "before_decision", tmp_path)
        checkpoint = str(make_checkpoint(tmp_path / "cp", "q1", [0], []))
        doc = document(cli(url, "status", "--json", "--sink-id", w.sink), "status")
        (sink,) = doc["sinks"]
        assert not any(p["stranded"] for p in sink["prepared"]) and sink["live"] is True
        given = ("--json", "--sink-id", w.sink, "--checkpoint", checkpoint)
        kept = document(cli(url, "recover", *given), "recover")
        assert {(a["action"], a["why"]) for a in kept["actions"]} == {("leave", "live_run")}
        assert prepared_of(url, w.sink) == left
        done = cli(url, "recover", *given, "--force", "--run-id", w.run)
        acted = document(done, "recover")
        assert done.code == 0, done.out + done.err
        assert acted["forced"] and acted["sinks"][0]["fenced_runs"] == [w.run]
        assert {a["gid"]: a["result"] for a in acted["actions"]} == dict.fromkeys(
            left, "rolled back"
        )
        assert prepared_of(url, w.sink) == [] and ids_of(url, w.table) == []
        again = document(cli(url, "status", "--json", "--sink-id", w.sink), "status")
        assert again["sinks"][0]["runs"][0]["state"] == "fenced"
    finally:
        forget_sink(url, w.sink)


def test_commit_lost_commits_a_batch_spark_committed_without_a_decision(
    writer: Writer, tmp_path: Path
) -> None:
    left = crash(writer, "before_decision", tmp_path)
    checkpoint = make_checkpoint(tmp_path / "cp", "q1", [0], [0])  # Spark committed batch 0
    given = ("--sink-id", writer.sink, "--checkpoint", str(checkpoint))
    kept = cli(writer.url, "recover", "--json", *given)
    doc = document(kept, "recover")
    assert all(a["action"] == "leave" for a in doc["actions"]) and kept.code != 0
    assert "--commit-lost 0" in json.dumps(doc["warnings"])
    assert prepared_of(writer.url, writer.sink) == left
    done = cli(writer.url, "recover", "--json", *given, "--commit-lost", "0")
    acted = document(done, "recover")
    assert done.code == 0, done.out + done.err
    assert acted["commit_lost"] == [0]
    assert {a["gid"]: a["result"] for a in acted["actions"]} == dict.fromkeys(left, "committed")
    assert prepared_of(writer.url, writer.sink) == [] and ids_of(writer.url, writer.table) == ALL


def test_forget_is_refused_while_a_run_is_live_then_removes_the_log(url: str) -> None:
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=4)
    make_table(url, w.table)
    try:
        w.batch(0, range(0, 5))
        w.batch(1, range(5, 10))
        refused = cli(url, "forget", "--json", "--sink-id", w.sink)
        doc = document(refused, "forget")
        assert refused.code == 1 and not doc["forgotten"]
        assert f"a live run ({w.run})" in doc["message"]
        time.sleep(4.2)
        holder = connect(url)  # the sink lock held (a committer, a recover): waited for
        try:
            assert rows(holder, "SELECT GET_LOCK(%s, 0)", (lock_name(w.sink),))[0][0] == 1
            pid = rows(holder, "SELECT CONNECTION_ID()")[0][0]
            locked = cli(url, "forget", "--json", "--sink-id", w.sink, "--lock-timeout", "1")
        finally:
            holder.close()
        doc = document(locked, "forget")  # a held lock: refused, as recover refuses a sink
        assert locked.code == 1 and doc["error"] is None and not doc["forgotten"], doc
        assert f"held by connection {pid}" in doc["message"], doc
        assert "KILL CONNECTION" in doc["warnings"][0]["fix"], doc
        done = cli(url, "forget", "--json", "--sink-id", w.sink)
        doc = document(done, "forget")
        assert done.code == 0 and doc["forgotten"], done.out + done.err
        assert (doc["decisions"], doc["first_batch"], doc["last_batch"]) == (2, 0, 1)
        assert "replays its last batch (1)" in doc["replay_warning"]
        gone = cli(url, "forget", "--sink-id", w.sink)
        assert gone.code == 2 and f"unknown sink {w.sink}" in gone.err
        assert ids_of(url, w.table) == list(range(10))  # the table is the user's: kept
    finally:
        forget_sink(url, w.sink)


def test_metrics_once_reads_the_commit_log(url: str) -> None:
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=300)
    make_table(url, w.table)
    try:
        w.batch(0, range(0, 7))
        done = cli(url, "metrics", "--once")
        assert done.code == 0, done.err
        assert "sqlsink_up 1.0" in done.out
        assert f'sqlsink_batches_committed_total{{sink="{w.sink}"}} 1.0' in done.out
    finally:
        forget_sink(url, w.sink)


def test_a_refused_connection_is_told_as_mariadbs_without_the_password() -> None:
    """A command that never connected is told so (connection.connect's words), not that
    it lost a connection it never had (atk-mdb3)."""
    done = cli("mariadb://app:s3cret@127.0.0.1:9/shop", "status", "--json")
    doc = document(done, "status")
    message = doc["error"]["message"]
    assert done.code == 2 and "cannot connect to MariaDB at 127.0.0.1:9" in message, message
    assert "nothing accepts connections there" in message and "s3cret" not in message
    assert doc["url"] == "mariadb://app:***@127.0.0.1:9/shop"


def test_check_judges_the_servers_settings_with_postgresqls_contract(url: str) -> None:
    """``sqlsink check`` on a MariaDB url: the findings of ``sqlsink.mariadb.checks``
    through the CLI, in text and --json (the contract's shape), with the batch's
    partitions and trigger interval; the binary log's XA caveat is a warning."""
    done = cli(url, "check", "--json", "--partitions", "4", "--trigger-interval", "30s")
    doc = document(done, "check")
    found = {f["setting"]: f for f in doc["findings"]}
    assert found["local_infile"]["level"] == "ok", found["local_infile"]
    assert found["log_bin"]["level"] == "warning"
    assert "MDEV-21469" in found["log_bin"]["message"]
    assert {"max_connections", "innodb_lock_wait_timeout", "XA RECOVER"} <= set(found)
    assert not [f for f in doc["findings"] if f["level"] == "error"], doc["findings"]
    assert done.code == 1, done.err  # warnings, no error: exit 1 as on PostgreSQL
    text = cli(url, "check", "--partitions", "4")
    assert text.code == 1 and "local_infile" in text.out and "MDEV-21469" in text.out


def test_a_password_command_and_a_user_without_rights_on_the_commit_log(
    mariadb_server: MariaServer, url: str
) -> None:
    """The password from --password-command (none in the URL); a user that may not read
    the commit log is told so as a privilege error, exit 2."""
    make_table(url, f"t_{uuid.uuid4().hex[:8]}")  # and the commit log, in a fresh server
    bare = url.replace(":sink-pw@", "@")
    done = cli(bare, "status", "--json", "--password-command", "echo sink-pw")
    assert done.code in (0, 1) and document(done, "status")["role"] == "sink", done.err
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute("CREATE USER IF NOT EXISTS 'nobody'@'%' IDENTIFIED BY 'nobody-pw'")
            cur.execute("CREATE USER IF NOT EXISTS 'nobody'@'localhost' IDENTIFIED BY 'nobody-pw'")
            for host in ("%", "localhost"):  # the tables' database, not the commit log's
                cur.execute(f"GRANT SELECT ON `sqlsink_test`.* TO 'nobody'@'{host}'")
        refused = cli(url.replace("sink:sink-pw", "nobody:nobody-pw"), "status", "--json")
    finally:
        with root.cursor() as cur:
            cur.execute("DROP USER IF EXISTS 'nobody'@'%', 'nobody'@'localhost'")
        root.close()
    error = document(refused, "status")["error"]
    assert refused.code == 2 and error["message"].startswith("permission denied: "), error
    assert "nobody-pw" not in refused.out + refused.err
