"""The server's settings are checked before each batch (at planning) and again after its
commit, with the batch's measured partition writes: a warning is logged when the verdict
changes, so once per query start, not once per batch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import sqlsink
from tests.spark.streams import keyed_table, run_foreach_batch, table_ids, write_source

pytestmark = pytest.mark.spark
TOO_SHORT = "statement_timeout = 1min"


def with_timeout(url: str, value: str) -> str:
    glue = "&" if "?" in url else "?"
    return f"{url}{glue}options=-c%20statement_timeout%3D{value}"


def test_a_too_short_timeout_is_said_once_not_once_per_batch(
    spark: Any, tmp_path: Path, pg_url: str, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """statement_timeout = 1min on the writer's sessions: shorter than the 10 min the
    planning check requires before any write was measured, at least 3 x the slowest
    partition write the commit's re-check measures (a few ms). Before: the planning check
    warned and the re-check, sharing the warning's memory, said "now fine", in every one of
    the three batches (six lines); now: the first batch's warning, and once its write is
    measured, that the setting is fine: two lines for the query."""
    keyed_table(pg_url, table)
    writer = sqlsink.ForeachBatchWriter(url=with_timeout(pg_url, "60s"), sink_id=f"fb-{table[2:]}")
    write_source(tmp_path / "src", [range(0, 100), range(100, 200), range(200, 300)])
    caplog.set_level(logging.INFO, logger="sqlsink")
    run_foreach_batch(spark, tmp_path / "src", tmp_path / "chk", writer.to(table))
    assert table_ids(pg_url, table) == list(range(300))
    said = [
        r.getMessage()
        for r in caplog.records
        if "statement_timeout" in r.getMessage() or "are now fine" in r.getMessage()
    ]
    assert len(said) == 2, said
    assert f"fb-{table[2:]}: statement_timeout = 1min (" in said[0]
    assert "is shorter than the conservative floor of 10min" in said[0]
    assert said[1] == f"sqlsink fb-{table[2:]}: the server settings reported before are now fine"
