"""A foreachBatch function (not wrapped) that catches the writer's error and returns, then
a plain restart: Spark recorded the failed batch committed, so the restart hands the next
batch. The process that saw the failure is gone (the writer's in-process record with it)
and no checkpoint_location was given: only what the commit log holds can tell that the
batch was handed to the writer and never decided. Its next batch must be refused,
naming the lost batch, never written over its loss in silence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sqlsink
from tests.fix_pg import PgServer, prepared_in_test_db
from tests.spark.streams import (
    add_source_file,
    commit_log,
    keyed_table,
    run_foreach_batch,
    table_ids,
    write_source,
)

pytestmark = pytest.mark.spark


def decided(url: str, sink_id: str) -> dict[int, int]:
    return {b: row[0] for b, row in commit_log(url, sink_id, "rows").items()}


def swallowing(writer: sqlsink.ForeachBatchWriter, table: str, failing: int) -> Any:
    def function(df: Any, batch_id: int) -> None:
        try:
            with writer.batch(batch_id) as b:
                b.append(df, table)
                if batch_id == failing:
                    raise RuntimeError(f"a transient failure inside batch {batch_id}")
        except RuntimeError:
            pass  # "keep the stream alive"

    return function


@pytest.mark.parametrize("failing", [0, 1], ids=["fresh-sink", "after-a-decided-batch"])
def test_a_swallowed_failure_then_a_restart_refuses_the_next_batch(
    spark: Any, tmp_path: Path, pg_url: str, pg_server: PgServer, table: str, failing: int
) -> None:
    keyed_table(pg_url, table)
    sink_id = f"fb-{table[2:]}"
    source, checkpoint = tmp_path / "src", tmp_path / "chk"
    write_source(source, [range(5 * b, 5 * b + 5) for b in range(failing + 1)])
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    run_foreach_batch(spark, source, checkpoint, swallowing(writer, table, failing))
    # the failure was swallowed: Spark went on as if the batch were written
    assert table_ids(pg_url, table) == list(range(5 * failing))
    assert sorted(decided(pg_url, sink_id)) == list(range(failing))
    # a plain restart: a new run of the query (Spark's run id: the writer's in-process
    # record of the failure is the old run's), handing the next batch
    add_source_file(source, failing + 1, range(100, 105))
    restarted = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=sink_id)
    with pytest.raises(Exception) as stopped:
        run_foreach_batch(spark, source, checkpoint, swallowing(restarted, table, -1))
    text = str(stopped.value)
    print(f"the restart stopped with: {text[text.find('sink ') :][:700]}")
    assert f"data loss: sink {sink_id!r}: batch {failing} was handed to the writer" in text
    assert f"--mark-skipped {failing}" in text
    assert table_ids(pg_url, table) == list(range(5 * failing))  # nothing of the next one
    assert sorted(decided(pg_url, sink_id)) == list(range(failing))
    assert prepared_in_test_db(pg_server) == []
