"""Two partitions of a new sink's first batch register their run at once (seen in
tests/spark/test_mariadb_stream.py: a task failed with InnoDB's deadlock, 1213, in
``register_run``, so the query failed under a master that does not retry tasks). Each
registration inserts the sink's row (INSERT IGNORE) and then locks it: two sessions'
inserts of the same new key take shared locks on the duplicate and both then wait for
the exclusive one. A registration must never fail for that: every thread registers."""

from __future__ import annotations

import threading
import uuid

from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect
from sqlsink.mariadb.schema import ensure_schema
from tests.fix_mariadb import MariaServer

THREADS = 6
SINKS = 15


def test_concurrent_first_registrations_of_a_new_sink_all_succeed(
    mariadb_server: MariaServer,
) -> None:
    url = mariadb_server.url()
    setup = connect(url)
    ensure_schema(setup)
    setup.close()
    conns = [connect(url) for _ in range(THREADS)]
    backends = [MariaDBBackend(c, 10.0) for c in conns]
    errors: list[BaseException] = []
    try:
        for _ in range(SINKS):
            sink = f"race-{uuid.uuid4().hex[:8]}"
            gate = threading.Barrier(THREADS)

            def register(
                backend: MariaDBBackend, sink: str = sink, gate: threading.Barrier = gate
            ) -> None:
                gate.wait(10)
                try:
                    backend.register_run(sink, "run-1", 60.0, holds_lock=False)
                except BaseException as exc:  # collected: the test names every failure
                    errors.append(exc)

            threads = [threading.Thread(target=register, args=(b,)) for b in backends]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    finally:
        for c in conns:
            c.close()
    assert errors == []
