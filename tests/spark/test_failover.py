"""The database behind the checkpoint (issue 12 item 4), with a real failover.

A streaming query writes to a primary with an asynchronous streaming standby. The
standby's replay is paused (it still receives WAL: promotion replays it, so that
batch is not lost), then the stream is cut and two more batches are committed on
the primary only. The primary crashes, the standby is promoted, and the query is
restarted on the same checkpoint against the promoted server: Spark's commits/
records batches whose decisions the database no longer has. Spark never runs them
again, so the query must stop with a data-loss error naming exactly those batches,
write nothing and leave nothing prepared. Then the way out the error gives
(re-run from the first lost batch) brings every record in exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fix_replica import ReplicaPair, replicated_pair
from tests.spark.streams import (
    add_source_file,
    decided_batches,
    query_id,
    run_query,
    table_ids,
    write_source,
)

pytestmark = [pytest.mark.spark, pytest.mark.crash]
DB = "failover"
TABLE = "events"
BATCHES = [range(n * 10, n * 10 + 10) for n in range(7)]


def one(url: str, query: str, params: tuple[object, ...] = ()) -> tuple[Any, ...]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return tuple(row)


def prepared(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return [str(r[0]) for r in conn.execute("SELECT gid FROM pg_prepared_xacts")]


def wait_received(pair: ReplicaPair, timeout_s: float = 30.0) -> None:
    """Wait until the standby has received (not replayed) all WAL the primary wrote."""
    (target,) = one(pair.primary_url(), "SELECT pg_current_wal_lsn()::text")
    deadline = time.monotonic() + timeout_s
    while not one(pair.standby_url(), "SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", (target,))[
        0
    ]:
        assert time.monotonic() < deadline, f"the standby did not receive WAL up to {target}"
        time.sleep(0.05)


def cut_stream_at_primary(pair: ReplicaPair, timeout_s: float = 30.0) -> None:
    """Cut replication from the primary's side, as a network partition does: its
    pg_hba.conf stops admitting replication and its WAL senders are ended. (The
    fixture's ``detach_standby`` cannot act while replay is paused: the standby's
    startup process, which restarts the WAL receiver, is the paused one.)"""
    hba = pair.primary.data_dir / "pg_hba.conf"
    kept = [line for line in hba.read_text().splitlines() if "replication" not in line]
    hba.write_text("\n".join(kept) + "\n")
    one(pair.primary_url(), "SELECT pg_reload_conf()")
    deadline = time.monotonic() + timeout_s
    while True:
        (senders,) = one(
            pair.primary_url(),
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication",
        )
        (receiving,) = one(
            pair.standby_url(),
            "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'",
        )
        if senders == 0 and receiving == 0:
            return
        assert time.monotonic() < deadline, "the replication stream did not stop"
        time.sleep(0.1)


def options(url: str) -> dict[str, str]:
    return {"url": url, "table": TABLE, "createTable": "true", "lockTimeout": "20s"}


def remove(checkpoint: Path, folder: str, batches: range) -> None:
    for n in batches:
        for name in (str(n), f".{n}.crc"):
            (checkpoint / folder / name).unlink(missing_ok=True)


def test_a_failover_that_lost_committed_batches_stops_the_query(spark: Any, tmp_path: Path) -> None:
    src, chk = tmp_path / "src", tmp_path / "chk"
    with replicated_pair(tmp_path / "pair") as pair:
        with psycopg.connect(pair.primary_url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        primary, promoted = pair.primary_url(DB), pair.standby_url(DB)

        # batches 0..2 reach both servers
        write_source(src, BATCHES[:3])
        run_query(spark, src, chk, options(primary))
        sink = query_id(chk)
        pair.wait_caught_up()
        # batch 3: received by the standby while its replay is paused
        pair.pause_replay()
        add_source_file(src, 3, BATCHES[3])
        run_query(spark, src, chk, options(primary))
        wait_received(pair)
        # batches 4 and 5: the stream is cut, only the primary has them
        cut_stream_at_primary(pair)
        for n in (4, 5):
            add_source_file(src, n, BATCHES[n])
        run_query(spark, src, chk, options(primary))
        assert decided_batches(primary, sink) == dict.fromkeys(range(6), True)
        assert table_ids(primary, TABLE) == list(range(60))

        # the primary crashes; the standby is promoted (it replays batch 3, not 4 and 5)
        pair.stop_primary("immediate")
        pair.promote()
        assert decided_batches(promoted, sink) == dict.fromkeys(range(4), True)

        # the query restarts on the same checkpoint, against the promoted server
        add_source_file(src, 6, BATCHES[6])
        with pytest.raises(Exception, match="data loss") as stopped:
            run_query(spark, src, chk, options(promoted))
        message = str(stopped.value)
        assert (
            f"sink {sink!r}: Spark's checkpoint records batches 4, 5 as committed, but the "
            "commit log has no decision for them" in message
        )
        assert "failover" in message and "point-in-time restore" in message
        assert "Batch 6 is not decided: its transactions are rolled back" in message
        assert f"sqlsink forget --sink-id {sink}" in message
        # it wrote nothing, decided nothing and left nothing prepared
        assert table_ids(promoted, TABLE) == list(range(40))
        assert decided_batches(promoted, sink) == dict.fromkeys(range(4), True)
        assert prepared(promoted) == []
        verdict = one(
            promoted,
            "SELECT checkpoint_verdict, checkpoint_lost FROM sqlsink.runs "
            "WHERE sink_id = %s ORDER BY first_seen DESC LIMIT 1",
            (sink,),
        )
        assert verdict == ("loss", [4, 5])

        # the way out the error names: Spark re-runs batch 4 from its recorded offsets
        # and reads what follows again; every record is then in exactly once
        remove(chk, "commits", range(4, 6))
        remove(chk, "offsets", range(5, 7))
        run_query(spark, src, chk, options(promoted))
        assert table_ids(promoted, TABLE) == list(range(70))
        assert prepared(promoted) == []
        verdict = one(
            promoted,
            "SELECT checkpoint_verdict, checkpoint_lost FROM sqlsink.runs "
            "WHERE sink_id = %s ORDER BY first_seen DESC LIMIT 1",
            (sink,),
        )
        assert verdict == ("verified", [])


def test_a_multi_host_url_follows_the_promoted_standby(spark: Any, tmp_path: Path) -> None:
    """Issue 15: libpq's multi-host URL with target_session_attrs=read-write reaches
    libpq unchanged. One URL names both servers; it writes to the primary (the standby
    is read-only), and after a failover with nothing lost the restarted query writes to
    the promoted standby through the same URL: every record exactly once."""
    src, chk = tmp_path / "src", tmp_path / "chk"
    with replicated_pair(tmp_path / "pair") as pair:
        with psycopg.connect(pair.primary_url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        primary, promoted = pair.primary_url(DB), pair.standby_url(DB)
        hosts = ",".join(u.split("@", 1)[1].split("/", 1)[0] for u in (promoted, primary))
        both = f"postgresql://postgres@{hosts}/{DB}?target_session_attrs=read-write"

        write_source(src, BATCHES[:3])
        run_query(spark, src, chk, options(both))  # the standby is listed first
        sink = query_id(chk)
        assert table_ids(primary, TABLE) == list(range(30))
        pair.wait_caught_up()

        pair.stop_primary("immediate")
        pair.promote()
        add_source_file(src, 3, BATCHES[3])
        run_query(spark, src, chk, options(both))
        assert table_ids(promoted, TABLE) == list(range(40))
        assert decided_batches(promoted, sink) == dict.fromkeys(range(4), True)
        assert prepared(promoted) == []
