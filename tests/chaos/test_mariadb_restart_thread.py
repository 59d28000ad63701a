"""The chaos rounds crash ``mariadbd`` from a helper thread mid-run
(tests/chaos/test_chaos_mariadb.py): SIGKILL, then a start on the same data directory
(sqlsink.mariadb.embedded's launch). The server started must outlive the thread that
started it: ``PR_SET_PDEATHSIG`` (``setpriv --pdeathsig``) fires when the *thread* that
forked the child ends, not its process, so a server started by a short-lived thread was
SIGKILLed as soon as that thread returned (found by a long chaos run: connection refused
right after a run whose mid-run crash restarted the server)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.fix_mariadb import MariaServer


def test_a_server_restarted_by_a_thread_outlives_the_thread(mariadb_server: MariaServer) -> None:
    if mariadb_server.process is None:
        pytest.skip("only a server this run started can be crashed (SQLSINK_TEST_MARIADB_URL)")
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            mariadb_server.kill_and_restart()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=restart)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and errors == []
    try:
        time.sleep(1.0)  # (a death signal is delivered at once; a second is plenty)
        assert mariadb_server.process is not None
        assert mariadb_server.process.poll() is None, (
            f"mariadbd, started by a thread that ended, died with "
            f"{mariadb_server.process.returncode}"
        )
        conn = mariadb_server.connect(root=True)
        conn.close()
    finally:
        if mariadb_server.process is not None and mariadb_server.process.poll() is not None:
            mariadb_server.kill_and_restart()  # (in this thread) for the tests after this one
