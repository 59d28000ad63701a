"""``sqlsink recover --commit-lost/--mark-skipped`` when the operator names the sink wrongly.

The state is a failover's (tests/pg/test_failover_leftovers.py): sink ``fo`` (option
``sinkId``) is bound to query Q; batches 0 and 1 are decided, batch 2's decision was lost
while its two transactions stayed prepared, and Spark's checkpoint has ``commits/0..2``.
The operator gives only ``--checkpoint`` (the sink id is not the query id), or types the
sink id in the wrong case, or names a sink the checkpoint's query does not write. Each
command either finds ``fo`` or is refused before anything is written: no decision for a
sink the log does not know, none for a sink the checkpoint does not belong to. Each test
has a database of its own, so the known sinks listed are exactly the test's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import PgServer, rollback_all_prepared
from tests.pg.protocol import Writer, prepared_of
from tests.pg.test_cli import Result, make_checkpoint, sqlsink
from tests.pg.test_recover_runs import driver_gone

SINK = "fo"
SKIP_0_1_2 = ["--mark-skipped", "0", "--mark-skipped", "1", "--mark-skipped", "2"]


@pytest.fixture
def url(pg_server: PgServer) -> Iterator[str]:
    """A database of the test's own, with the commit log and the table ``t``."""
    name = f"oper_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    db_url = pg_server.db_url(name)
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            ensure_schema(conn)  # type: ignore[arg-type]
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
        yield db_url
    finally:
        rollback_all_prepared(
            pg_server,
            [(g, name) for g, d in _prepared(pg_server.admin_url) if d == name],
        )
        with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _prepared(admin_url: str) -> list[tuple[str, str]]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute("SELECT gid, database FROM pg_prepared_xacts").fetchall()
    return [(str(g), str(d)) for g, d in rows]


def lost_batch_2(url: str, root: Path) -> tuple[str, Path, list[str]]:
    """Sink fo of query Q: batches 0 and 1 decided and committed, batch 2 prepared in two
    partitions with no decision, Spark's checkpoint with commits/0..2; the driver gone."""
    query = str(uuid.uuid4())
    writer = Writer(url, "t", SINK, query)
    writer.batch(0, range(0, 3))
    writer.batch(1, range(10, 13))
    lost = sorted(
        str(writer.write(2, ids, p).gid) for p, ids in enumerate([range(20, 23), range(23, 26)])
    )
    chk = make_checkpoint(root / "chk", query, [0, 1, 2, 3], [0, 1, 2])
    driver_gone(url, SINK, "1 hour")
    assert prepared_of(url, SINK) == lost
    return query, chk, lost


def dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


def recover(url: str, *args: str) -> Result:
    return sqlsink("recover", "--url", url, *args, "--json")


def refusal(result: Result) -> tuple[str, str]:
    """A refused command: exit 2, its error's message and fix."""
    assert result.code == 2, shown(result)
    error = result.json["error"]
    return error["message"], error["fix"]


def shown(result: Result) -> str:
    """What a command that was not refused said: its exit code, error or warnings."""
    doc = result.json
    said = [doc["error"]["message"]] if doc.get("error") else []
    said += [w["message"] for w in doc.get("warnings", [])]
    return f"exit {result.code}: " + " | ".join(said)


def decisions_of(url: str, *sinks: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM sqlsink.decisions WHERE sink_id = ANY(%s)", (list(sinks),)
        ).fetchone()
    assert row is not None
    return int(row[0])


def sink_rows(url: str) -> list[tuple[str, str | None, str | None]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT sink_id, writer, query_id FROM sqlsink.sinks ORDER BY 1")
        return [(str(s), w, q) for s, w, q in rows]


def decided(url: str, sink: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT batch_id FROM sqlsink.decisions WHERE sink_id = %s ORDER BY 1", (sink,)
        )
        return [int(r[0]) for r in rows]


def ids_of(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [int(r[0]) for r in conn.execute("SELECT id FROM t ORDER BY id")]


def assert_resolved(url: str, others: range = range(0)) -> None:
    """fo's batch 2 committed by the right command: every batch once, nothing prepared
    (``others``: the rows another sink wrote)."""
    assert ids_of(url) == [0, 1, 2, 10, 11, 12, *range(20, 26), *others]
    assert prepared_of(url, SINK) == [] and decided(url, SINK) == [0, 1, 2]


def test_the_checkpoint_alone_finds_the_sink_its_query_is_bound_to(
    url: str, tmp_path: Path
) -> None:
    """D1: fo has sinkId=fo; the checkpoint's query id is not a sink id. recover takes the
    sink the log binds to the query, never the query id as a sink of its own."""
    query, chk, lost = lost_batch_2(url, tmp_path)

    # what the reviewer ran second (the first refusal had said to name batches 0, 1 too)
    skipped = recover(url, "--checkpoint", str(chk), *SKIP_0_1_2)
    message, fix = refusal(skipped)
    assert message == (
        f"sink {SINK}: batch 0 is decided already (complete): it has no lost decision; "
        "nothing was decided"
    )
    assert fix == f"sqlsink recover --sink-id {SINK} finishes a decided batch"
    assert decisions_of(url, query) == 0
    assert prepared_of(url, SINK) == lost and decided(url, SINK) == [0, 1]
    assert [s for s, _, _ in sink_rows(url)] == [SINK]  # no sink named by the query id

    done = recover(url, "--checkpoint", str(chk), "--commit-lost", "2")
    assert done.code == 0, shown(done)
    [doc] = done.json["sinks"]
    assert doc["sink_id"] == SINK and doc["decided_batches"] == [2]
    assert {a["gid"]: a["result"] for a in done.json["actions"]} == dict.fromkeys(lost, "committed")
    assert done.json["checkpoint"]["sink_id"] == SINK
    assert_resolved(url)
    assert decisions_of(url, query) == 0
    assert sink_rows(url) == [(SINK, "stream", query)]


def test_a_checkpoint_of_a_query_no_sink_is_bound_to_is_refused(url: str, tmp_path: Path) -> None:
    query, chk, lost = lost_batch_2(url, tmp_path)
    other = str(uuid.uuid4())
    stranger = make_checkpoint(tmp_path / "other", other, [0, 1, 2, 3], [0, 1, 2])
    for args in (["--commit-lost", "2"], ["--mark-skipped", "2"], []):
        message, fix = refusal(recover(url, "--checkpoint", str(stranger), *args))
        assert message == (
            f"no sink in database {dbname(url)} is bound to query {other}, the "
            f"query of checkpoint {stranger} (the sinks it knows: {SINK} (query {query})); "
            "nothing was done"
        )
        assert fix == (
            "name the sink: --sink-id ID beside --checkpoint (the query's sinkId option, "
            "else its query id), and check that --url names the sink's database"
        )
    assert decisions_of(url, other) == 0
    assert prepared_of(url, SINK) == lost and decided(url, SINK) == [0, 1]

    done = recover(url, "--sink-id", SINK, "--checkpoint", str(chk), "--commit-lost", "2")
    assert done.code == 0, shown(done)
    assert_resolved(url)


def test_a_checkpoint_whose_query_writes_several_sinks_names_them(url: str, tmp_path: Path) -> None:
    """A foreachBatch function that hands each batch to two writers: two sinks, one query."""
    query, chk, lost = lost_batch_2(url, tmp_path)
    Writer(url, "t", "fo-copy", query).batch(0, range(100, 103))
    message, fix = refusal(recover(url, "--checkpoint", str(chk), "--commit-lost", "2"))
    assert message == (
        f"query {query} (checkpoint {chk}) writes 2 sinks in database "
        f"{dbname(url)}: fo, fo-copy; nothing was done"
    )
    assert fix == f"name one: --sink-id ID --checkpoint {chk} (ID one of fo, fo-copy)"
    assert decisions_of(url, query) == 0
    assert prepared_of(url, SINK) == lost and decided(url, SINK) == [0, 1]

    done = recover(url, "--sink-id", SINK, "--checkpoint", str(chk), "--commit-lost", "2")
    assert done.code == 0, shown(done)
    assert_resolved(url, range(100, 103))


def test_a_sink_id_in_the_wrong_case_is_refused_before_anything_is_decided(
    url: str, tmp_path: Path
) -> None:
    """D2: FO for fo. Each command the reviewer ran, following the refusals' advice."""
    query, chk, lost = lost_batch_2(url, tmp_path)
    database = dbname(url)
    for args in (
        ["--commit-lost", "2"],
        ["--mark-skipped", "2", "--checkpoint", str(chk)],
        [*SKIP_0_1_2, "--checkpoint", str(chk)],
        ["--commit-lost", "2", "--dry-run"],
    ):
        message, fix = refusal(recover(url, "--sink-id", "FO", *args))
        assert message == (
            f"sink FO is unknown in database {database}: no commit log rows and no prepared "
            "transactions, so it has no batch to decide; nothing was decided"
        )
        assert fix == (
            f"did you mean --sink-id {SINK}? (sink ids are case-sensitive; the sinks this "
            f"database knows: {SINK} (query {query})); check that --url names the sink's database"
        )
    assert decisions_of(url, "FO") == 0
    assert [s for s, _, _ in sink_rows(url)] == [SINK]
    assert prepared_of(url, SINK) == lost and decided(url, SINK) == [0, 1]

    done = recover(url, "--sink-id", SINK, "--checkpoint", str(chk), "--commit-lost", "2")
    assert done.code == 0, shown(done)
    assert_resolved(url)


def test_a_checkpoint_is_no_evidence_for_a_sink_its_query_does_not_write(
    url: str, tmp_path: Path
) -> None:
    """A sink the log knows, bound to a batch load: Q's checkpoint says nothing about it."""
    query, chk, lost = lost_batch_2(url, tmp_path)
    Writer(url, "t", "ld", None).batch(0, range(200, 203))
    message, fix = refusal(
        recover(url, "--sink-id", "ld", "--checkpoint", str(chk), "--mark-skipped", "1")
    )
    assert message == (
        f"sink ld (database {dbname(url)}) is bound to a named batch load, but "
        f"checkpoint {chk} belongs to query {query}: this checkpoint and this sink do not "
        "belong together, so nothing was done"
    )
    assert fix.startswith("pass the checkpoint of the query that writes this sink")
    assert decided(url, "ld") == [0]
    assert prepared_of(url, SINK) == lost and decided(url, SINK) == [0, 1]

    done = recover(url, "--checkpoint", str(chk), "--commit-lost", "2")
    assert done.code == 0, shown(done)
    assert_resolved(url, range(200, 203))


def test_a_query_without_sink_id_whose_first_decision_was_lost_is_found_by_its_query_id(
    url: str, tmp_path: Path
) -> None:
    """No sinkId option: the sink id is the query id. Batch 0's decision, the one that binds
    the sink, was lost; the run's registration and batch 0's transaction survived. The
    checkpoint alone names that sink (registered, not bound), and the decision binds it to
    the checkpoint's query (not to a batch load)."""
    query = str(uuid.uuid4())
    writer = Writer(url, "t", query, query)
    gid = str(writer.write(0, range(0, 3)).gid)
    chk = make_checkpoint(tmp_path / "chk", query, [0, 1], [0])
    driver_gone(url, query, "1 hour")
    assert sink_rows(url) == [(query, None, None)]

    done = recover(url, "--checkpoint", str(chk), "--commit-lost", "0")
    assert done.code == 0, shown(done)
    assert done.json["sinks"][0]["sink_id"] == query
    assert {a["gid"]: a["result"] for a in done.json["actions"]} == {gid: "committed"}
    assert ids_of(url) == [0, 1, 2] and prepared_of(url, query) == []
    assert decided(url, query) == [0]
    assert sink_rows(url) == [(query, "stream", query)]
