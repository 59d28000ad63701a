"""A partition's transaction, driven directly (no Spark): the zombie-attempt rule."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sqlsink.core.faults import ENV as FAULTS_ENV
from sqlsink.core.model import NewDecision, TaskIdentity
from sqlsink.errors import TransientError
from sqlsink.options import SinkOptions
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.partition import write_partition
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import plan_target
from tests.fix_pg import PgServer, prepared_transactions


def task(sink: str, attempt: int) -> TaskIdentity:
    return TaskIdentity(sink, 3, 0, "run1", attempt, attempt, query_id=None)


def rows(ids: range) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": pa.array(list(ids), pa.int64())})]


def test_an_attempt_that_prepares_after_its_batch_was_decided_rolls_itself_back(
    pg_url: str,
    pg_server: PgServer,
    table: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A late or speculative copy must not stay prepared until some later commit sweeps it."""
    sink = f"z-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table)))
        options = SinkOptions.parse({"url": pg_url, "table": table, "sinkId": sink})
        target = plan_target(conn, options, ["id"], None)  # type: ignore[arg-type]
        # the loser (attempt 0) is in its COPY while the winner (attempt 1) writes and the
        # batch is decided (had the winner prepared first, the loser would adopt it)
        faults = tmp_path / "faults.json"
        sleep = {"point": "mid_copy", "batch": 3, "attempt": 0, "action": "sleep", "seconds": 2}
        faults.write_text(json.dumps([sleep]))
        monkeypatch.setenv(FAULTS_ENV, str(faults))

        def win_and_decide_meanwhile() -> None:
            time.sleep(0.5)
            winner = write_partition(options, target, task(sink, 1), rows(range(5)))
            with psycopg.connect(pg_url, autocommit=True) as other:
                backend = PostgresBackend(other)  # type: ignore[arg-type]
                assert winner.gid is not None
                backend.insert_decision(NewDecision(sink, 3, [winner.gid], 5, None, "run1"))
                backend.commit_prepared(winner.gid)

        decider = threading.Thread(target=win_and_decide_meanwhile)
        decider.start()
        with pytest.raises(TransientError, match="decided without this attempt"):
            write_partition(options, target, task(sink, 0), rows(range(100, 105)))
        decider.join()
        assert (faults.parent / "faults.json.fired").exists()  # the loser really was late
        assert prepared_transactions(pg_server.admin_url) == []
        ids = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
        assert [r[0] for r in ids] == [0, 1, 2, 3, 4]


def test_a_dataframe_that_does_not_fit_names_each_fix_once(pg_url: str, table: str) -> None:
    """A column of a type the encoder cannot write carries its own fix (a cast); a column
    the table lacks gets the generic one; the message never says "Fix:" twice for one."""
    from sqlsink.errors import ConfigError

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint, amount float8)").format(sql.Identifier(table))
        )
        options = SinkOptions.parse({"url": pg_url, "table": table, "sinkId": "fit"})
        arrow = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(2, 1))])
        with pytest.raises(ConfigError) as typed:
            plan_target(conn, options, ["id", "amount"], None, arrow)  # type: ignore[arg-type]
        text = str(typed.value)
        assert "column 'amount': cannot write Arrow type decimal128(2, 1)" in text
        assert text.count("Fix:") == 1 and "F.col('amount').cast('double')" in text
        with pytest.raises(ConfigError) as missing:
            plan_target(conn, options, ["id", "nope"], None)  # type: ignore[arg-type]
        assert str(missing.value).count("Fix:") == 1
        assert str(missing.value).endswith(
            "select/rename the DataFrame's columns to the table's, or alter the table"
        )


def test_a_timed_partition_writes_the_same_rows_and_records_every_phase(
    pg_url: str, pg_server: PgServer, table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLSINK_TIMING_DIR (benchmarks/batch_split.py) takes the timed branches of the write
    path: the same rows prepared, one record naming every phase; unset, no record."""
    from sqlsink.postgres.timing import ENV as TIMING_ENV

    sink = f"t-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table)))
        options = SinkOptions.parse({"url": pg_url, "table": table, "sinkId": sink})
        target = plan_target(conn, options, ["id"], None)  # type: ignore[arg-type]
        monkeypatch.setenv(TIMING_ENV, str(tmp_path))
        timed = write_partition(options, target, task(sink, 0), rows(range(5)) + rows(range(5, 9)))
        monkeypatch.delenv(TIMING_ENV)
        backend = PostgresBackend(conn)  # type: ignore[arg-type]
        assert timed.gid is not None
        backend.insert_decision(NewDecision(sink, 3, [timed.gid], 9, None, "run1"))
        backend.commit_prepared(timed.gid)
        untimed = TaskIdentity(sink, 4, 0, "run1", 0, 0, query_id=None)
        plain = write_partition(options, target, untimed, rows(range(9, 12)))
        assert (timed.rows, plain.rows) == (9, 3)
        assert plain.gid is not None
        backend.insert_decision(NewDecision(sink, 4, [plain.gid], 3, None, "run1"))
        backend.commit_prepared(plain.gid)
        ids = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
        assert [r[0] for r in ids] == list(range(12))
    (path,) = tmp_path.glob("*.jsonl")
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert (record["batch"], record["partition"], record["rows"]) == (3, 0, 9)
    phases = {"arrow_wait", "session", "begin", "encode", "send", "copy_end", "marker"}
    assert phases | {"prepare", "after_prepare", "total"} == set(record["wall"])
    assert prepared_transactions(pg_server.admin_url) == []
