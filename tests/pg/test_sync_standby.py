"""Waits at commit time for a synchronous standby that does not answer (issue 12 items 6
and 13; docs/DESIGN.md invariant 11).

A server of its own (``synchronous_standby_names`` is server-wide): with
``synchronous_standby_names = 'nobody'`` every PREPARE TRANSACTION, decision and
COMMIT PREPARED waits for a standby that never comes. PostgreSQL ends such a wait
only on a cancel or a statement timeout, with a WARNING that the transaction is
already done locally. The sink bounds each commit-time wait by ``lockTimeout`` and
then fails loudly, naming the standby; a second finisher of a gid another session is
committing ("is busy") waits for it and verifies instead of failing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from sqlsink.embedded import EmbeddedPostgres
from sqlsink.errors import CommitError, TransientError
from sqlsink.postgres import checks
from sqlsink.postgres.backend import PostgresBackend
from tests.pg.protocol import Writer, new_sink, prepared_of

pytestmark = pytest.mark.crash  # a server of its own, set to hang every commit


@pytest.fixture(scope="module")
def hanging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose commits wait for a synchronous standby ('nobody') that never answers,
    unless a session sets synchronous_commit = local."""
    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("syncrep")),
        settings={"synchronous_standby_names": "'nobody'"},
    )
    server.start()
    try:
        yield server.url()
    finally:
        server.destroy()


def local(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A session whose commits do not wait for the standby (for setting tests up)."""
    return psycopg.connect(url, autocommit=True, options="-c synchronous_commit=local")


def local_url(url: str) -> str:
    """The same server, for sessions whose commits do not wait for the standby."""
    return f"{url}?options=-c%20synchronous_commit%3Dlocal"


def fast_writer(url: str, table: str, sink: str, run: str = "run-1", **extra: str) -> Writer:
    extra = {"lockTimeout": "2s", **extra}
    return Writer(url, table, sink, query_id="q1", run=run, extra=extra)


def setup_table(url: str) -> str:
    table = f"t_{new_sink().replace('-', '_')}"
    with local(url) as conn:
        conn.execute("SET synchronous_commit = local")
        make_table_local(conn, table)
    return table


def make_table_local(conn: psycopg.Connection[tuple[object, ...]], table: str) -> None:
    from sqlsink.postgres.schema import ensure_schema

    ensure_schema(conn)  # type: ignore[arg-type]
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(sql.Identifier(table)))


def decide_locally(url: str, sink: str, batch: int, gids: list[str]) -> None:
    """The decision as the committer writes it, without waiting for the standby (the
    committer's own decision always waits: it sets synchronous_commit = on)."""
    with local(url) as conn, conn.transaction():
        conn.execute(
            "UPDATE sqlsink.sinks SET writer = 'stream', query_id = 'q1' WHERE sink_id = %s",
            (sink,),
        )
        conn.execute(
            "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, query_id, run_id) "
            "VALUES (%s, %s, %s, 5, 'q1', 'run-1')",
            (sink, batch, gids),
        )


def ids_local(url: str, table: str) -> list[int]:
    with local(url) as conn:
        found = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
        return [int(str(r[0])) for r in found]


def test_a_commit_waiting_for_a_standby_ends_and_names_it(hanging: str) -> None:
    """Item 6: the committer waited for the standby forever; now each of its writes is
    cancelled after lockTimeout (+1 s), and the error names the standby setting."""
    table = setup_table(hanging)
    sink = new_sink()
    outcome = fast_writer(local_url(hanging), table, sink).write(0, range(5))
    assert outcome.gid is not None
    writer = fast_writer(hanging, table, sink)  # the same run; its writes wait
    started = time.monotonic()
    with pytest.raises(CommitError) as failed:
        writer.commit(0, [outcome])
    waited = time.monotonic() - started
    assert waited < 15, f"the commit waited {waited:.0f} s"
    text = str(failed.value)
    # the run's registrations do not wait for a standby (docs/DESIGN.md 4.4): the first
    # write that does is the binding of the new sink to its query
    assert f"binding sink {sink} waited 3 s" in text
    assert "synchronous standby (synchronous_standby_names = 'nobody')" in text
    assert "pg_stat_replication" in text
    assert ids_local(hanging, table) == []


def test_commit_prepared_waiting_for_a_standby_ends_and_says_it_is_done_here(
    hanging: str,
) -> None:
    """Item 6, COMMIT PREPARED itself: cancelled, it is committed on this server (the
    error says so), and the batch completes at the next resolution."""
    table = setup_table(hanging)
    sink = new_sink()
    writer = fast_writer(local_url(hanging), table, sink)
    outcome = writer.write(0, range(5))
    assert outcome.gid is not None
    decide_locally(hanging, sink, 0, [outcome.gid])
    with psycopg.connect(hanging, autocommit=True) as conn:
        backend = PostgresBackend(conn, lock_timeout_s=1)  # type: ignore[arg-type]
        with pytest.raises(CommitError) as failed:
            backend.commit_prepared(outcome.gid)
    text = str(failed.value)
    assert (
        f"COMMIT PREPARED {outcome.gid} waited 2 s (the sink's lockTimeout plus a second) "
        "for a synchronous standby" in text
    )
    assert "it is committed on this server, but no standby confirmed it" in text
    assert ids_local(hanging, table) == list(range(5))
    report = writer.commit(0, [outcome])  # the restart: found committed, completed
    assert report.already_committed == [outcome.gid]
    assert prepared_of(hanging, sink) == []


def test_a_task_waiting_for_a_standby_ends_and_names_its_prepare(hanging: str) -> None:
    """Item 6, the task's side. Its run's registration is committed without waiting for
    a flush or a standby (docs/DESIGN.md 4.4: the next durable step carries it), so its
    first wait is its PREPARE TRANSACTION: bounded, named, and the prepared transaction
    left for the retry or Spark's abort, as below."""
    table = setup_table(hanging)
    sink = new_sink()
    writer = fast_writer(hanging, table, sink)
    started = time.monotonic()
    with pytest.raises(TransientError) as failed:
        writer.write(0, range(5))
    assert time.monotonic() - started < 15
    text = str(failed.value)
    assert f"sink {sink}, batch 0, partition 0: PREPARE TRANSACTION sqlsink_{sink}_0_0_" in text
    assert "synchronous_standby_names = 'nobody'" in text
    with local(hanging) as conn:  # registered, though nothing waited for it
        row = conn.execute(
            "SELECT count(*) FROM sqlsink.runs WHERE sink_id = %s AND run_id = 'run-1'", (sink,)
        ).fetchone()
    assert row is not None and row[0] == 1
    assert len(prepared_of(hanging, sink)) == 1
    fast_writer(local_url(hanging), table, sink).abort(0, [None])  # Spark's abort, same run
    assert prepared_of(hanging, sink) == []
    assert ids_local(hanging, table) == []


def test_a_prepare_waiting_for_a_standby_ends_and_names_it(hanging: str) -> None:
    """Item 6, PREPARE TRANSACTION itself. The task's session here does not wait for the
    standby (synchronous_commit = local) except in its data transaction, which a trigger
    on the table switches back to on: so its first wait is its PREPARE."""
    table = setup_table(hanging)
    with local(hanging) as conn:
        conn.execute(
            "CREATE FUNCTION wait_for_standby() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM set_config('synchronous_commit', 'on', true); RETURN NULL; END $$"
            if not _function_exists(conn, "wait_for_standby")
            else "SELECT 1"
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER wait_for_standby AFTER INSERT ON {} "
                "FOR EACH STATEMENT EXECUTE FUNCTION wait_for_standby()"
            ).format(sql.Identifier(table))
        )
    sink = new_sink()
    writer = fast_writer(local_url(hanging), table, sink)
    started = time.monotonic()
    with pytest.raises(TransientError) as failed:
        writer.write(0, range(5))
    assert time.monotonic() - started < 15
    text = str(failed.value)
    assert f"sink {sink}, batch 0, partition 0: PREPARE TRANSACTION sqlsink_{sink}_0_0_" in text
    assert "synchronous_standby_names = 'nobody'" in text
    assert "committed on this server" in text
    # prepared here, not confirmed: the task's retry adopts it, or Spark's abort ends it
    assert len(prepared_of(hanging, sink)) == 1
    writer.abort(0, [None])
    assert prepared_of(hanging, sink) == []
    assert ids_local(hanging, table) == []


def _function_exists(conn: psycopg.Connection[tuple[object, ...]], name: str) -> bool:
    row = conn.execute("SELECT to_regproc(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def test_a_second_finisher_of_a_busy_gid_waits_and_verifies(hanging: str) -> None:
    """Item 13: a late attempt's self-rollback (here: any session's COMMIT PREPARED) is
    still waiting for the standby when the committer finishes the same gid; the
    committer got "is busy" (SQLSTATE 55000) and failed the batch. Now it waits for the
    other session, then verifies by the marker."""
    table = setup_table(hanging)
    sink = new_sink()
    writer = fast_writer(local_url(hanging), table, sink, lockTimeout="20s")
    outcome = writer.write(0, range(5))
    assert outcome.gid is not None
    decide_locally(hanging, sink, 0, [outcome.gid])
    gid = outcome.gid

    def finish_elsewhere() -> None:  # waits for the standby until cancelled below
        with psycopg.connect(hanging, autocommit=True) as other:
            other.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))

    other = threading.Thread(target=finish_elsewhere, daemon=True)
    other.start()
    _wait_until_waiting_for_standby(hanging, gid)
    cancel = threading.Timer(1.5, _cancel_standby_waits, args=(hanging, gid))
    cancel.start()
    report = writer.commit(0, [outcome])
    other.join(10)
    cancel.join()
    assert report.already_committed == [gid]
    assert ids_local(hanging, table) == list(range(5))
    assert prepared_of(hanging, sink) == []


def test_check_says_what_bounds_a_wait_for_a_standby(hanging: str) -> None:
    with local(hanging) as conn:
        findings = {f.setting: f for f in checks.check_server(conn)}  # type: ignore[arg-type]
    found = findings["synchronous_standby_names"]
    assert found.level == "warning"
    assert found.value == "nobody"
    assert "no synchronous standby is connected" in found.message
    assert "lockTimeout" in found.message
    assert found.fix is not None and "synchronous_standby_names" in found.fix


def test_check_is_quiet_without_synchronous_replication(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        findings = {f.setting: f for f in checks.check_server(conn)}  # type: ignore[arg-type]
    assert findings["synchronous_standby_names"].level == "ok"


def _wait_until_waiting_for_standby(url: str, gid: str) -> None:
    deadline = time.monotonic() + 10
    with local(url) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                "AND query LIKE %s",
                (f"COMMIT PREPARED%{gid}%",),
            ).fetchone()
            if row and int(str(row[0])):
                return
            time.sleep(0.05)
    pytest.fail("the other session never waited for the standby")


def _cancel_standby_waits(url: str, gid: str) -> None:
    with local(url) as conn:
        conn.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
            "AND query LIKE %s",
            (f"COMMIT PREPARED%{gid}%",),
        )
