"""The MariaDB backend's errors when its session is cut, the server restarts or a row
lock is held (sqlsink/mariadb/errors.py): done for real on the private mariadbd (KILL
CONNECTION, a SIGKILLed server, a second session holding the rows), each error a
TransientError naming the server (never the password), the step and what happens
next; after the retry every row exactly once and nothing of the sink left prepared."""

from __future__ import annotations

import json
import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqlsink.errors import TransientError
from sqlsink.mariadb import locks
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, execute, rows
from tests.fix_mariadb import TARGET_DB, MariaServer
from tests.mariadb.protocol import Writer, forget_sink, ids_of, make_table, new_sink, prepared_of


@pytest.fixture
def writer(mariadb_server: MariaServer) -> Iterator[Writer]:
    url = mariadb_server.url()
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), lock_timeout_s=1.0)
    make_table(url, w.table)
    yield w
    forget_sink(mariadb_server.url(), w.sink)


def said(server: MariaServer, exc: TransientError, *parts: str) -> str:
    """The message names the server and no password, and pickles (Spark ships it)."""
    text = str(exc)
    assert f"{server.host}:{server.port}" in text, text
    assert server.sink[1] not in text and server.root[1] not in text, text
    for part in parts:
        assert part in text, (part, text)
    assert str(pickle.loads(pickle.dumps(exc))) == text
    return text


def test_a_session_cut_between_two_commits_is_retried_to_every_row_once(
    mariadb_server: MariaServer, writer: Writer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KILL CONNECTION of the committer's session after its first XA COMMIT (the
    mid_commit terminate fault): the second branch's XA RECOVER meets the lost session."""
    url = mariadb_server.url()
    outcomes = [writer.write(0, range(0, 5), 0), writer.write(0, range(5, 10), 1)]
    faults = tmp_path / "faults.json"
    point = {"point": "mid_commit", "batch": 0, "action": "terminate", "url": url, "once": True}
    faults.write_text(json.dumps([point]))
    monkeypatch.setenv("SQLSINK_FAULTS_FILE", str(faults))
    with pytest.raises(TransientError) as caught:
        writer.commit(0, list(outcomes))
    said(
        mariadb_server,
        caught.value,
        f"sink {writer.sink}: lost the connection to MariaDB at",
        "while committing prepared branch",
        "The branch stays prepared",
        "sqlsink status --url mariadb://",
    )
    assert len(prepared_of(url, writer.sink)) == 1  # the second: left for the retry
    report = writer.commit(0, list(outcomes))  # Spark's retry of the batch's commit
    assert len(report.committed) == 1
    assert ids_of(url, writer.table) == list(range(10))
    assert prepared_of(url, writer.sink) == []


def test_a_session_cut_inside_the_decision_leaves_it_unwritten_and_the_retry_decides(
    mariadb_server: MariaServer, writer: Writer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KILL CONNECTION of the committer's session inside the decision's transaction (the
    in_decision terminate fault): its COMMIT meets the lost session; the server rolled
    the decision back, so the batch's branches stay prepared until the retry decides."""
    url = mariadb_server.url()
    outcomes = [writer.write(0, range(0, 5), 0), writer.write(0, range(5, 10), 1)]
    faults = tmp_path / "faults.json"
    point = {"point": "in_decision", "batch": 0, "action": "terminate", "url": url, "once": True}
    faults.write_text(json.dumps([point]))
    monkeypatch.setenv("SQLSINK_FAULTS_FILE", str(faults))
    with pytest.raises(TransientError) as caught:
        writer.commit(0, list(outcomes))
    said(
        mariadb_server,
        caught.value,
        "while writing the decision of batch 0",
        "error 2013",
        "Whether the decision was written is known from the commit log",
    )
    with writer.committer() as committer:
        assert committer.backend.decisions(writer.sink, [(writer.sink, 0)]) == {}
    assert len(prepared_of(url, writer.sink)) == 2
    report = writer.commit(0, list(outcomes))
    assert len(report.committed) == 2
    assert ids_of(url, writer.table) == list(range(10))
    assert prepared_of(url, writer.sink) == []


def test_registration_waiting_on_a_held_sink_row_names_lock_timeout_and_the_holder(
    mariadb_server: MariaServer, writer: Writer
) -> None:
    """Another session holds the sink's row (and the sink lock): a paused driver. The
    next batch's registration waits lockTimeout (1 s) and says who holds what."""
    url = mariadb_server.url()
    writer.batch(0, range(0, 5))
    outcome = writer.write(1, range(5, 10))
    holder = mariadb_server.connect(root=True)
    try:
        holder_id = int(rows(holder, "SELECT CONNECTION_ID()")[0][0])
        rows(holder, "SELECT GET_LOCK(%s, 0)", (locks.lock_name(writer.sink),))
        execute(holder, "BEGIN")
        rows(holder, "SELECT * FROM sqlsink.sinks WHERE sink_id = %s FOR UPDATE", (writer.sink,))
        with pytest.raises(TransientError) as caught:
            writer.commit(1, [outcome])
        said(
            mariadb_server,
            caught.value,
            "while registering run",
            "1205",
            "lockTimeout",
            f"held by connection {holder_id}",
            "1 prepared branch(es) of the sink may hold rows",
            "KILL CONNECTION",
            "Nothing of the batch is committed yet",
        )
        execute(holder, "ROLLBACK")
    finally:
        holder.close()  # lets the sink lock go
    writer.commit(1, [outcome])
    assert ids_of(url, writer.table) == list(range(10))
    assert prepared_of(url, writer.sink) == []


def test_a_registration_chosen_as_a_deadlocks_victim_is_a_transient_error(
    mariadb_server: MariaServer, writer: Writer
) -> None:
    """Another session holds the sink's run rows and then asks for the sink's row, which
    a new run's registration holds while it waits for those run rows: InnoDB ends the
    lighter transaction (the registration's; the other one wrote 200 rows) with 1213."""
    url = mariadb_server.url()
    writer.batch(0, range(0, 5))
    conn = connect(url)
    holder = mariadb_server.connect(root=True)
    failed: list[BaseException] = []
    try:
        backend = MariaDBBackend(conn, 10.0)
        me = int(rows(conn, "SELECT CONNECTION_ID()")[0][0])
        execute(holder, "BEGIN")
        values = ", ".join(f"({i})" for i in range(1000, 1200))
        execute(holder, f"INSERT INTO `{TARGET_DB}`.`{writer.table}` (id) VALUES {values}")
        rows(holder, "SELECT * FROM sqlsink.runs WHERE sink_id = %s FOR UPDATE", (writer.sink,))

        def register() -> None:
            try:
                backend.register_run(writer.sink, "r-new", 300.0, holds_lock=False)
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=register)
        thread.start()
        deadline = time.monotonic() + 10
        while not rows(  # the registration waits for the run rows: its UPDATE
            holder,
            "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s AND INFO LIKE %s",
            (me, "UPDATE%runs%"),
        ):
            assert time.monotonic() < deadline, ("the registration never waited", failed)
            time.sleep(0.02)
        rows(holder, "SELECT * FROM sqlsink.sinks WHERE sink_id = %s FOR UPDATE", (writer.sink,))
        thread.join(15)
        assert not thread.is_alive()
        execute(holder, "ROLLBACK")
        assert len(failed) == 1 and isinstance(failed[0], TransientError), failed
        said(
            mariadb_server,
            failed[0],
            f"sink {writer.sink}: a deadlock at MariaDB",
            "while registering run r-new",
            "1213",
            "The batch is retried",
        )
        assert backend.register_run(writer.sink, "r-new", 300.0, holds_lock=False) is None
    finally:
        holder.close()
        conn.close()
    assert ids_of(url, writer.table) == list(range(5))
    assert prepared_of(url, writer.sink) == []


def test_unlock_after_a_server_restart_says_the_lock_went_with_the_session(
    mariadb_server: MariaServer, writer: Writer
) -> None:
    """mariadbd SIGKILLed and restarted while the committer holds the sink lock with a
    branch prepared: letting the lock go meets the dead session; the next commit (a new
    session) commits the branch, which survived the restart."""
    url = mariadb_server.url()
    outcome = writer.write(0, range(0, 5))
    conn = connect(url)
    try:
        backend = MariaDBBackend(conn, 1.0)
        assert backend.try_sink_lock(writer.sink)
        mariadb_server.kill_and_restart()
        with pytest.raises(TransientError) as caught:
            backend.unlock_sink(writer.sink)
        said(
            mariadb_server,
            caught.value,
            f"sink {writer.sink}: lost the connection to MariaDB at",
            f"while letting the sink lock of sink {writer.sink} go",
            "let the sink lock go with the session",
        )
        with pytest.raises(TransientError, match="while listing the prepared XA branches"):
            backend.prepared(writer.sink)  # the same dead session: PyMySQL's InterfaceError
    finally:
        conn.close()
    assert prepared_of(url, writer.sink) == [outcome.gid]
    writer.commit(0, [outcome])
    assert ids_of(url, writer.table) == list(range(5))
    assert prepared_of(url, writer.sink) == []
