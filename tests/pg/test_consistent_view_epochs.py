"""The consistent view's one documented exception (docs/DESIGN.md invariant 13, "Not
held"; README "What it guarantees"): in a table whose rows outlive one wrap of the
32-bit transaction counter, a batch in flight also hides the rows of an older
transaction that had the same 32-bit id, because a frozen row keeps its raw ``xmin``.

A cluster of its own is taken to just before the wrap with ``pg_resetwal -x`` (after
``VACUUM FREEZE`` of every database, which anti-wraparound vacuum does long before a
real server wraps); ids are then used up until the next batch's partition 0 gets the
32-bit id of the old batch 0's partition 0. This test pins the limit as documented:
should the view become exact (a per-row tag), it fails, and the documents change.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sqlsink.embedded import EmbeddedPostgres
from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import SERVER_SETTINGS
from tests.pg.protocol import Writer, prepared_of

WRAP = 2**32
NEAR = WRAP - 3000  # the next id after pg_resetwal: 3,000 ids before the wrap


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path, settings={**SERVER_SETTINGS, "autovacuum": "off"})
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def next_xid(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The 64-bit id the next transaction gets."""
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    assert row is not None
    return int(str(row[0]))


def use_ids_until(url: str, target: int) -> None:
    """One id per autocommit statement, until the next one is ``target`` (64-bit)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while (n := next_xid(conn)) < target:
            conn.execute("SELECT pg_current_xact_id()")
        assert n == target, (n, target)


def reset_to_near_the_wrap(server: EmbeddedPostgres) -> None:
    """pg_resetwal -x NEAR, with the commit-status segment of the new ids (zeros)."""
    server.stop()
    subprocess.run(
        [str(server.bindir / "pg_resetwal"), "-f", "-x", str(NEAR), "-D", str(server.data_dir)],
        check=True,
        capture_output=True,
        user=server.user,
    )
    xact = server.data_dir / "pg_xact"
    width = max(len(p.name) for p in xact.iterdir())  # 4 hex digits (longer names: 17+)
    segment = xact / f"{NEAR // (32 * 32768):0{width}X}"
    segment.write_bytes(b"\0" * 8192 * 32)
    if server.user:
        shutil.chown(segment, server.user)
    server.start()


def test_a_batch_in_flight_hides_old_rows_of_an_earlier_epoch_with_the_same_32_bit_id(
    cluster: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = cluster.url()
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute("CREATE TABLE events (id bigint)")
    extra = {"consistentView": "events_whole"}
    old = Writer(url, "events", "wrapsink", "q-wrap", extra=extra)
    old.batch(0, range(0, 5), range(5, 10))
    with psycopg.connect(url, autocommit=True) as conn:
        xmins = dict(conn.execute("SELECT id, xmin::text::bigint FROM events").fetchall())
        assert xmins[0] != xmins[5]  # two partitions, two transactions
        for db in ("postgres", "template1"):  # template0 is frozen from the start
            with psycopg.connect(cluster.url(db), autocommit=True) as each:
                each.execute("VACUUM FREEZE")
    reset_to_near_the_wrap(cluster)
    # epoch 1: the next batch's partition 0 gets old partition 0's 32-bit id. A task
    # uses ids of its own before its partition transaction's: measured by a dry run
    new = Writer(url, "events", "wrapsink", "q-wrap", extra=extra)
    use_ids_until(url, WRAP + 100)
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(2):  # the second in the steady state
            before = next_xid(conn) % WRAP
            dry = new.write(5, range(1000, 1005), 0)
            row = conn.execute(
                "SELECT transaction::text::bigint FROM pg_prepared_xacts WHERE gid = %s",
                (dry.gid,),
            ).fetchone()
            assert row is not None
            lead = int(str(row[0])) - before
            conn.execute(f"ROLLBACK PREPARED '{dry.gid}'")
    use_ids_until(url, WRAP + xmins[0] - lead)
    p0 = new.write(5, range(1000, 1005), 0)
    p1 = new.write(5, range(2000, 2005), 1)
    with psycopg.connect(url, autocommit=True) as conn:
        got = conn.execute(
            "SELECT transaction::text::bigint FROM pg_prepared_xacts WHERE gid = %s", (p0.gid,)
        ).fetchone()
    assert got == (xmins[0],)  # the same 32-bit id, one epoch later

    def dies(name: str, batch_id: int, *args: object, **kwargs: object) -> None:
        if name == "mid_commit":
            raise RuntimeError("the driver dies after the first COMMIT PREPARED")

    monkeypatch.setattr("sqlsink.core.resolver.crash_point", dies)
    with pytest.raises(RuntimeError, match="the driver dies"):
        new.commit(5, [p0, p1])
    monkeypatch.undo()
    assert prepared_of(url, "wrapsink") == [p1.gid]
    with psycopg.connect(url, autocommit=True) as conn:
        table = [r[0] for r in conn.execute("SELECT id FROM events ORDER BY id")]
        view = [r[0] for r in conn.execute("SELECT id FROM events_whole ORDER BY id")]
    assert table == [*range(10), *range(1000, 1005)]
    # batch 5 is hidden, and so is batch 0's partition 0, complete for a whole epoch
    assert view == [5, 6, 7, 8, 9]
    with new.committer() as committer:
        committer.recover()
    with psycopg.connect(url, autocommit=True) as conn:
        view = [r[0] for r in conn.execute("SELECT id FROM events_whole ORDER BY id")]
    assert view == [*range(10), *range(1000, 1005), *range(2000, 2005)]
