"""Attack (atk-fixes) on 89a5150: recover --commit-lost while the sink's lock stays held
past --lock-timeout. docs/reference/json.md's exit codes: 1 for 'a sink whose lock stayed
held past --lock-timeout: recover and forget refuse it'; forget and plain recover name
the holder (MariaDB: 'connection N') and the fix that ends it (KILL CONNECTION N).
Real private mariadbd (tests/fix_mariadb.py)."""

from __future__ import annotations

import time
import uuid

from sqlsink.mariadb.connection import connect, rows
from sqlsink.mariadb.locks import lock_name
from tests.fix_mariadb import MariaServer
from tests.mariadb.protocol import Writer, forget_sink, make_table, new_sink
from tests.pg.test_cli import sqlsink


def test_commit_lost_with_the_lock_held_is_a_refusal_naming_the_holder(
    mariadb_server: MariaServer,
) -> None:
    url = mariadb_server.url()
    w = Writer(url, f"t_{uuid.uuid4().hex[:8]}", new_sink(), live_s=1)
    make_table(url, w.table)
    try:
        w.batch(0, range(0, 5))
        time.sleep(1.2)
        holder = connect(url)
        try:
            assert rows(holder, "SELECT GET_LOCK(%s, 0)", (lock_name(w.sink),))[0][0] == 1
            conn_id = rows(holder, "SELECT CONNECTION_ID()")[0][0]
            done = sqlsink(
                "recover", "--json", "--sink-id", w.sink, "--commit-lost", "0",
                "--lock-timeout", "500ms", "--url", url,
            )  # fmt: skip
        finally:
            holder.close()
        text = done.out + done.err
        assert "still held after 0.5s" in text, text
        assert done.code == 1, (done.code, text)  # a refusal, as forget's and recover's
        assert f"connection {conn_id}" in text, text  # who holds it, as forget says
        assert f"KILL CONNECTION {conn_id}" in text, text  # the fix that ends it
    finally:
        forget_sink(url, w.sink)
