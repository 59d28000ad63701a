"""Upgrading the commit log under load (issue 12 item 20): bounded, and never stuck
behind the leftovers that the upgrade itself must let the sink resolve."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from sqlsink import cli
from sqlsink.core.checkpoint_check import Verdict
from sqlsink.core.committer import Committer
from sqlsink.core.model import PartitionOutcome, ResolutionReport
from sqlsink.errors import ConfigError
from sqlsink.postgres import checkpoint_records, run_registry
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.schema import (
    ensure_schema,
    ensure_schema_version,
    installed_version,
    latest_version,
    migrations,
)
from tests.fix_pg import PgServer, prepared_transactions, rollback_all_prepared
from tests.pg.protocol import Writer, ids_of, prepared_of

RELEASED = 2  # the commit log of the release before issue 12
MARKERS_LOCKED = 5  # the first migration that locks sqlsink.markers (markers.xid)


def install_released(url: str) -> None:
    """The commit log as the previous release left it."""
    with psycopg.connect(url, autocommit=True) as conn:
        for version, path in migrations():
            if version <= RELEASED:
                conn.execute(path.read_text(encoding="utf-8").encode())


def test_an_upgrade_with_a_prepared_leftover_neither_waits_nor_strands_it(
    pg_server: PgServer,
) -> None:
    with pg_server.database("mig") as url:
        install_released(url)
        table = "events"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE events (id bigint PRIMARY KEY)")
            # a release-2 batch: decided, one gid committed, the driver died (the
            # leftover holds its locks on the target and on sqlsink.markers)
            conn.execute("INSERT INTO sqlsink.sinks (sink_id, query_id) VALUES ('old', 'q-old')")
        old = Writer(url, table, "old", query_id="q-old", run="run-old")
        gids = []
        for partition, ids in enumerate((range(5), range(5, 10))):
            with psycopg.connect(url) as conn:  # the release-2 partition transaction
                gid = f"sqlsink_old_7_{partition}_run-old_{partition + 1}"
                conn.execute(
                    "INSERT INTO events SELECT generate_series(%s::bigint, %s::bigint)",
                    (ids[0], ids[-1]),
                )
                conn.execute(
                    "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
                    "VALUES (%s, 'old', 7, %s, 5)",
                    (gid, partition),
                )
                conn.execute(f"PREPARE TRANSACTION '{gid}'")
                gids.append(gid)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, query_id, run_id) "
                "VALUES ('old', 7, %s, 10, 'q-old', 'run-old')",
                (gids,),
            )
            conn.execute(f"COMMIT PREPARED '{gids[0]}'")
            started = time.monotonic()
            # up to version 4 at once; 5 (a column of markers, which the leftover holds)
            # waits for the lock without queueing for it, and the sink runs meanwhile
            assert ensure_schema(conn) == MARKERS_LOCKED - 1  # type: ignore[arg-type]
            assert time.monotonic() - started < 5
            assert installed_version(conn) == MARKERS_LOCKED - 1  # type: ignore[arg-type]
            writer = conn.execute("SELECT writer FROM sqlsink.sinks").fetchone()
            assert writer == ("stream",)
            # the old-format leftover still resolves: the batch is finished, not lost
            _, report = Committer(PostgresBackend(conn), "old").recover()  # type: ignore[arg-type]
            # markers free: the rest of the upgrade goes through
            assert ensure_schema(conn) == latest_version()  # type: ignore[arg-type]
            assert installed_version(conn) == latest_version()  # type: ignore[arg-type]
        assert report.committed == [gids[1]] and report.lost == []
        assert ids_of(url, table) == list(range(10))
        assert prepared_of(url, "old") == []
        # and the next run of the same query goes on at batch 8
        old.batch(8, range(10, 15))
        assert ids_of(url, table) == list(range(15))


def test_a_blocked_migration_gives_up_in_bounded_time_and_names_the_blocker(
    pg_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sqlsink.postgres.schema.MIGRATION_LOCK_TIMEOUT_S", 1.0)
    with pg_server.database("mig") as url:
        install_released(url)
        holding = threading.Event()
        release = threading.Event()

        def reader() -> None:  # a long report on the commit log, in one transaction
            with psycopg.connect(url, application_name="nightly report") as conn:
                conn.execute("SELECT count(*) FROM sqlsink.decisions")
                holding.set()
                release.wait(30)

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert holding.wait(10)
            started = time.monotonic()
            with (
                psycopg.connect(url, autocommit=True) as conn,
                pytest.raises(ConfigError) as refused,
            ):
                ensure_schema(conn)  # type: ignore[arg-type]
            assert time.monotonic() - started < 5
        finally:
            release.set()
            thread.join()
        message = str(refused.value)
        assert f"version {latest_version()}" in message and "nightly report" in message
        assert "sqlsink.decisions" in message and "pg_terminate_backend" in message
        with psycopg.connect(url, autocommit=True) as conn:
            assert installed_version(conn) == RELEASED  # type: ignore[arg-type]
            assert ensure_schema(conn) == latest_version()  # type: ignore[arg-type]


def test_version_4_adds_the_checkpoint_check_to_the_runs_of_version_3(
    pg_server: PgServer,
) -> None:
    """Runs recorded under version 3 keep their rows (never checked); a check recorded
    afterwards is what status reads (issue 12 item 4)."""
    with pg_server.database("mig") as url, psycopg.connect(url, autocommit=True) as conn:
        for version, path in migrations():
            if version <= 3:
                conn.execute(path.read_text(encoding="utf-8").encode())
        assert run_registry.register_run(conn, "s", "run-3", 300, holds_lock=False) is None  # type: ignore[arg-type]
        started = time.monotonic()
        assert ensure_schema(conn) == latest_version() >= 4  # type: ignore[arg-type]
        assert time.monotonic() - started < 5
        assert checkpoint_records.checkpoint_checks(conn, "s") == []  # type: ignore[arg-type]
        verdict = Verdict("loss", "batches 3, 4 in commits/ of /chk but not decided", (3, 4))
        checkpoint_records.record_checkpoint_check(conn, "s", "run-3", 5, "/chk", verdict)  # type: ignore[arg-type]
        [row] = checkpoint_records.checkpoint_checks(conn, "s")  # type: ignore[arg-type]
        assert (row.run_id, row.newest, row.verdict, row.lost, row.location, row.batch_id) == (
            "run-3",
            True,
            "loss",
            (3, 4),
            "/chk",
            5,
        )
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE sqlsink.runs SET checkpoint_verdict = 'fine'")


def test_version_5_waits_for_markers_and_then_records_each_partitions_xid(
    pg_server: PgServer,
) -> None:
    """Version 5 adds markers.xid (the consistent view, issue 13). A partition prepared
    under version 4 holds sqlsink.markers: the upgrade is deferred, never queued behind
    it (a queued ACCESS EXCLUSIVE request would stall every partition behind it), and
    ``ensure_schema_version`` gives up in bounded time naming the holder. Once free, it
    applies; the old marker keeps a NULL xid, a new one gets its transaction's id, which
    is the xmin of the rows it wrote."""
    with pg_server.database("mig") as url, psycopg.connect(url, autocommit=True) as conn:
        for version, path in migrations():
            if version < MARKERS_LOCKED:
                conn.execute(path.read_text(encoding="utf-8").encode())
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY)")
        gid = "sqlsink_s_1_0_run-4_1"
        with psycopg.connect(url) as partition:
            partition.execute("INSERT INTO events VALUES (1)")
            partition.execute(
                "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
                "VALUES (%s, 's', 1, 0, 1)",
                (gid,),
            )
            partition.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            started = time.monotonic()
            assert ensure_schema(conn) == MARKERS_LOCKED - 1  # type: ignore[arg-type]
            assert time.monotonic() - started < 2
            with pytest.raises(ConfigError) as refused:
                ensure_schema_version(conn, MARKERS_LOCKED, why="option X", timeout_s=0.5)  # type: ignore[arg-type]
            assert time.monotonic() - started < 5
            message = str(refused.value)
            assert "option X needs the commit log at version 5" in message
            assert gid in message and "sqlsink recover" in message
        finally:
            conn.execute(f"COMMIT PREPARED '{gid}'")
        ensure_schema_version(conn, MARKERS_LOCKED, why="option X")  # type: ignore[arg-type]
        assert installed_version(conn) == latest_version()  # type: ignore[arg-type]
        with psycopg.connect(url) as partition:
            partition.execute("INSERT INTO events VALUES (2)")
            partition.execute(
                "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
                "VALUES ('sqlsink_s_2_0_run-5_1', 's', 2, 0, 1)"
            )
        rows = conn.execute(
            "SELECT e.id, m.xid IS NULL, m.xid = e.xmin FROM events e "
            "JOIN sqlsink.markers m ON m.batch_id = e.id ORDER BY e.id"
        ).fetchall()
        assert rows == [(1, True, None), (2, False, True)]


def upgrade_stops() -> list[int]:
    """The versions an upgrade may stop at: just below each migration that locks a table
    which prepared partitions hold (a ``-- lock:`` line), when a log below it exists."""
    return sorted(
        {
            version - 1
            for version, path in migrations()
            if "\n-- lock: " in path.read_text(encoding="utf-8") and version > 1
        }
    )


@pytest.mark.parametrize("stop", upgrade_stops())
def test_a_whole_batch_commits_at_every_version_an_upgrade_may_stop_at(
    pg_server: PgServer, stop: int
) -> None:
    """A migration deferred while prepared partitions hold sqlsink.markers leaves the log
    at an older version: the sink's planning says so (ensure_schema returns it) and goes
    on, so its tasks and its commit, which do not call ensure_schema again, must work at
    that version. Then the upgrade completes once the lock is free."""
    table, sink = "events", "fresh"
    with pg_server.database("mig") as url:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                for version, path in migrations():
                    if version <= stop:
                        conn.execute(path.read_text(encoding="utf-8").encode())
                conn.execute("CREATE TABLE events (id bigint PRIMARY KEY)")
                conn.execute("CREATE TABLE other (id bigint)")
            # another sink's partition, prepared by the release of that version (in flight,
            # or left by a crash): it holds sqlsink.markers until it is finished
            leftover = "sqlsink_other_3_0_run-old_1"
            with psycopg.connect(url) as partition:
                partition.execute("INSERT INTO other VALUES (1)")
                partition.execute(
                    "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
                    "VALUES (%s, 'other', 3, 0, 1)",
                    (leftover,),
                )
                partition.execute(f"PREPARE TRANSACTION '{leftover}'")
            writer = Writer(url, table, sink, query_id="q-fresh", token="driver-token")

            def whole_batch(batch: int, ids: range) -> ResolutionReport:
                """Planning (ensure_schema, the target), two tasks, the commit."""
                with psycopg.connect(url, autocommit=True) as conn:
                    installed = ensure_schema(conn)  # type: ignore[arg-type]
                half = ids[0] + len(ids) // 2
                outcomes: list[PartitionOutcome | None] = [
                    writer.write(batch, range(ids[0], half), 0),
                    writer.write(batch, range(half, ids[-1] + 1), 1),
                ]
                options = writer.options
                with psycopg.connect(url, autocommit=True) as conn:
                    committer = Committer(
                        PostgresBackend(conn, options.lock_timeout_s),  # type: ignore[arg-type]
                        sink,
                        timeouts=options.timeouts,
                        run_timeout_s=options.run_timeout_s,
                        tables=[str(options.table)],
                    )
                    report = committer.commit_batch(
                        batch, outcomes, query_id=writer.query_id, run_id=writer.run
                    )
                print(f"batch {batch} at version {installed}: committed {report.committed}")
                return report

            with psycopg.connect(url, autocommit=True) as conn:
                assert ensure_schema(conn) == stop  # type: ignore[arg-type]
            for batch in (0, 1):  # the run's first batch and a later one, while deferred
                assert len(whole_batch(batch, range(batch * 10, batch * 10 + 10)).committed) == 2
            assert ids_of(url, table) == list(range(20))
            assert prepared_of(url, sink) == []
            assert prepared_of(url, "other") == [leftover]
            with psycopg.connect(url, autocommit=True) as conn:
                assert installed_version(conn) == stop  # type: ignore[arg-type]
                rows = conn.execute(
                    "SELECT batch_id, rows, cardinality(gids), completed_at IS NOT NULL "
                    "FROM sqlsink.decisions WHERE sink_id = %s ORDER BY batch_id",
                    (sink,),
                ).fetchall()
                assert rows == [(0, 10, 2, True), (1, 10, 2, True)]
            # and the operator's view of it at that version
            assert cli.main(["status", "--url", url, "--sink-id", sink]) == 0
            with psycopg.connect(url, autocommit=True) as conn:
                # the other sink's leftover is finished (undecided: rolled back), the lock is
                # free, and the upgrade completes at the next planning
                _, report = Committer(PostgresBackend(conn), "other").recover()  # type: ignore[arg-type]
                assert report.rolled_back == [leftover]
            assert len(whole_batch(2, range(20, 30)).committed) == 2
            with psycopg.connect(url, autocommit=True) as conn:
                assert installed_version(conn) == latest_version()  # type: ignore[arg-type]
                tables = conn.execute(
                    "SELECT batch_id, tables, figures ->> 'rows', commit_ms IS NOT NULL "
                    "FROM sqlsink.decisions WHERE sink_id = %s ORDER BY batch_id",
                    (sink,),
                ).fetchall()
            # decisions written before version 8 name no table (NULL), as documented, and
            # those before 9 keep no figures (commit_ms, of version 2, they have)
            assert tables == [
                (0, None, None, True),
                (1, None, None, True),
                (2, ["public.events"], "10", True),
            ]
            assert ids_of(url, table) == list(range(30))
            assert prepared_of(url, sink) == [] and prepared_of(url, "other") == []
        finally:  # whatever failed: nothing stays prepared in the database
            database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
            mine = [t for t in prepared_transactions(url) if t[1] == database]
            rollback_all_prepared(pg_server, mine)
