"""Attacks on the operator commands on a MariaDB url, as a tired on-call operator runs
them at night: the checkpoint check's verdict in ``status``/``metrics``, another
application's XA branches beside the sink's, ``recover`` while the sink lock is held,
a password with special characters, a user without privileges on the commit log."""

from __future__ import annotations

import socket
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sqlsink.checkpoint.parse import checkpoint_policy
from sqlsink.core.checkpoint_check import CheckpointCheck, CheckpointMode
from sqlsink.errors import DataLossError
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.locks import lock_name
from tests.fix_mariadb import MariaServer, _own_server
from tests.mariadb.protocol import Writer, forget_sink, ids_of, make_table, new_sink, prepared_of
from tests.mariadb.test_cli import LIVE_S, crash, document
from tests.pg.test_cli import Result, make_checkpoint, sqlsink


@pytest.fixture(scope="module")
def url(mariadb_server: MariaServer) -> str:
    return mariadb_server.url()


@pytest.fixture
def writer(url: str) -> Iterator[Writer]:
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=300)
    make_table(url, w.table)
    yield w
    forget_sink(url, w.sink)


def cli(url: str, *args: str) -> Result:
    done = sqlsink(*args, "--url", url)
    password = urllib.parse.urlsplit(url).password
    for secret in (password, password and urllib.parse.unquote(password)):
        assert not secret or secret not in done.out + done.err
    return done


def greeting_id(server: MariaServer) -> int:
    """The connection id the server gives a bare TCP connection (its greeting packet:
    protocol 10, the version as a NUL-ended string, then the id, 4 bytes little-endian);
    the connection is closed before it logs in."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        packet = b""
        while len(packet) < 4 or len(packet) < 4 + int.from_bytes(packet[:3], "little"):
            chunk = sock.recv(4096)
            if not chunk:
                raise AssertionError(f"no greeting from {server.host}:{server.port}")
            packet += chunk
    body = packet[4:]
    assert body[0] == 10, body[:16]
    end = body.index(b"\0", 1)
    return int.from_bytes(body[end + 1 : end + 5], "little")


def xa_recover(url: str) -> list[tuple[int, bytes]]:
    conn = connect(url)
    try:
        return sorted((int(r[0]), bytes(r[3])) for r in rows(conn, "XA RECOVER"))
    finally:
        conn.close()


# -- the checkpoint check's verdict --------------------------------------------------------


def test_a_recorded_checkpoint_loss_is_shown_by_status_and_metrics(
    writer: Writer, tmp_path: Path
) -> None:
    """A run's commit relates the checkpoint to the log and records its verdict on the
    runs row; ``status`` is how on-call sees a data-loss verdict. Spark's checkpoint
    records batches 0 and 1 committed; the log has neither: the check says loss."""
    writer.batch(0, range(0, 3))  # (no check yet: the log has batch 0)
    checkpoint = make_checkpoint(tmp_path / "cp", "q1", [0, 1, 2, 3], [0, 1, 2])
    # batch 3 by a new run with a check: Spark committed 0..2, the log has only 0
    writer.run = uuid.uuid4().hex
    outcomes = [writer.write(3, range(10, 13))]
    with writer.committer() as committer:
        committer.checkpoint_check = CheckpointCheck(
            committer.backend,  # type: ignore[arg-type]
            checkpoint_policy(str(checkpoint), CheckpointMode.WARN),
        )
        with pytest.raises(DataLossError):
            committer.commit_batch(3, outcomes, query_id="q1", run_id=writer.run)
    conn = connect(writer.url)
    try:
        recorded = rows(
            conn,
            "SELECT checkpoint_verdict, checkpoint_lost FROM sqlsink.runs "
            "WHERE sink_id = %s AND run_id = %s",
            (writer.sink, writer.run),
        )
    finally:
        conn.close()
    assert recorded == [("loss", "[1, 2]")]
    done = cli(writer.url, "status", "--json", "--sink-id", writer.sink)
    doc = document(done, "status")
    (sink,) = doc["sinks"]
    assert sink["checkpoint_check"] is not None, "the recorded verdict is not shown"
    assert sink["checkpoint_check"]["verdict"] == "loss"
    assert sink["checkpoint_check"]["lost"] == [1, 2]
    assert done.code == 3  # DATA LOSS
    text = cli(writer.url, "status", "--sink-id", writer.sink)
    assert "DATA LOSS: Spark's checkpoint" in text.out and "exit 3: DATA LOSS" in text.out
    metrics = cli(writer.url, "metrics", "--once")
    assert metrics.code == 0, metrics.err
    assert f'sqlsink_checkpoint_lost_batches{{sink="{writer.sink}"}} 2' in metrics.out
    # refused before its decision: batch 3's branch is left undecided (as on PostgreSQL)
    assert [g.split("_")[2] for g in prepared_of(writer.url, writer.sink)] == ["3"]
    assert ids_of(writer.url, writer.table) == [0, 1, 2]


def test_a_fresh_streams_first_commit_shows_its_checkpoint_check(
    writer: Writer, tmp_path: Path
) -> None:
    """What the author saw as ``checkpoint_check: null``: the first commit of a fresh
    stream runs the check (always due for a run never checked) and records it."""
    checkpoint = make_checkpoint(tmp_path / "cp", "q1", [0], [])
    outcomes = [writer.write(0, range(0, 3))]
    with writer.committer() as committer:
        committer.checkpoint_check = CheckpointCheck(
            committer.backend,  # type: ignore[arg-type]
            checkpoint_policy(str(checkpoint), CheckpointMode.WARN),
        )
        committer.commit_batch(0, outcomes, query_id="q1", run_id=writer.run)
    done = cli(writer.url, "status", "--json", "--sink-id", writer.sink)
    (sink,) = document(done, "status")["sinks"]
    check = sink["checkpoint_check"]
    assert check is not None and done.code == 0
    assert (check["verdict"], check["run_id"], check["batch_id"], check["lost"]) == (
        "verified",
        writer.run,
        0,
        [],
    )
    assert check["location"] == str(checkpoint)


# -- another application's XA branch beside the sink's --------------------------------------


def test_recover_never_touches_a_foreign_xa_branch_and_status_lists_it(
    url: str, tmp_path: Path
) -> None:
    """Another application's branch (its own formatID) and a branch of another sink's
    left beside this sink's undecided ones: ``recover`` of the sink finishes only its own."""
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=LIVE_S)
    make_table(url, w.table)
    other = connect(url)
    try:
        execute(other, f"CREATE TABLE `{w.table}_app` (id int PRIMARY KEY) ENGINE=InnoDB")
        execute(other, "XA START X'617070',X'6231',4242")
        execute(other, f"INSERT INTO `{w.table}_app` VALUES (1)")
        execute(other, "XA END X'617070',X'6231',4242")
        execute(other, "XA PREPARE X'617070',X'6231',4242")
        other.close()  # (MariaDB keeps a prepared branch of a closed session)
        left = crash(w, "after_decision", tmp_path)
        assert (4242, b"appb1") in xa_recover(url)
        done = cli(url, "status", "--json", "--sink-id", w.sink)
        doc = document(done, "status")
        (sink,) = doc["sinks"]
        assert sorted(p["gid"] for p in sink["prepared"]) == left
        assert [p["gid"] for p in doc["other_prepared"]] == ["X'617070',X'6231',4242"]
        every = document(cli(url, "recover", "--dry-run", "--json"), "recover")
        (foreign,) = [a for a in every["actions"] if a["gid"].startswith("X'")]
        assert (foreign["action"], foreign["why"], foreign["sink_id"]) == ("leave", "foreign", None)
        assert foreign["reason"] == "not a sqlsink transaction"
        acted = document(cli(url, "recover", "--json", "--sink-id", w.sink), "recover")
        assert {a["gid"]: a["result"] for a in acted["actions"]} == {
            **dict.fromkeys(left, "committed"),
            "X'617070',X'6231',4242": None,
        }
        assert prepared_of(url, w.sink) == [] and ids_of(url, w.table) == list(range(30))
        assert (4242, b"appb1") in xa_recover(url)
        # every sink's recovery, for real: the foreign branch still stands
        assert cli(url, "recover", "--json").code in (0, 1)
        assert (4242, b"appb1") in xa_recover(url)
    finally:
        cleanup = connect(url)
        try:
            if (4242, b"appb1") in xa_recover(url):
                execute(cleanup, "XA ROLLBACK X'617070',X'6231',4242")
            execute(cleanup, f"DROP TABLE IF EXISTS `{w.table}_app`")
        finally:
            cleanup.close()
        forget_sink(url, w.sink)


# -- recover while the sink lock is held ----------------------------------------------------


def test_recover_waits_bounded_for_the_sink_lock_and_names_its_holder(
    writer: Writer, tmp_path: Path
) -> None:
    left = crash(writer, "after_decision", tmp_path)
    holder = connect(writer.url)
    try:
        assert rows(holder, "SELECT GET_LOCK(%s, 0)", (lock_name(writer.sink),))[0][0] == 1
        pid = rows(holder, "SELECT CONNECTION_ID()")[0][0]
        started = time.monotonic()
        done = cli(writer.url, "recover", "--sink-id", writer.sink, "--lock-timeout", "2")
        took = time.monotonic() - started
        assert done.code != 0 and took < 30, (took, done.out, done.err)
        said = done.out + done.err
        assert str(pid) in said, said
        assert (
            prepared_of(writer.url, writer.sink) == left and ids_of(writer.url, writer.table) == []
        )
    finally:
        holder.close()
    done = cli(writer.url, "recover", "--sink-id", writer.sink)
    assert done.code == 0, done.out + done.err
    assert prepared_of(writer.url, writer.sink) == [] and ids_of(writer.url, writer.table) == list(
        range(30)
    )


# -- a user without privileges, a password with special characters --------------------------

NIGHT_PASSWORD = "p@ss:w/rd%#?&' x"


@pytest.fixture(scope="module")
def night_url(mariadb_server: MariaServer, url: str) -> Iterator[str]:
    """A user that may log in and nothing more; its password needs quoting in a url."""
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute("CREATE USER 'night'@'%%' IDENTIFIED BY %s", (NIGHT_PASSWORD,))
    finally:
        root.close()
    parts = urllib.parse.urlsplit(url)
    yield parts._replace(
        netloc=f"night:{urllib.parse.quote(NIGHT_PASSWORD, safe='')}@{parts.hostname}:{parts.port}"
    ).geturl()
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute("DROP USER 'night'@'%'")
    finally:
        root.close()


@pytest.mark.parametrize("command", ["status", "recover", "forget", "metrics", "check"])
def test_a_user_without_privileges_is_told_so_and_its_password_never_printed(
    night_url: str, command: str
) -> None:
    args = {"forget": ("forget", "--sink-id", "s1"), "metrics": ("metrics", "--once")}
    done = cli(night_url, *args.get(command, (command,)))
    denied = "Access denied for user 'night'@'%' to database 'sqlsink_test'"
    assert done.code == 2 and NIGHT_PASSWORD not in done.out + done.err
    # refused at the login (1044): the command's session connects with the sink's words
    # (connection.not_connected, since atk-mdb3), the server's in brackets; MariaDB has
    # no role owning a schema, nor a superuser: the fix is a runnable GRANT
    said = (
        f"cannot connect to MariaDB at {urllib.parse.urlsplit(night_url).netloc.split('@')[1]} "
        "as user 'night': user 'night' may not use database 'sqlsink_test' (or it does not "
        "exist). Fix: CREATE DATABASE `sqlsink_test`, or GRANT ALL ON `sqlsink_test`.* TO "
        "'night'@'%'"
    )
    if command == "metrics":
        assert "sqlsink_up 0.0" in done.out
        assert done.err.strip().startswith(f"sqlsink metrics: scrape failed: {said}"), done.err
        assert f"[{denied}]" in done.err, done.err
        return
    assert done.err.strip().startswith(f"sqlsink {command}: error: {said}"), done.err
    assert f"[{denied}]" in done.err, done.err


def test_status_as_a_user_without_the_commit_log_says_so(
    mariadb_server: MariaServer, night_url: str
) -> None:
    root = mariadb_server.connect(root=True)
    try:
        with root.cursor() as cur:
            cur.execute("GRANT SELECT ON sqlsink_test.* TO 'night'@'%'")
        done = cli(night_url, "status")
        assert done.code == 2
        assert done.err.strip() == (
            "sqlsink status: error: permission denied: SELECT command denied to user "
            "'night'@'127.0.0.1' for table `sqlsink`.`schema_version`. Fix: connect as the "
            "sink's user (the one its queries connect as), or grant this user what the "
            "message names (ALL on `sqlsink`.* for the commit log)"
        )
    finally:
        with root.cursor() as cur:
            cur.execute("REVOKE SELECT ON sqlsink_test.* FROM 'night'@'%'")
        root.close()


def test_forget_of_a_sink_with_prepared_branches_is_refused(writer: Writer, tmp_path: Path) -> None:
    left = crash(writer, "after_decision", tmp_path)
    done = cli(writer.url, "forget", "--sink-id", writer.sink)
    assert done.code == 1 and "exit 1: refused, see above" in done.out
    assert (
        f"refused: sink {writer.sink} is not finished: it has 3 prepared branch(es) "
        f"({', '.join(left)}); incomplete batch(es) 0; a live run ({writer.run}). Forgetting "
        "it now would lose what its log is there to complete. Nothing was removed. Fix: run "
        f"sqlsink recover --sink-id {writer.sink} first (and stop the query if it runs), then "
        "sqlsink forget again"
    ) in done.out
    assert prepared_of(writer.url, writer.sink) == left
    conn = connect(writer.url)
    try:
        kept = rows(
            conn, "SELECT count(*) FROM sqlsink.decisions WHERE sink_id = %s", (writer.sink,)
        )
    finally:
        conn.close()
    assert kept == [(1,)]


# -- recover after mariadbd was SIGKILLed and restarted: connection ids start again ---------


def test_recover_after_a_server_restart_never_kills_an_innocent_reused_connection_id(
    mariadb_server: MariaServer, url: str, tmp_path: Path
) -> None:
    """Run A's driver is SIGKILLed while it holds the sink lock: its runs row still names
    its connection id as the lock holder. Run B supersedes A. mariadbd is SIGKILLed and
    restarted: connection ids count again from 1, and an innocent session (here one
    holding the sink lock as a ``recover`` does) gets A's old id. ``recover`` waiting for
    the lock must not take it for A's fenced session and KILL it."""
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=LIVE_S, lock_timeout_s=2)
    make_table(url, w.table)
    try:
        crash(w, "before_decision", tmp_path)
        run_a = w.run
        conn = connect(url)
        try:
            (stale,) = rows(
                conn,
                "SELECT lock_conn FROM sqlsink.runs WHERE sink_id = %s AND run_id = %s",
                (w.sink, run_a),
            )[0]
        finally:
            conn.close()
        assert stale is not None
        w.run = uuid.uuid4().hex  # run B: its registration supersedes A
        w.batch(1, range(100, 103))
        mariadb_server.kill_and_restart()
        innocent = None
        # bounded: ids count up by one per connection; a bare TCP handshake takes one
        # (the server's greeting names it) at a fraction of a login's cost
        for _ in range(int(stale) + 100):
            if greeting_id(mariadb_server) >= int(stale) - 1:
                break
        for _ in range(100):
            c = connect(url)
            if rows(c, "SELECT CONNECTION_ID()")[0][0] == int(stale):
                innocent = c
                break
            c.close()
        if innocent is None:
            pytest.fail(f"connection id {stale} not reached after the restart")
        try:
            assert rows(innocent, "SELECT GET_LOCK(%s, 0)", (lock_name(w.sink),))[0][0] == 1
            done = cli(url, "recover", "--sink-id", w.sink, "--lock-timeout", "1")
            said = done.out + done.err
            assert done.code == 1, said
            # named as what it is: a session holding the lock, not run A's committer
            # (MariaDB's word: a connection id, as KILL CONNECTION takes it)
            assert (
                f"its lock is held by connection {stale} '' (role sink from 127.0.0.1, sleep)"
                in said
            )
            assert "ended" not in said and "commit'" not in said
            assert rows(innocent, "SELECT 1") == [(1,)], "recover killed an innocent session"
        finally:
            innocent.close()
    finally:
        forget_sink(url, w.sink)


def test_a_superseded_runs_lock_holder_of_this_server_life_is_still_ended(writer: Writer) -> None:
    """The other side of the restart guard: run A's committer, paused while it holds the
    sink lock in this server's life, is still ended when run B supersedes A."""
    writer.lock_timeout_s = 1
    with writer.committer() as paused:
        lock = paused.backend.sink_lock(writer.sink)
        lock.__enter__()
        paused.register(writer.run, holds_lock=True, writer=None)
        pid = rows(paused.backend.conn, "SELECT CONNECTION_ID()")[0][0]  # type: ignore[attr-defined]
        writer.run = uuid.uuid4().hex  # run B
        writer.batch(0, range(0, 3))  # waits 1 s, then ends A's session and commits
        conn = connect(writer.url)
        try:
            gone = rows(
                conn, "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (pid,)
            )
        finally:
            conn.close()
        assert gone == [(0,)]
    assert (
        ids_of(writer.url, writer.table) == [0, 1, 2] and prepared_of(writer.url, writer.sink) == []
    )


# -- two recovers at once; recover while a live run's committer holds the lock --------------


def test_two_recovers_at_once_finish_a_decided_batch_exactly_once(
    writer: Writer, tmp_path: Path
) -> None:
    """Both wait on the sink lock (held here), then race for it when it goes."""
    from concurrent.futures import ThreadPoolExecutor

    left = crash(writer, "after_decision", tmp_path)
    holder = connect(writer.url)
    try:
        assert rows(holder, "SELECT GET_LOCK(%s, 0)", (lock_name(writer.sink),))[0][0] == 1
        with ThreadPoolExecutor(2) as pool:
            given = ("recover", "--json", "--sink-id", writer.sink, "--lock-timeout", "30")
            futures = [pool.submit(cli, writer.url, *given) for _ in range(2)]
            time.sleep(4)  # both started and waiting
            rows(holder, "SELECT RELEASE_LOCK(%s)", (lock_name(writer.sink),))
            done = [f.result(timeout=90) for f in futures]
    finally:
        holder.close()
    docs = [document(d, "recover") for d in done]
    assert [d.code for d in done] == [0, 0], [d.out + d.err for d in done]
    results = sorted((a["gid"], a["result"]) for doc in docs for a in doc["actions"] if a["result"])
    assert results == [(g, "committed") for g in left]  # each branch once, by one of them
    assert prepared_of(writer.url, writer.sink) == [] and ids_of(writer.url, writer.table) == list(
        range(30)
    )


def test_recover_leaves_a_live_runs_committer_holding_the_lock_and_names_it(
    writer: Writer, tmp_path: Path
) -> None:
    """A live run's committer holds the sink lock (committing): recover waits at most its
    bound, names it as the sink's committer, ends nothing, changes nothing."""
    left = crash(writer, "after_decision", tmp_path)  # (live_s=300: run A is live)
    with writer.committer() as live, live.backend.sink_lock(writer.sink):
        live.register(writer.run, holds_lock=True, writer=None)
        pid = rows(live.backend.conn, "SELECT CONNECTION_ID()")[0][0]  # type: ignore[attr-defined]
        done = cli(writer.url, "recover", "--sink-id", writer.sink, "--lock-timeout", "1")
        said = done.out + done.err
        assert done.code == 1, said
        assert (
            f"its lock is held by connection {pid} 'sqlsink {writer.sink} commit' "
            "(role sink from 127.0.0.1, sleep)" in said
        )
        assert "ended" not in said
        assert rows(live.backend.conn, "SELECT 1") == [(1,)]  # type: ignore[attr-defined]
        assert prepared_of(writer.url, writer.sink) == left
        assert ids_of(writer.url, writer.table) == []


# -- the commit log's database absent (last: it drops and restores it) ----------------------


def test_status_metrics_and_recover_without_the_commit_log_database(tmp_path: Path) -> None:
    """On a server of its own: it drops the commit log's database, which the other sinks
    of the session's shared server keep (in a whole run they hold decisions there)."""
    from sqlsink.mariadb.schema import ensure_schema

    with contextmanager(_own_server)(tmp_path / "own") as server:
        url = server.url()
        conn = connect(url)
        try:
            ensure_schema(conn)
            assert rows(conn, "SELECT count(*) FROM sqlsink.decisions") == [(0,)]
            assert xa_recover(url) == []
            execute(conn, "SET SESSION lock_wait_timeout = 10")
            execute(conn, "DROP DATABASE sqlsink")
            absent = (
                "the sqlsink schema (the commit log) is not installed in database sqlsink. "
                "Fix: run the sink once (its planning creates database `sqlsink` and its "
                "tables), as a user that may create databases; or grant the sink's user ALL "
                "on `sqlsink`.*. Check also that --url names the sink's server"
            )
            for command in ("status", "recover"):
                done = cli(url, command)
                assert (done.code, done.out, done.err.strip()) == (
                    2,
                    "",
                    f"sqlsink {command}: error: {absent}",
                )
            doc = document(cli(url, "status", "--json"), "status")
            assert doc["exit_code"] == 2 and doc["database"] == "sqlsink"
            assert f"{doc['error']['message']}. Fix: {doc['error']['fix']}" == absent
            metrics = cli(url, "metrics", "--once")
            assert metrics.code == 2 and "sqlsink_up 0.0" in metrics.out
            assert metrics.err.strip() == f"sqlsink metrics: scrape failed: {absent}"
            assert rows(conn, "SHOW DATABASES LIKE 'sqlsink'") == []  # no command created it
        finally:
            conn.close()


def test_recover_of_one_sink_never_touches_another_sinks_branches(url: str, tmp_path: Path) -> None:
    ws = [Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=LIVE_S) for _ in range(2)]
    try:
        lefts = []
        for i, w in enumerate(ws):
            make_table(url, w.table)
            (tmp_path / str(i)).mkdir()
            lefts.append(crash(w, "after_decision", tmp_path / str(i)))
        done = document(cli(url, "recover", "--json", "--sink-id", ws[0].sink), "recover")
        assert {a["gid"]: a["result"] for a in done["actions"] if a["result"]} == dict.fromkeys(
            lefts[0], "committed"
        )
        others = [a for a in done["actions"] if a["sink_id"] == ws[1].sink]
        assert {(a["action"], a["why"]) for a in others} <= {("leave", "other_sink")}
        assert prepared_of(url, ws[0].sink) == [] and ids_of(url, ws[0].table) == list(range(30))
        assert prepared_of(url, ws[1].sink) == lefts[1] and ids_of(url, ws[1].table) == []
    finally:
        for w in reversed(ws):  # (the one with prepared branches first: they hold locks)
            forget_sink(url, w.sink)


def test_forget_of_a_finished_sink_while_another_sink_has_prepared_branches(
    url: str, tmp_path: Path
) -> None:
    """Its ``DELETE FROM markers WHERE sink_id`` waited (seen: 'Updating', more than 60 s)
    on the marker rows the other sink's prepared branches lock, when the optimizer scanned
    the table (after other tests of this file ran; not alone)."""
    import subprocess

    ws = [Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=LIVE_S) for _ in range(2)]
    try:
        lefts = []
        for i, w in enumerate(ws):
            make_table(url, w.table)
            (tmp_path / str(i)).mkdir()
            lefts.append(crash(w, "after_decision", tmp_path / str(i)))
        assert cli(url, "recover", "--sink-id", ws[0].sink).code == 0
        try:
            gone = sqlsink("forget", "--sink-id", ws[0].sink, "--url", url, timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("sqlsink forget waited more than 15 s")
        assert gone.code == 0, gone.out + gone.err
        assert prepared_of(url, ws[1].sink) == lefts[1] and ids_of(url, ws[1].table) == []
    finally:
        for w in reversed(ws):
            forget_sink(url, w.sink)
