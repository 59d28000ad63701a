"""What the MariaDB backend relies on, pinned against the real server (issue 31, "What
was measured here"): each test one fact of XA on MariaDB 10.11 with the binary log on,
as the sink's role (no privilege beyond its databases)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql
import pytest

from tests.fix_mariadb import TARGET_DB, MariaServer

XAER_NOTA = 1397  # "The XID is not known"
XAER_RMFAIL = 1399  # the command cannot run in the branch's state
XAER_INVAL = 1398  # invalid arguments (e.g. an xid part too long)


@pytest.fixture
def server(mariadb_server: MariaServer) -> MariaServer:
    return mariadb_server


@pytest.fixture
def table(server: MariaServer) -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    conn = server.connect(database=TARGET_DB)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{name}` (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    conn.close()
    return name


def run(conn: Any, statement: str, args: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(statement, args)
        return list(cur.fetchall())


def xid() -> str:
    return f"'facts-{uuid.uuid4().hex[:12]}'"


def listed(conn: Any, gtrid: str, within_s: float = 0.0) -> int:
    """How many branches ``XA RECOVER`` lists with this gtrid (its data, bqual empty);
    ``within_s``: polled that long for one (the server sees a disconnect shortly after
    the client closes, not at once)."""
    deadline = time.monotonic() + within_s
    while True:
        found = sum(1 for r in run(conn, "XA RECOVER") if bytes(r[3]) == gtrid.encode())
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.02)


def errno(exc: pymysql.MySQLError) -> int:
    return int(exc.args[0])


def test_commit_from_a_second_session_waits_for_the_preparer_to_disconnect(
    server: MariaServer, table: str
) -> None:
    """XAER_NOTA (1397) while the preparing session is connected, though XA RECOVER lists
    the branch; committed by the second session once the first is gone (shortly after
    its client closes): a partition must disconnect after XA PREPARE."""
    g = xid()
    prep, other = server.connect(database=TARGET_DB), server.connect(database=TARGET_DB)
    run(prep, f"XA START {g}")
    run(prep, f"INSERT INTO `{table}` VALUES (1, 'a')")
    run(prep, f"XA END {g}")
    run(prep, f"XA PREPARE {g}")
    with pytest.raises(pymysql.MySQLError) as info:
        run(other, f"XA COMMIT {g}")
    assert errno(info.value) == XAER_NOTA
    # listed by XA RECOVER all the same: a listed branch may still be attached to its
    # session, and then cannot be finished by another (the backend waits, boundedly)
    assert listed(other, g.strip("'")) == 1
    prep.close()
    deadline = time.monotonic() + 5.0
    while True:
        try:
            run(other, f"XA COMMIT {g}")
            break
        except pymysql.MySQLError as exc:
            if errno(exc) != XAER_NOTA or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    assert run(other, f"SELECT id, v FROM `{table}`") == [(1, "a")]
    with pytest.raises(pymysql.MySQLError) as again:  # an xid commits once
        run(other, f"XA COMMIT {g}")
    assert errno(again.value) == XAER_NOTA
    other.close()


def test_xa_recover_lists_format_id_lengths_and_the_binary_data(
    server: MariaServer, table: str
) -> None:
    """formatID, gtrid_length, bqual_length, data (gtrid then bqual, bytes as given)."""
    gtrid, bqual, fmt = os.urandom(64), os.urandom(64), 0x53514C01
    spelled = f"X'{gtrid.hex()}',X'{bqual.hex()}',{fmt}"
    conn = server.connect(database=TARGET_DB)
    run(conn, f"XA START {spelled}")
    run(conn, f"INSERT INTO `{table}` VALUES (1, 'a')")  # an empty one stays prepared too
    run(conn, f"XA END {spelled}")
    run(conn, f"XA PREPARE {spelled}")
    conn.close()
    other = server.connect()
    rows = [r for r in run(other, "XA RECOVER") if r[0] == fmt and bytes(r[3]) == gtrid + bqual]
    assert [(r[0], r[1], r[2]) for r in rows] == [(fmt, 64, 64)]
    sql_form = [r for r in run(other, "XA RECOVER FORMAT='SQL'") if r[0] == fmt]
    assert any(gtrid.hex().upper() in str(r[3]).upper() for r in sql_form)
    run(other, f"XA ROLLBACK {spelled}")
    assert not [r for r in run(other, "XA RECOVER") if bytes(r[3]) == gtrid + bqual]
    other.close()


def test_xid_parts_are_at_most_64_bytes_and_the_format_id_31_bits(server: MariaServer) -> None:
    """gtrid and bqual: 64 bytes each; formatID: 0 .. 2**31 - 1 in the statement's
    syntax (a larger or negative one is a syntax error, not a 4-byte unsigned)."""
    conn = server.connect()
    for too_long in (f"X'{'aa' * 65}'", f"X'{'aa' * 64}',X'{'bb' * 65}'"):
        with pytest.raises(pymysql.MySQLError):
            run(conn, f"XA START {too_long}")
    run(conn, f"XA START X'{'aa' * 64}',X'{'bb' * 64}',2147483647")
    run(conn, f"XA END X'{'aa' * 64}',X'{'bb' * 64}',2147483647")
    run(conn, f"XA ROLLBACK X'{'aa' * 64}',X'{'bb' * 64}',2147483647")
    for fmt in ("2147483648", "-1"):
        with pytest.raises(pymysql.MySQLError):
            run(conn, f"XA START X'01',X'02',{fmt}")
    conn.close()


def test_load_data_local_inside_a_branch_appears_at_commit(
    server: MariaServer, table: str, tmp_path: Path
) -> None:
    """LOAD DATA LOCAL INFILE between XA START and XA END, here from a FIFO written by a
    thread (a stream, no file of the whole partition): invisible until XA COMMIT."""
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as pipe:
            for i in range(1000):
                pipe.write(f"{i}\tv{i}\n".encode())

    writer = threading.Thread(target=feed)
    writer.start()
    g = xid()
    conn = server.connect(database=TARGET_DB, local_infile=True)
    run(conn, f"XA START {g}")
    run(conn, f"LOAD DATA LOCAL INFILE %s INTO TABLE `{table}` (id, v)", (str(fifo),))
    run(conn, f"XA END {g}")
    run(conn, f"XA PREPARE {g}")
    writer.join(10)
    conn.close()
    other = server.connect(database=TARGET_DB)
    assert run(other, f"SELECT count(*) FROM `{table}`") == [(0,)]
    run(other, f"XA COMMIT {g}")
    assert run(other, f"SELECT count(*), max(v) FROM `{table}`") == [(1000, "v999")]
    other.close()


def test_a_branch_refuses_what_would_commit_it_and_rolls_back_on_disconnect_before_prepare(
    server: MariaServer, table: str
) -> None:
    """COMMIT inside an active branch is XAER_RMFAIL; a session that ends before
    XA PREPARE leaves nothing (rolled back, not listed)."""
    g = xid()
    conn = server.connect(database=TARGET_DB)
    run(conn, f"XA START {g}")
    run(conn, f"INSERT INTO `{table}` VALUES (1, 'a')")
    with pytest.raises(pymysql.MySQLError) as info:
        run(conn, "COMMIT")
    assert errno(info.value) == XAER_RMFAIL
    conn.close()
    other = server.connect(database=TARGET_DB)
    assert listed(other, g.strip("'"), within_s=0.3) == 0
    assert run(other, f"SELECT count(*) FROM `{table}`") == [(0,)]
    other.close()


def test_two_branches_of_one_gtrid_are_separate_transactions(
    server: MariaServer, table: str
) -> None:
    """Partitions of one batch share a gtrid (the sink's xid layout): each branch
    (another bqual) prepares and commits on its own."""
    gtrid = f"batch-{uuid.uuid4().hex[:8]}"
    a, b = f"'{gtrid}','p0',7", f"'{gtrid}','p1',7"
    for i, x in enumerate((a, b)):
        conn = server.connect(database=TARGET_DB)
        run(conn, f"XA START {x}")
        run(conn, f"INSERT INTO `{table}` VALUES ({i}, 'x')")
        run(conn, f"XA END {x}")
        run(conn, f"XA PREPARE {x}")
        conn.close()
    other = server.connect(database=TARGET_DB)
    run(other, f"XA COMMIT {a}")
    run(other, f"XA ROLLBACK {b}")
    assert run(other, f"SELECT id FROM `{table}`") == [(0,)]
    other.close()


def test_a_branch_is_finished_by_gtrid_and_bqual_whatever_the_format_id(
    server: MariaServer, table: str
) -> None:
    """MariaDB 10.11 commits (or rolls back) a prepared branch named with another formatID
    than it was prepared with, and refuses a second branch of the same gtrid and bqual
    under another formatID (XAER_DUPID): the formatID alone does not keep the sink off a
    foreign branch, so the backend looks each branch up in XA RECOVER first."""
    gtrid = f"fmt-{uuid.uuid4().hex[:8]}"
    conn = server.connect(database=TARGET_DB)
    run(conn, f"XA START '{gtrid}','b',7")
    run(conn, f"INSERT INTO `{table}` VALUES (1, 'a')")
    run(conn, f"XA END '{gtrid}','b',7")
    run(conn, f"XA PREPARE '{gtrid}','b',7")
    conn.close()
    other = server.connect(database=TARGET_DB)
    with pytest.raises(pymysql.MySQLError) as dup:
        run(other, f"XA START '{gtrid}','b',8")
    assert errno(dup.value) == 1440  # XAER_DUPID
    deadline = time.monotonic() + 5.0
    while True:  # committed under formatID 8, once its session has gone
        try:
            run(other, f"XA COMMIT '{gtrid}','b',8")
            break
        except pymysql.MySQLError as exc:
            if errno(exc) != XAER_NOTA or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    assert run(other, f"SELECT id FROM `{table}`") == [(1,)]
    other.close()


@pytest.mark.crash
def test_a_prepared_branch_survives_the_servers_sigkill(tmp_path: Path) -> None:
    """mariadbd SIGKILLed with a branch prepared (binary log on): after the restart XA
    RECOVER lists it and another session commits it. A server of its own, so that the
    crash touches no other test."""
    from tests.fix_mariadb import _own_server

    servers = _own_server(tmp_path)
    own = next(servers)
    try:
        conn = own.connect()
        run(conn, "CREATE TABLE sqlsink_test.crash (id INT PRIMARY KEY) ENGINE=InnoDB")
        g = xid()
        run(conn, f"XA START {g}")
        run(conn, "INSERT INTO sqlsink_test.crash VALUES (1)")
        run(conn, f"XA END {g}")
        run(conn, f"XA PREPARE {g}")
        conn.close()
        own.kill_and_restart()
        after = own.connect()
        assert listed(after, g.strip("'")) == 1
        run(after, f"XA COMMIT {g}")
        assert run(after, "SELECT id FROM sqlsink_test.crash") == [(1,)]
        after.close()
    finally:
        servers.close()


def test_the_preparing_session_cannot_start_another_branch(server: MariaServer, table: str) -> None:
    """After XA PREPARE the session is bound to its branch: XA START of another gets
    XAER_RMFAIL (1399); so a partition's session is of no use after PREPARE but to end."""
    g, h = xid(), xid()
    prep = server.connect(database=TARGET_DB)
    run(prep, f"XA START {g}")
    run(prep, f"INSERT INTO `{table}` VALUES (1, 'a')")
    run(prep, f"XA END {g}")
    run(prep, f"XA PREPARE {g}")
    with pytest.raises(pymysql.MySQLError) as info:
        run(prep, f"XA START {h}")
    assert errno(info.value) == XAER_RMFAIL
    run(prep, f"XA ROLLBACK {g}")  # its own session may end it
    prep.close()
