"""Spark Connect: a remote session against a local Connect server (conftest.py), the
foreachBatch writer and format("sqlsink") run on the server, exactly once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.fix_pg import PgServer, prepared_transactions
from tests.programs import run_program
from tests.spark.streams import add_source_file, decided_batches, table_ids, write_source

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def client(connect_url: str, mode: str, pg_url: str, table: str, work: Path) -> dict[str, str]:
    args = [connect_url, mode, pg_url, table, str(work / "src"), str(work / "chk")]
    run = run_program("-m", "tests.connect.client_program", *args, timeout=600)
    report: dict[str, str] = json.loads(run.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture
def connect_table(pg_url: str) -> Iterator[str]:
    name = f"cx_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def test_the_foreach_batch_writer_through_connect_writes_every_record_once(
    connect_url: str, pg_url: str, pg_server: PgServer, connect_table: str, tmp_path: Path
) -> None:
    write_source(tmp_path / "src", [range(0, 40), range(40, 90), range(90, 100)])
    report = client(connect_url, "foreach", pg_url, connect_table, tmp_path)
    assert report["error"] is None
    sink_id = "cx-" + connect_table.replace("_", "-")
    assert table_ids(pg_url, connect_table) == list(range(100))
    assert decided_batches(pg_url, sink_id) == {0: True, 1: True, 2: True}
    with psycopg.connect(pg_url) as conn:
        bound = conn.execute(
            "SELECT query_id FROM sqlsink.sinks WHERE sink_id = %s", (sink_id,)
        ).fetchall()
    assert bound == [(report["query_id"],)]  # read from the checkpoint: the query's own id
    assert [g for g, _ in prepared_transactions(pg_server.admin_url) if sink_id in g] == []
    # a second run of the query (same checkpoint, new source file) replays nothing twice
    add_source_file(tmp_path / "src", 3, range(100, 110))
    report = client(connect_url, "foreach", pg_url, connect_table, tmp_path)
    assert report["error"] is None
    assert table_ids(pg_url, connect_table) == list(range(110))


def test_the_bare_writer_through_connect_is_refused_with_the_fix(
    connect_url: str, pg_url: str, connect_table: str, tmp_path: Path
) -> None:
    write_source(tmp_path / "src", [range(0, 10)])
    report = client(connect_url, "foreach-bare", pg_url, connect_table, tmp_path)
    assert report["error"] is not None
    assert "no streaming query id" in report["error"]
    assert "checkpoint_location=<the checkpointLocation of the query>" in report["error"]
    with psycopg.connect(pg_url) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (connect_table,)).fetchone()
    assert exists == (None,)  # nothing written, not even the table


def test_two_writer_objects_of_one_sink_through_connect_are_one_run(
    connect_url: str, pg_url: str, pg_server: PgServer, connect_table: str, tmp_path: Path
) -> None:
    """Connect hides Spark's run id: the writer makes one per (process, sink, query), so
    the second writer object's write of batch 0 is the same run's second hand-over,
    refused before anything of it is written (it used to be taken for a new run's
    replay of the batch the first object decided, and skipped: its rows lost silently)."""
    write_source(tmp_path / "src", [range(0, 5)])
    report = client(connect_url, "two-writers", pg_url, connect_table, tmp_path)
    sink_id = "cx-" + connect_table.replace("_", "-")
    print(f"two writer objects through Connect: {report}")
    assert report["error"] is not None
    assert (
        f"sink {sink_id!r}: batch 0 was already decided by this very run (its decision "
        f"holds 'public.{connect_table}'): a second write of one batch id in one run"
    ) in report["error"]
    assert table_ids(pg_url, connect_table) == list(range(5))  # the first object's only
    assert decided_batches(pg_url, sink_id) == {0: True}
    assert [g for g, _ in prepared_transactions(pg_server.admin_url) if sink_id in g] == []


def test_the_data_source_through_connect_writes_every_record_once(
    connect_url: str, pg_url: str, pg_server: PgServer, connect_table: str, tmp_path: Path
) -> None:
    write_source(tmp_path / "src", [range(0, 40), range(40, 90), range(90, 100)])
    report = client(connect_url, "source", pg_url, connect_table, tmp_path)
    assert report["error"] is None
    assert table_ids(pg_url, connect_table) == list(range(100))
    assert decided_batches(pg_url, report["query_id"]) == {0: True, 1: True, 2: True}
    assert [g for g, _ in prepared_transactions(pg_server.admin_url)] == []


def test_a_failed_write_the_wrapped_function_swallowed_stops_the_query_through_connect(
    connect_url: str, pg_url: str, pg_server: PgServer, connect_table: str, tmp_path: Path
) -> None:
    """``wrap(f)``, ``f`` catches the writer's error of batch 1 and returns: the abort gave
    the process a new run id, under which nothing of batch 1 was handed, and wrap used to
    decide batch 1 empty (its rows lost, no error). Now wrap raises, so Spark does not
    record batch 1 committed, and the restart writes it."""
    write_source(tmp_path / "src", [range(0, 5), range(5, 10), range(10, 15)])
    (tmp_path / "flag").touch()
    report = client(connect_url, "swallow", pg_url, connect_table, tmp_path)
    sink_id = "cx-" + connect_table.replace("_", "-")
    print(f"a swallowed failure through Connect: {report}")
    assert report["error"] is not None
    assert (
        f"sink {sink_id!r}: the foreachBatch function returned normally although the "
        "writer's write of batch 1 failed (RuntimeError: a transient failure inside batch 1)"
    ) in report["error"]
    assert table_ids(pg_url, connect_table) == list(range(5))
    assert decided_batches(pg_url, sink_id) == {0: True}
    assert [g for g, _ in prepared_transactions(pg_server.admin_url) if sink_id in g] == []
    report = client(connect_url, "swallow", pg_url, connect_table, tmp_path)  # the restart
    assert report["error"] is None
    assert table_ids(pg_url, connect_table) == list(range(15))
    assert decided_batches(pg_url, sink_id) == {0: True, 1: True, 2: True}


def test_an_operators_skip_from_a_connect_session_is_checked_as_outside_the_stream(
    connect_url: str, pg_url: str, pg_server: PgServer, connect_table: str, tmp_path: Path
) -> None:
    """A Connect client session is not the stream: only the Connect server's foreachBatch
    worker is. The operator's skip(2) of a batch Spark never ran is refused (it used to
    be accepted, and the restart then stopped on batch 2); a skip inside the stream (of
    batch 1, by the function) still decides it empty."""
    write_source(tmp_path / "src", [range(0, 5), range(5, 10)])
    report = client(connect_url, "skip-outside", pg_url, connect_table, tmp_path)
    sink_id = "cx-" + connect_table.replace("_", "-")
    print(f"an operator's skip through Connect: {report}")
    assert report["error"] is None
    assert (
        f"sink {sink_id!r}: writer.skip(2) outside the stream: Spark's checkpoint "
        f"{tmp_path / 'chk'} does not record batch 2 as committed (no commits/2)"
    ) in report["skip"]
    assert table_ids(pg_url, connect_table) == list(range(5))
    assert decided_batches(pg_url, sink_id) == {0: True, 1: True}
    assert [g for g, _ in prepared_transactions(pg_server.admin_url) if sink_id in g] == []


def test_a_failed_write_an_unwrapped_function_swallowed_stops_the_next_batch_through_connect(
    connect_url: str, pg_url: str, pg_server: PgServer, connect_table: str, tmp_path: Path
) -> None:
    """Unwrapped, ``f`` catches the writer's error of batch 1: the abort renewed the
    process's run id, and the new run carries the failed batch, so its hand-over of
    batch 2 refuses with the data-loss error naming batch 1 before writing anything."""
    write_source(tmp_path / "src", [range(0, 5), range(5, 10), range(10, 15)])
    (tmp_path / "flag").touch()
    report = client(connect_url, "swallow-bare", pg_url, connect_table, tmp_path)
    sink_id = "cx-" + connect_table.replace("_", "-")
    print(f"a swallowed failure, unwrapped, through Connect: {str(report)[:1500]}")
    assert report["error"] is not None
    assert (
        f"data loss: sink {sink_id!r}: this run's write of batch 1 failed (it was aborted, "
        "nothing of it is committed), but the foreachBatch function returned normally"
    ) in report["error"]
    assert "Nothing of batch 2 was written" in report["error"]
    assert table_ids(pg_url, connect_table) == list(range(5))
    assert decided_batches(pg_url, sink_id) == {0: True}
    assert [g for g, _ in prepared_transactions(pg_server.admin_url) if sink_id in g] == []
