"""Issue 30's proof for the metrics: a real Prometheus scraping ``sqlsink metrics``
while a real streaming query (format("sqlsink"), a trigger every half second) commits
batches, and a query of the scraped series showing the rows committed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fix_pg import forget_sink
from tests.fix_prometheus import exporter, prometheus
from tests.spark.streams import SCHEMA, add_source_file, table_ids

pytestmark = pytest.mark.spark


def test_prometheus_scrapes_the_rows_of_a_running_stream(
    spark: Any, tmp_path: Path, pg_url: str, table: str
) -> None:
    sink = f"metrics-{uuid.uuid4().hex[:8]}"
    source = tmp_path / "src"
    add_source_file(source, 0, range(0, 30))
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("sqlsink")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .options(url=pg_url, table=table, createTable="true", sinkId=sink)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    rows = f'sqlsink_rows_committed_total{{sink="{sink}"}}'
    try:
        with exporter(pg_url) as served, prometheus(f"127.0.0.1:{served.port}") as server:
            server.wait_for_value(rows, 30, timeout_s=120)
            server.wait_for_value(f'sqlsink_live_runs{{sink="{sink}"}}', 1)
            add_source_file(source, 1, range(30, 75))  # the stream goes on: two more batches
            add_source_file(source, 2, range(75, 100))
            server.wait_for_value(rows, 100, timeout_s=120)
            server.wait_for_value(f'sqlsink_batches_committed_total{{sink="{sink}"}}', 3)
            assert query.exception() is None
    finally:
        query.stop()
        forget_sink(pg_url, sink)
    assert table_ids(pg_url, table) == list(range(100))
