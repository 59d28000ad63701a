"""The primary/standby fixture (tests/fix_replica.py) itself: replication, a replay
pause, and an asynchronous failover that loses what the stream never carried."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.fix_replica import ReplicaPair, replicated_pair

DB = "replica_db"


def execute(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def ids(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [int(str(r[0])) for r in conn.execute("SELECT id FROM t ORDER BY id").fetchall()]


def prepared(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


def prepare(url: str, gid: str, row: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (%s)", (row,))
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))


def rollback_prepared(url: str) -> None:
    for gid in prepared(url):
        execute(url, f"ROLLBACK PREPARED '{gid}'")
    assert prepared(url) == []


def new_database(pair: ReplicaPair) -> None:
    execute(pair.primary_url(), f"CREATE DATABASE {DB}")
    execute(pair.primary_url(DB), "CREATE TABLE t (id int PRIMARY KEY)")


def test_standby_replays_the_primary_and_is_read_only(tmp_path: Path) -> None:
    with replicated_pair(tmp_path) as pair:
        new_database(pair)
        execute(pair.primary_url(DB), "INSERT INTO t SELECT generate_series(1, 3)")
        pair.wait_caught_up()
        assert ids(pair.standby_url(DB)) == [1, 2, 3]
        with psycopg.connect(pair.standby_url(DB), autocommit=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            # its own port won over the primary's, copied along in postgresql.conf
            ports = conn.execute(
                "SELECT setting, applied FROM pg_file_settings WHERE name = 'port' ORDER BY seqno"
            ).fetchall()
            assert ports[-1] == (str(pair.standby.port), True)
            assert (str(pair.primary.port), False) in ports
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute("INSERT INTO t VALUES (4)")


def test_promotion_replays_what_a_paused_standby_received(tmp_path: Path) -> None:
    """The pitfall: a replay pause hides rows from standby reads, yet promotion ends
    the pause and replays them, prepared transactions included."""
    with replicated_pair(tmp_path) as pair:
        new_database(pair)
        pair.wait_caught_up()
        pair.pause_replay()
        assert pair.replay_paused()
        execute(pair.primary_url(DB), "INSERT INTO t VALUES (1)")
        prepare(pair.primary_url(DB), "during_pause", 2)
        with pytest.raises(TimeoutError, match="standby replay"):
            pair.wait_caught_up(timeout_s=0.5)
        assert ids(pair.standby_url(DB)) == []
        assert prepared(pair.standby_url(DB)) == []

        pair.promote()
        assert ids(pair.standby_url(DB)) == [1]
        assert prepared(pair.standby_url(DB)) == ["during_pause"]
        for url in (pair.standby_url(DB), pair.primary_url(DB)):  # split brain: two of it
            rollback_prepared(url)


@pytest.mark.crash
def test_failover_after_detach_loses_what_the_primary_committed(tmp_path: Path) -> None:
    with replicated_pair(tmp_path) as pair:
        new_database(pair)
        execute(pair.primary_url(DB), "INSERT INTO t VALUES (1)")
        prepare(pair.primary_url(DB), "replicated", 2)
        pair.wait_caught_up()

        pair.detach_standby()
        assert not pair.streaming()
        execute(pair.primary_url(DB), "INSERT INTO t VALUES (3)")
        prepare(pair.primary_url(DB), "never_shipped", 4)
        assert ids(pair.primary_url(DB)) == [1, 3]
        pair.stop_primary("immediate")
        pair.promote()

        promoted = pair.standby_url(DB)
        assert ids(promoted) == [1]  # row 3 committed on the primary, lost
        assert prepared(promoted) == ["replicated"]
        execute(promoted, "INSERT INTO t VALUES (5)")  # writable
        execute(promoted, "COMMIT PREPARED 'replicated'")
        assert ids(promoted) == [1, 2, 5]
        assert prepared(promoted) == []
