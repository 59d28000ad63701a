"""A streaming task's identity comes from Spark, or the task fails (issue 12 item 17)."""

from __future__ import annotations

import pytest

from sqlsink.errors import ConfigError
from sqlsink.spark.datasource import stream_identity

GOOD = {"streaming.sql.batchId": "7", "spark.jobGroup.id": "run-1", "sql.streaming.queryId": "q"}


def test_the_identity_is_read_from_sparks_local_properties() -> None:
    assert stream_identity(GOOD.get) == (7, "run-1", "q")


@pytest.mark.parametrize("missing", sorted(GOOD))
def test_a_missing_property_fails_instead_of_falling_back(missing: str) -> None:
    """Batch 0 and run "norun" were the fallbacks: a batch written under another name."""
    props = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ConfigError, match=missing.replace(".", r"\.")) as refused:
        stream_identity(props.get)
    assert "foreachBatch" in str(refused.value)


def test_a_batch_id_that_is_not_a_number_fails() -> None:
    with pytest.raises(ConfigError):
        stream_identity({**GOOD, "streaming.sql.batchId": "x"}.get)
