"""``sqlsink recover`` run again and again beside a live streaming query (issue 12 item 7).

Every batch has moments with its partitions prepared and nothing of the query connected
(the tasks closed after PREPARE; the commit runs in a Python worker that is still
starting). A recover that judged liveness by connected sessions rolled the batch back
there, and the query failed at its commit. Judged by the runs registry, the live run's
transactions are left for its own commit: the query finishes every batch, each record
lands exactly once, and nothing stays prepared.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import PgServer, forget_sink, prepared_transactions
from tests.pg.test_cli import Result
from tests.spark.streams import decided_batches, start_query, table_ids, write_source

pytestmark = pytest.mark.spark

BATCHES = 8
ROOT = Path(__file__).resolve().parents[2]


def recover(pg_url: str, sink: str) -> Result:
    """The real command line, as an operator runs it: a process of its own."""
    proc = subprocess.run(
        [sys.executable, "-m", "sqlsink", "recover", "--url", pg_url, "--sink-id", sink, "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_recover_called_repeatedly_beside_a_live_query_never_breaks_it(
    spark: Any, tmp_path: Path, pg_url: str, table: str, pg_server: PgServer
) -> None:
    sink = f"beside-{uuid.uuid4().hex[:8]}"
    records = [range(b * 25, b * 25 + 25) for b in range(BATCHES)]
    write_source(tmp_path / "src", records)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # a recover before the first batch
    results: list[Result] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            results.append(recover(pg_url, sink))

    options = {"url": pg_url, "table": table, "createTable": "true", "sinkId": sink}
    query = start_query(spark, tmp_path / "src", tmp_path / "chk", options)
    beside = threading.Thread(target=loop, name="recover-loop", daemon=True)
    beside.start()
    try:
        query.awaitTermination(300)
    finally:
        stop.set()
        beside.join(timeout=150)
    try:
        assert query.exception() is None, query.exception()
        assert not query.isActive
        assert table_ids(pg_url, table) == list(range(BATCHES * 25))  # each record once
        assert decided_batches(pg_url, sink) == dict.fromkeys(range(BATCHES), True)
        assert [g for g, _ in prepared_transactions(pg_server.admin_url) if sink in g] == []
        assert len(results) >= 2
        for result in results:  # never an error, never a loss; a live run's gids: left
            assert result.code in (0, 1), result.out + result.err
            doc = result.json
            assert doc["data_loss"] == [] and doc["error"] is None
            for sink_doc in doc["sinks"]:
                assert sink_doc["status"] in ("recovered", "nothing to do"), sink_doc
                assert sink_doc["rolled_back"] == 0, sink_doc
        left = [r for r in results if _left_a_live_runs_transaction(r.json)]
        print(f"{len(results)} recovers beside {BATCHES} batches; {len(left)} left live gids")
    finally:
        forget_sink(pg_url, sink)


def _left_a_live_runs_transaction(doc: dict[str, Any]) -> bool:
    return any(a["action"] == "leave" and a["reason"].endswith(" is live") for a in doc["actions"])
