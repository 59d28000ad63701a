"""Attacks on the commit log's hand-over record (sql/011_handovers.sql) at the database
level: a writer role that does not own the schema (its grants predate version 11),
and a schema still at version 10."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from sqlsink.errors import ConfigError
from sqlsink.postgres import commit_log
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.schema import ensure_schema


@pytest.fixture
def granted_before_11(pg_url: str) -> Iterator[str]:
    """A role given the commit log's tables the way tests/pg/test_committer.py does (ALL
    TABLES IN SCHEMA sqlsink), before the upgrade to version 11 added sqlsink.handovers:
    as if granted then, it has nothing on that table. Yields its URL."""
    role = f"pre11_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        ensure_schema(admin)
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for grant in (
            "GRANT USAGE ON SCHEMA sqlsink TO {}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA sqlsink TO {}",
            "REVOKE ALL ON sqlsink.handovers FROM {}",
        ):
            admin.execute(sql.SQL(grant).format(sql.Identifier(role)))
    try:
        yield psycopg.conninfo.make_conninfo(pg_url, user=role)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_check_names_the_missing_grant_on_the_handover_table(granted_before_11: str) -> None:
    """After the owner's upgrade to version 11, the writer's role may read and write every
    table of the commit log but sqlsink.handovers: each stream batch's check reads and
    writes it, so the stream stops at its next batch. ``sqlsink check`` must say so, with
    the grant, before that happens."""
    with psycopg.connect(granted_before_11, autocommit=True) as conn:
        for step in (
            lambda b: b.handovers("any-sink"),
            lambda b: b.record_handover("any-sink", "r1", 0),
        ):  # what the writer's check meets: the grant named, not a bare permission error
            with pytest.raises(
                ConfigError, match=r"GRANT SELECT, INSERT, UPDATE ON sqlsink\.handovers"
            ):
                step(PostgresBackend(conn))
    done = subprocess.run(
        [sys.executable, "-m", "sqlsink", "check", "--url", granted_before_11, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    text = json.dumps(report)
    assert "sqlsink.handovers" in text, text[:2000]


def test_before_version_11_nothing_is_recorded_and_nothing_refused(pg_url: str) -> None:
    """A schema not yet at 11 (the table absent): the record is a no-op, the check finds
    nothing; once the table exists, both work on the same connection (no cached answer)."""
    sink = f"h10-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)
        backend = PostgresBackend(conn)
        with conn.transaction():
            conn.execute("ALTER TABLE sqlsink.handovers RENAME TO handovers_hidden")
            try:
                assert not commit_log.has_handovers(conn)
                backend.record_handover(sink, "r1", 3)
                assert backend.handovers(sink) == []
            finally:
                conn.execute("ALTER TABLE sqlsink.handovers_hidden RENAME TO handovers")
        backend.record_handover(sink, "r1", 3)
        assert [(h.run_id, h.batch_id) for h in backend.handovers(sink)] == [("r1", 3)]
        conn.execute("DELETE FROM sqlsink.handovers WHERE sink_id = %s", (sink,))


def test_forget_removes_the_hand_overs_so_a_reused_sink_id_starts_clean(
    pg_url: str, table: str
) -> None:
    """A stream's sink with an undecided hand-over above its highest decision (the loss
    the writer refuses over), then ``sqlsink forget`` as the runbook's last resort: the
    sink id reused by a new query must not meet the old run's hand-over."""
    from tests.pg.protocol import Writer, make_table, new_sink

    make_table(pg_url, table)
    sink = new_sink()
    writer = Writer(pg_url, table, sink, str(uuid.uuid4()))
    writer.batch(0, range(3))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        PostgresBackend(conn).record_handover(sink, writer.run, 1)
        conn.execute(  # the query stopped long ago: its run is dead
            "UPDATE sqlsink.runs SET heartbeat_at = clock_timestamp() - interval '1 day' "
            "WHERE sink_id = %s",
            (sink,),
        )
    done = subprocess.run(
        [sys.executable, "-m", "sqlsink", "forget", "--url", pg_url, "--sink-id", sink],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert PostgresBackend(conn).handovers(sink) == []
