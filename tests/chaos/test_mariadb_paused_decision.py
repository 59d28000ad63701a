"""Found by the MariaDB chaos rounds (tests/chaos/test_chaos_mariadb.py, seed 31, rounds 3
and 7): a driver paused inside its decision transaction (fault point ``in_decision``, a
long GC pause or SIGSTOP) held InnoDB's lock on the sink's row in ``sqlsink.sinks``
(its ``INSERT IGNORE`` and ``UPDATE`` of that row), so the next run's tasks could not
register: each waited ``innodb_lock_wait_timeout`` and failed with a bare
``(1205, 'Lock wait timeout exceeded')``, the query failed, and the paused driver was
never fenced. A registration must not wait for another run's open decision (on
PostgreSQL it does not): the new run registers at once and supersedes the paused one."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from sqlsink.core.model import NewDecision
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, rows
from sqlsink.mariadb.schema import ensure_schema
from tests.fix_mariadb import MariaServer
from tests.mariadb.protocol import forget_sink, new_sink

PAUSE_S = 6.0
LOCK_TIMEOUT_S = 3.0


def test_a_run_registers_beside_a_decision_paused_in_its_transaction(
    mariadb_server: MariaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, sink = mariadb_server.url(), new_sink()
    old, new = uuid.uuid4().hex, uuid.uuid4().hex
    zombie_conn, conn = connect(url), connect(url)
    ensure_schema(conn)
    zombie, backend = MariaDBBackend(zombie_conn, 10.0), MariaDBBackend(conn, LOCK_TIMEOUT_S)
    try:
        assert zombie.register_run(sink, old, 30.0, holds_lock=False) is None
        zombie.insert_decision(NewDecision(sink, 0, (), 0, "q1", old))  # the sink is bound
        faults = tmp_path / "faults.json"
        faults.write_text(
            json.dumps([{"point": "in_decision", "batch": 1, "action": "sleep",
                         "seconds": PAUSE_S}])
        )  # fmt: skip
        monkeypatch.setenv("SQLSINK_FAULTS_FILE", str(faults))
        paused = threading.Thread(
            target=zombie.insert_decision, args=(NewDecision(sink, 1, (), 0, "q1", old),)
        )
        paused.start()
        time.sleep(1.0)  # the decision's transaction is open, paused in it
        monkeypatch.delenv("SQLSINK_FAULTS_FILE")
        started = time.monotonic()
        try:
            fenced = backend.register_run(sink, new, 30.0, holds_lock=False)
            took = time.monotonic() - started
        finally:
            paused.join(PAUSE_S + 10)
        assert fenced is None
        assert took < 1.0, f"the registration waited {took:.1f} s for the paused decision"
        superseded = rows(
            conn,
            "SELECT run_id, superseded_by FROM sqlsink.runs WHERE sink_id = %s ORDER BY run_id",
            (sink,),
        )
        assert dict((str(r), s) for r, s in superseded) == {old: new, new: None}
    finally:
        zombie_conn.close()
        conn.close()
        forget_sink(url, sink)
