"""``Batch._decided_meanwhile`` (``sqlsink/spark/batch.py``): tasks of a batch found it
decided, which it was not when it was handed over (another hand-over decided it
meanwhile). The rule again on the decision as it is now: read once from a real commit
log, each of the batch's tables judged on it (``core/writer_batch.judge_part``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from sqlsink.core.model import NewDecision
from sqlsink.errors import ConfigError
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.schema import ensure_schema
from sqlsink.spark.batch import Batch


class CountingBackend(PostgresBackend):
    """The real backend; it counts its reads of decisions."""

    reads = 0

    def decisions(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return super().decisions(*args, **kwargs)


def meanwhile(backend: PostgresBackend, sink: str, run: str, tables: list[str]) -> None:
    batch = Batch(SimpleNamespace(sink_id=sink), 0)  # type: ignore[arg-type]
    batch.identity = SimpleNamespace(run_id=run)  # type: ignore[assignment]
    batch.tables = tables
    batch._decided_meanwhile(backend)


def test_the_decision_is_read_once_and_every_table_judged_on_it(pg_url: str, sink: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        backend = CountingBackend(conn)  # type: ignore[arg-type]
        assert backend.insert_decision(
            NewDecision(sink, 0, [], 0, "q", "r-other", tables=["public.a"])
        )
        backend.reads = 0
        meanwhile(backend, sink, "r-new", ["public.a"])  # a replay of what was decided
        assert backend.reads == 1
        backend.reads = 0
        with pytest.raises(ConfigError, match="decided by an earlier run") as refused:
            meanwhile(backend, sink, "r-new", ["public.a", "public.b", "public.c"])
        print(refused.value)
        assert "'public.b'" in str(refused.value) and backend.reads == 1
        backend.reads = 0
        with pytest.raises(ConfigError, match="already decided by this very run"):
            meanwhile(backend, sink, "r-other", ["public.a", "public.b"])
        assert backend.reads == 1
