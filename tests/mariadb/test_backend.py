"""The MariaDB backend beyond the shared contract (tests/sim/test_backend_contract.py):
what XA and InnoDB's locks make of the commit log's own statements."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from sqlsink.core.gid import Gid
from sqlsink.core.model import NewDecision
from sqlsink.errors import TransientError
from sqlsink.mariadb import commit_log, xid
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, execute
from sqlsink.mariadb.schema import ensure_schema, migrations, version
from tests.fix_mariadb import MariaServer


@pytest.fixture
def backend(mariadb_server: MariaServer) -> Iterator[MariaDBBackend]:
    conn = connect(mariadb_server.url())
    ensure_schema(conn)
    b = MariaDBBackend(conn, 2.0)
    yield b
    conn.close()


def prepare(url: str, gid: Gid) -> None:
    branch = xid.encode(gid).sql()
    conn = connect(url)
    execute(conn, f"XA START {branch}")
    commit_log.insert_marker(conn, "sqlsink", str(gid), gid.sink_id, gid.batch_id, 0, 1)
    execute(conn, f"XA END {branch}")
    execute(conn, f"XA PREPARE {branch}")
    conn.close()


def test_completing_a_batch_never_waits_for_a_later_batchs_prepared_marker(
    mariadb_server: MariaServer, backend: MariaDBBackend
) -> None:
    """mark_complete deletes the batch's markers while the next batch's branch is
    prepared and holds its own marker row: READ COMMITTED keeps the DELETE off it (a
    wait here would last innodb_lock_wait_timeout, every batch)."""
    sink = f"m-{uuid.uuid4().hex[:8]}"
    url = mariadb_server.url()
    done, later = Gid(sink, 3, 0, "r1", 0), Gid(sink, 4, 0, "r1", 1)
    prepare(url, done)
    prepare(url, later)
    assert backend.insert_decision(NewDecision(sink, 3, (str(done),), 1, "q1", "r1"))
    assert backend.commit_prepared(str(done))
    began = time.monotonic()
    backend.mark_complete(sink, [3])
    assert time.monotonic() - began < 0.5
    assert backend.decisions(sink, [(sink, 3)])[(sink, 3)].complete
    assert backend.visible_markers([str(done)]) == set()
    assert backend.rollback_prepared(str(later))


def test_the_commit_log_is_created_once_and_at_its_newest_version(
    backend: MariaDBBackend,
) -> None:
    newest = migrations()[-1][0]
    assert newest >= 2  # 002: the writer's hand-overs
    assert version(backend.conn) == newest
    assert ensure_schema(backend.conn) == newest  # again: nothing to do


def test_a_branch_still_attached_is_waited_for_then_committed(
    mariadb_server: MariaServer, backend: MariaDBBackend
) -> None:
    """The one difference the protocol meets: until the preparing session has ended,
    XA COMMIT from another gets XAER_NOTA although XA RECOVER lists the branch; the
    backend retries within its bound, and says who to end when the bound passes."""
    sink = f"m-{uuid.uuid4().hex[:8]}"
    gid = Gid(sink, 0, 0, "r1", 0)
    branch = xid.encode(gid).sql()
    conn = connect(mariadb_server.url())
    execute(conn, f"XA START {branch}")
    commit_log.insert_marker(conn, "sqlsink", str(gid), sink, 0, 0, 1)
    execute(conn, f"XA END {branch}")
    execute(conn, f"XA PREPARE {branch}")
    impatient = MariaDBBackend(connect(mariadb_server.url()), 0.3)
    with pytest.raises(TransientError, match="still attached"):
        impatient.commit_prepared(str(gid))
    impatient.conn.close()
    conn.close()  # the partition disconnects, as it must
    assert backend.commit_prepared(str(gid))
    assert backend.visible_markers([str(gid)]) == {str(gid)}


def test_truncate_is_not_guarded_on_mariadb(mariadb_server: MariaServer) -> None:
    """A DELETE of an incomplete decision is refused (the trigger keep_incomplete), but a
    TRUNCATE erases it: MariaDB has no TRUNCATE trigger and runs no DELETE trigger for it
    (PostgreSQL's commit log refuses both). In a commit log of its own, as root."""
    import pymysql

    root = mariadb_server.connect(root=True)
    db = "sqlsink_truncate"
    try:
        execute(root, f"DROP DATABASE IF EXISTS `{db}`")
        execute(root, f"CREATE DATABASE `{db}`")
        ensure_schema(root, db)
        sink = "m-trunc"
        assert commit_log.insert_decision(root, db, NewDecision(sink, 0, ("g",), 1, "q1", "r1"))
        with pytest.raises(pymysql.MySQLError) as refused:
            execute(root, f"DELETE FROM `{db}`.decisions WHERE sink_id = %s", (sink,))
        assert refused.value.args[0] == 1644  # the trigger's SIGNAL
        execute(root, f"TRUNCATE TABLE `{db}`.decisions")
        assert commit_log.decisions(root, db, sink) == {}
    finally:
        execute(root, f"DROP DATABASE IF EXISTS `{db}`")
        root.close()
