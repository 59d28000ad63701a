"""A streaming query whose database password rotates while it runs.

The server checks passwords (scram-sha-256, ``tests.fix_auth.password_server``); the
query gets its password from a ``passwordCommand`` reading a secret store. The role's
password is changed between micro-batches of one running query, and between a failed
commit and the restart that recovers it: the driver's committer and the (reused)
Python workers hold the old password in their caches, are refused (28P01), ask the
command again and go on. Every row lands exactly once.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.credentials import PasswordSource
from sqlsink.postgres.connection import connect
from sqlsink.postgres.sessions import IDLE_NAME
from tests.fix_auth import PasswordServer, password_server
from tests.spark.streams import (
    SCHEMA,
    add_source_file,
    decided_batches,
    run_query,
    start_query,
    table_ids,
    write_source,
)

pytestmark = pytest.mark.spark
__all__ = ["password_server"]

PASSWORDS = ["first-Pa55word", "second-Pa55word", "third-Pa55word", "fourth-Pa55word"]


def make_table(server: PasswordServer) -> dict[str, str]:
    """The sink's options, and its table made by the sink's role."""
    server.rotate(PASSWORDS[0])
    PasswordSource.from_command(server.command).forget()  # this process's cache, for a start
    table = f"t_{uuid.uuid4().hex[:8]}"
    source = PasswordSource.from_command(server.command)
    with connect(server.url, source, application_name="test") as conn:
        columns = "id bigint, payload text, ts timestamptz, amount float8"
        create = sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), sql.SQL(columns))
        conn.execute(create)
    return {"url": server.url, "table": table, "passwordCommand": server.command}


def prepared(server: PasswordServer) -> list[str]:
    with connect(server.admin_url, application_name="test") as conn:
        return [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts")]


def end_kept_sessions(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (IDLE_NAME,),
        )


def test_the_password_changes_between_micro_batches(
    spark: Any, tmp_path: Path, password_server: PasswordServer
) -> None:
    opts = make_table(password_server)
    source = tmp_path / "src"
    source.mkdir()
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    writer = events.repartition(2).writeStream.format("sqlsink")
    query = (
        writer.options(**opts)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    calls = []
    try:
        for batch, password in enumerate([None, PASSWORDS[1], PASSWORDS[2]]):
            if password:  # after batch N committed, before batch N+1 starts
                password_server.rotate(password)
                # sessions the sink keeps between batches logged in with the old password
                # and stay good (PostgreSQL does not end them); rotations usually end them
                # too: then the next batch needs new connections, with the new password
                end_kept_sessions(password_server.admin_url)
            add_source_file(source, batch, range(batch * 10, batch * 10 + 10))
            query.processAllAvailable()
            calls.append(password_server.calls())
        progress = json.dumps(query.recentProgress, default=str)
    finally:
        query.stop()
    assert query.exception() is None
    assert table_ids(password_server.admin_url, opts["table"]) == list(range(30))
    sink_id = str(query.id)
    assert decided_batches(password_server.admin_url, sink_id) == {0: True, 1: True, 2: True}
    assert calls[1] > calls[0] and calls[2] > calls[1]  # asked again after each change
    for password in PASSWORDS:
        assert password not in progress


def test_the_password_changes_between_a_failed_commit_and_its_recovery(
    spark: Any, tmp_path: Path, password_server: PasswordServer, faults: Any
) -> None:
    """The role's password changes while batch 1 is being committed, before the secret
    store has the new one: the commit fails right after its decision, and Spark's abort
    cannot connect (refused, a fresh password from the store too), so batch 1's
    partitions stay prepared. Once the store has the new password, the restarted query
    commits them and goes on."""
    opts = make_table(password_server)
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(0, 10), range(10, 20)])
    faults(
        [
            {"point": "before_decision", "batch": 1, "action": "sleep", "seconds": 3},
            {"point": "after_decision", "batch": 1, "action": "raise"},
        ]
    )
    query = start_query(spark, source, checkpoint, opts)
    deadline = time.monotonic() + 120
    while not faults.fired() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert faults.fired(), "batch 1 never reached its decision"
    password_server.rotate(PASSWORDS[3], store=False)  # the server first, the store later
    with pytest.raises(Exception, match="Writing job failed"):  # the commit, then the abort
        query.awaitTermination()
    left = prepared(password_server)
    assert len(left) == 2  # batch 1's partitions, decided, not committed
    faults([])
    password_server.rotate(PASSWORDS[3])  # the store catches up
    add_source_file(source, 2, range(20, 30))
    run_query(spark, source, checkpoint, opts)
    assert table_ids(password_server.admin_url, opts["table"]) == list(range(30))
    assert prepared(password_server) == []
