"""The sink's XA xid layout (sqlsink/mariadb/xid.py): every gid in 64 + 64 bytes, one
spelling each, and nothing foreign read as ours; on the real server, foreign branches
are neither listed nor touched."""

from __future__ import annotations

import uuid

import pytest

from sqlsink.core.gid import BIGINT_MAX, INTEGER_MAX, MAX_PART, Gid
from sqlsink.errors import ConfigError
from sqlsink.mariadb import xid
from sqlsink.mariadb.backend import MariaDBBackend
from sqlsink.mariadb.connection import connect, execute
from sqlsink.mariadb.schema import ensure_schema
from tests.fix_mariadb import MariaServer

LONGEST = Gid("s" * 64, BIGINT_MAX, INTEGER_MAX, "R-" * 32, BIGINT_MAX, MAX_PART)


@pytest.mark.parametrize(
    "gid",
    [LONGEST, Gid("a", 0, 0, "r", 0), Gid("c-1", 7, 3, str(uuid.uuid4()), 12, 2)],
    ids=["longest", "shortest", "uuid-run"],
)
def test_every_gid_round_trips_within_64_bytes_each(gid: Gid) -> None:
    branch = xid.encode(gid)
    assert len(branch.gtrid) <= 64 and len(branch.bqual) <= 64
    assert branch.format_id == xid.FORMAT_ID < 2**31
    assert xid.decode(branch.format_id, branch.gtrid, branch.bqual) == gid


def test_the_longest_gid_takes_56_and_62_bytes() -> None:
    branch = xid.encode(LONGEST)
    assert (len(branch.gtrid), len(branch.bqual)) == (56, 62)


def test_nothing_foreign_decodes() -> None:
    mine = xid.encode(Gid("c-1", 7, 3, "r1", 12))
    assert xid.decode(1, mine.gtrid, mine.bqual) is None  # another formatID
    assert xid.decode(mine.format_id, b"", b"") is None
    assert xid.decode(mine.format_id, mine.gtrid + b"\x00", mine.bqual) is None  # padded
    assert xid.decode(mine.format_id, mine.gtrid, mine.bqual[:-1] + b"\xff") is None
    assert xid.decode(mine.format_id, b"\xff" * 9, mine.bqual) is None  # batch out of range
    assert xid.from_recover_row((1, 3, 0, b"abc")) is None
    assert xid.from_recover_row(("x", "y", "z", None)) is None
    assert xid.encode_text("sqlsink_c-1_7_3_r1_12") == mine
    assert xid.encode_text("not ours") is None


def test_foreign_branches_are_neither_listed_nor_touched(mariadb_server: MariaServer) -> None:
    """A branch of another formatID, and one of ours by formatID whose data is no gid,
    stay prepared whatever the backend is asked."""
    url = mariadb_server.url()
    mine = Gid(f"x-{uuid.uuid4().hex[:8]}", 0, 0, "r1", 0)
    ours = xid.encode(mine)
    foreign = [
        xid.Xid(7, ours.gtrid, ours.bqual),  # our layout, another formatID
        xid.Xid(xid.FORMAT_ID, b"foreign-" + uuid.uuid4().bytes, b"branch"),
    ]
    conn = connect(url)
    ensure_schema(conn)
    execute(conn, "CREATE TABLE IF NOT EXISTS foreign_rows (v int)")  # DDL: not in a branch
    conn.close()
    for branch in foreign:
        conn = connect(url)
        execute(conn, f"XA START {branch.sql()}")
        execute(conn, "INSERT INTO foreign_rows VALUES (1)")
        execute(conn, f"XA END {branch.sql()}")
        execute(conn, f"XA PREPARE {branch.sql()}")
        conn.close()
    backend = MariaDBBackend(connect(url), 2.0)
    try:
        assert all(xid.encode_text(t.gid) not in foreign for t in backend.prepared(None))
        # the foreign branch of formatID 7 holds our gtrid and bqual: MariaDB would commit
        # it for our xid, so the backend refuses, and leaves it prepared
        with pytest.raises(ConfigError, match="formatID 7"):
            backend.commit_prepared(str(mine))
        other = Gid(mine.sink_id, 1, 0, "r1", 0)
        assert not backend.commit_prepared(str(other))  # ours, not prepared: False
        assert not backend.rollback_prepared("sqlsink_foreign")  # not a gid: untouched
        recovered = {(int(r[0]), bytes(r[3])) for r in _recover(backend)}
        for branch in foreign:
            assert (branch.format_id, branch.gtrid + branch.bqual) in recovered
    finally:
        for branch in foreign:
            execute(backend.conn, f"XA ROLLBACK {branch.sql()}")
        backend.conn.close()


def _recover(backend: MariaDBBackend) -> list[tuple[object, ...]]:
    with backend.conn.cursor() as cur:
        cur.execute("XA RECOVER")
        return list(cur.fetchall())
