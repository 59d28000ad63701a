"""The committer and the recovery rule against a real PostgreSQL (no Spark).

Partition transactions are prepared here by hand, the way the partition writer
does (rows + marker + PREPARE), so every state of DESIGN.md section 3 can be set
up exactly; the Spark tests prove the same windows end to end.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from sqlsink.core.committer import Committer
from sqlsink.core.gid import Gid
from sqlsink.core.model import NewDecision, PartitionOutcome
from sqlsink.errors import CheckpointError, CommitError, DataLossError, SinkBindingError
from sqlsink.postgres import commit_log
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import PgServer, forget_sink, prepared_transactions

RUN = "run-1"

Conn = psycopg.Connection[tuple[object, ...]]


def prepare(
    url: str,
    table: str,
    sink_id: str,
    batch: int,
    partition: int,
    ids: range,
    run: str = RUN,
    attempt: int = 0,
) -> PartitionOutcome:
    """One partition transaction, as the partition writer does it, left prepared."""
    gid = str(Gid(sink_id, batch, partition, run, attempt or batch * 100 + partition))
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("BEGIN")
    with (
        conn.cursor() as cur,
        cur.copy(sql.SQL("COPY {} (id) FROM STDIN").format(sql.Identifier(table))) as copy,
    ):
        for i in ids:
            copy.write_row((i,))
    conn.execute(
        "INSERT INTO sqlsink.markers (gid, sink_id, batch_id, partition_id, rows) "
        "VALUES (%s, %s, %s, %s, %s)",
        (gid, sink_id, batch, partition, len(ids)),
    )
    conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    conn.close()
    return PartitionOutcome(sink_id, batch, partition, gid, len(ids), False, "q1", run, 0.0, 0.0)


@dataclass
class Bench:
    """One test's world: the server, a connection to look with, the target table (one
    ``id`` column), a fresh sink and its committer on a connection of its own."""

    server: PgServer
    url: str
    conn: Conn
    table: str
    sink_id: str
    committer: Committer

    def prepare(
        self,
        batch: int,
        partition: int,
        ids: range,
        run: str = RUN,
        attempt: int = 0,
        *,
        url: str | None = None,
    ) -> PartitionOutcome:
        """``prepare`` on this bench's table and sink (``url``: as another role)."""
        return prepare(
            url or self.url, self.table, self.sink_id, batch, partition, ids, run, attempt
        )

    def ids(self) -> list[int]:
        """The ids committed in the target, in order."""
        query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(self.table))
        return [int(str(r[0])) for r in self.conn.execute(query)]

    def gids(self) -> list[str]:
        """The sink's prepared gids, in every database of the server."""
        return [
            g for g, _ in prepared_transactions(self.server.admin_url) if f"_{self.sink_id}_" in g
        ]

    def markers(self) -> list[int]:
        """The batch of each marker row of the sink."""
        rows = self.conn.execute(
            "SELECT batch_id FROM sqlsink.markers WHERE sink_id = %s ORDER BY batch_id",
            (self.sink_id,),
        )
        return [int(str(r[0])) for r in rows]


@pytest.fixture
def bench(pg_server: PgServer, pg_url: str, pg_conn: Conn, table: str) -> Iterator[Bench]:
    ensure_schema(pg_conn)  # type: ignore[arg-type]
    pg_conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(sql.Identifier(table))
    )
    sink_id = f"s-{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            committer = Committer(PostgresBackend(conn), sink_id)
            yield Bench(pg_server, pg_url, pg_conn, table, sink_id, committer)
    finally:
        forget_sink(pg_url, sink_id)


def test_batches_prepared_then_committed_in_order(bench: Bench) -> None:
    for batch in range(3):
        outcomes = [
            bench.prepare(batch, p, range(batch * 10 + p * 5, batch * 10 + p * 5 + 5))
            for p in range(2)
        ]
        assert bench.ids() == list(range(batch * 10))  # nothing visible before
        report = bench.committer.commit_batch(batch, outcomes, query_id="q1", run_id=RUN)
        assert sorted(report.committed) == sorted(o.gid for o in outcomes if o.gid)
        assert report.completed_batches == [batch]
    assert bench.ids() == list(range(30))


def test_markers_go_when_a_batch_completes_and_stay_with_a_warning_without_delete(
    bench: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    outcomes = [bench.prepare(0, p, range(p * 5, p * 5 + 5)) for p in range(2)]
    bench.committer.commit_batch(0, outcomes, query_id="q1", run_id=RUN)
    assert bench.markers() == []  # the commit log grows by the decision only

    # a role that may write the commit log but not DELETE from it keeps the markers
    role = f"nodel_{uuid.uuid4().hex[:6]}"
    bench.conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        for grant in (
            "GRANT USAGE ON SCHEMA sqlsink TO {}",
            "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA sqlsink TO {}",
            "GRANT SELECT, INSERT ON {} TO {}",
        ):
            names = [sql.Identifier(bench.table)] if grant.count("{}") == 2 else []
            bench.conn.execute(sql.SQL(grant).format(*names, sql.Identifier(role)))
        as_role = psycopg.conninfo.make_conninfo(bench.url, user=role)
        commit_log.warn_markers_kept.cache_clear()
        with (
            psycopg.connect(as_role, autocommit=True) as conn,
            caplog.at_level(logging.WARNING, logger="sqlsink"),
        ):
            limited = Committer(PostgresBackend(conn), bench.sink_id)
            for batch in (1, 2):
                mine = [
                    bench.prepare(batch, p, range(batch * 10 + p, batch * 10 + p + 1), url=as_role)
                    for p in range(2)
                ]
                report = limited.commit_batch(batch, mine, query_id="q1", run_id=RUN)
                assert report.completed_batches == [batch]
        assert bench.markers() == [1, 1, 2, 2]
        warnings = [r.getMessage() for r in caplog.records if "sqlsink.markers" in r.getMessage()]
        assert len(warnings) == 1, warnings  # once, not once per batch
        assert "GRANT DELETE ON sqlsink.markers" in warnings[0]
        assert bench.ids() == [*range(10), 10, 11, 20, 21]
    finally:
        bench.conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        bench.conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_commit_twice_is_a_no_op_and_a_late_commit_is_refused(bench: Bench) -> None:
    first = [bench.prepare(0, 0, range(5))]
    bench.committer.commit_batch(0, first, query_id="q1", run_id=RUN)
    second = [bench.prepare(1, 0, range(5, 10))]
    bench.committer.commit_batch(1, second, query_id="q1", run_id=RUN)
    again = bench.committer.commit_batch(1, second, query_id="q1", run_id=RUN)
    assert again.committed == []
    # Spark commits only its last batch again; batch 0 after batch 1 is not a replay
    # (docs/DESIGN.md invariant 9): refused, and nothing changes
    with pytest.raises(CheckpointError, match="writes batch 0, but batch 1 is already decided"):
        bench.committer.commit_batch(0, first, query_id="q1", run_id=RUN)
    assert bench.ids() == list(range(10))


def test_failure_before_decision_then_restart(bench: Bench) -> None:
    bench.prepare(0, 0, range(5))
    bench.prepare(0, 1, range(5, 10))
    # the driver dies here: no decision. Restart: recovery rolls both back
    _, report = bench.committer.recover()
    assert len(report.rolled_back) == 2
    assert bench.gids() == []
    # the replay of batch 0 (another run, other rows even) commits once
    replay = [bench.prepare(0, 0, range(3), run="run-2")]
    bench.committer.commit_batch(0, replay, query_id="q1", run_id="run-2")
    assert bench.ids() == [0, 1, 2]


def test_decided_then_crash_mid_commit_recovery_rolls_forward(bench: Bench) -> None:
    outcomes = [bench.prepare(4, p, range(p * 5, p * 5 + 5)) for p in range(3)]
    backend = bench.committer.backend
    backend.insert_decision(
        NewDecision(bench.sink_id, 4, [o.gid for o in outcomes if o.gid], 15, "q1", RUN)
    )
    assert outcomes[0].gid is not None
    backend.commit_prepared(outcomes[0].gid)  # ... and the driver dies
    _, report = bench.committer.recover()
    assert len(report.committed) == 2 and report.already_committed == [outcomes[0].gid]
    assert report.completed_batches == [4]
    assert bench.ids() == list(range(15))
    assert bench.gids() == []


def test_orphans_of_denied_attempts_are_swept(bench: Bench) -> None:
    orphan = bench.prepare(0, 0, range(100, 105), attempt=7)  # failed attempt
    chosen = bench.prepare(0, 0, range(5), attempt=8)
    report = bench.committer.commit_batch(0, [chosen], query_id="q1", run_id=RUN)
    assert report.rolled_back == [orphan.gid]
    assert bench.ids() == list(range(5))
    assert bench.gids() == []


def test_abort_rolls_back_undecided_but_never_decided(bench: Bench) -> None:
    undecided = [bench.prepare(0, 0, range(5))]
    bench.committer.abort_batch(0, [*undecided, None], run_id=RUN)
    assert bench.ids() == [] and bench.gids() == []

    decided = [bench.prepare(1, p, range(p * 5, p * 5 + 5)) for p in range(2)]
    bench.committer.backend.insert_decision(
        NewDecision(bench.sink_id, 1, [o.gid for o in decided if o.gid], 10, "q1", RUN)
    )
    bench.committer.abort_batch(1, decided, run_id=RUN)  # must roll forward, not back
    assert bench.ids() == list(range(10))


def test_a_decided_gid_rolled_back_by_hand_is_data_loss(bench: Bench) -> None:
    outcomes = [bench.prepare(2, p, range(p * 5, p * 5 + 5)) for p in range(2)]
    bench.committer.backend.insert_decision(
        NewDecision(bench.sink_id, 2, [o.gid for o in outcomes if o.gid], 10, "q1", RUN)
    )
    assert outcomes[1].gid is not None
    bench.conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(outcomes[1].gid)))
    with pytest.raises(DataLossError, match=r"batch 2 partition 1") as err:
        bench.committer.recover()
    assert err.value.context["lost"] == [(2, outcomes[1].gid)]
    assert bench.ids() == list(range(5))  # the rest was still committed
    with pytest.raises(DataLossError):  # and it stays loud
        bench.committer.recover()


def test_a_gid_gone_before_the_decision_is_not_decided(bench: Bench) -> None:
    outcomes = [bench.prepare(0, p, range(p * 5, p * 5 + 5)) for p in range(2)]
    assert outcomes[0].gid is not None
    bench.conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(outcomes[0].gid)))
    with pytest.raises(CommitError, match="no longer prepared"):
        bench.committer.commit_batch(0, outcomes, query_id="q1", run_id=RUN)
    assert bench.committer.backend.decisions(bench.sink_id, [(bench.sink_id, 0)]) == {}
    bench.committer.abort_batch(0, outcomes, run_id=RUN)
    assert bench.ids() == [] and bench.gids() == []


def test_sink_bound_to_another_query_is_refused(bench: Bench) -> None:
    bench.committer.commit_batch(0, [bench.prepare(0, 0, range(2))], query_id="q1", run_id=RUN)
    with pytest.raises(SinkBindingError, match="bound to streaming query q1") as err:
        bench.committer.commit_batch(1, [], query_id="q2", run_id="run-2")
    assert "sinkId" in str(err.value)


def test_foreign_prepared_transactions_survive_recovery(bench: Bench) -> None:
    other_db = f"other_{uuid.uuid4().hex[:6]}"
    bench.conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other_db)))
    other_url = bench.server.db_url(other_db)
    foreign = [
        "app_tx_1",
        f"sqlsink_{bench.sink_id}_0_0",  # our prefix, not our shape
        f"sqlsink_{bench.sink_id}x_0_0_{RUN}_1",  # a similar sink id
        str(Gid(bench.sink_id + "-other", 0, 0, RUN, 1)),  # another sink
    ]
    for gid in foreign:
        with psycopg.connect(bench.url, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    same_sink_other_db = str(Gid(bench.sink_id, 0, 0, RUN, 2))
    with psycopg.connect(other_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(same_sink_other_db)))
    try:
        mine = bench.prepare(0, 0, range(3))
        with psycopg.connect(bench.url, autocommit=True) as conn:
            _, report = Committer(PostgresBackend(conn), bench.sink_id).recover()
            assert report.rolled_back == [mine.gid]
            # matched by the LIKE pre-filter, then left: not our shape, or not our database
            assert sorted(report.left) == sorted([foreign[1], same_sink_other_db])
        left = {g for g, _ in prepared_transactions(bench.server.admin_url)}
        assert set(foreign[:3]) | {same_sink_other_db} <= left
    finally:
        from tests.fix_pg import rollback_all_prepared

        rollback_all_prepared(bench.server)
        bench.conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(other_db)))
