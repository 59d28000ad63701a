"""The driver's listener (spark/listener.py) attacked against a real commit log: a query
restarted in the same process while its old run's end is still on Spark's listener bus.

Spark delivers ``onQueryTerminated`` asynchronously (its listener bus, one thread for
every listener; a slow commit log or another query's end delays it), while the
foreachBatch writer's ``watch`` is called directly from the new run's first batch. The
old run's late end must not take the new run's watch with it: the new run's own end is
then never recorded and status says LIVE, then QUIET, until its runTimeout.

The events are plain objects with the three attributes Spark's ``QueryTerminatedEvent``
gives the listener (id, runId, exception): delivering one on demand is the only way to
order it after the new run's first batch; the database is real.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from sqlsink.options import SinkOptions
from sqlsink.postgres import run_registry
from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import forget_sink
from tests.pg.protocol import new_sink

pytest.importorskip("pyspark")


def terminated(query_id: str, run_id: str, error: str | None = None) -> Any:
    return SimpleNamespace(id=query_id, runId=run_id, exception=error)


def test_old_runs_late_end_keeps_the_new_runs_watch(pg_url: str) -> None:
    from sqlsink.spark.listener import SinkListener

    sink = new_sink()
    query, old, new = str(uuid.uuid4()), uuid.uuid4().hex, uuid.uuid4().hex
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            ensure_schema(conn)
            for run in (old, new):
                run_registry.register_run(conn, sink, run, 300.0, holds_lock=False)
        options = SinkOptions.parse({"url": pg_url, "table": "public.t", "sinkId": sink})
        listener = SinkListener(session=None)
        listener.watch(query, old, sink, options)  # the old run's first batch
        # the query is stopped and started again; the new run's first batch watches
        # before the old run's end reaches the listener
        listener.watch(query, new, sink, options)
        listener.onQueryTerminated(terminated(query, old))
        listener.onQueryTerminated(terminated(query, new, "ValueError: bad row"))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            ends = run_registry.run_ends(conn, sink)
        assert ends[old].how == "stopped"
        assert new in ends, "the new run's end was never recorded"
        assert ends[new].how == "failed"
        assert ends[new].error == "ValueError: bad row"
    finally:
        forget_sink(pg_url, sink)
