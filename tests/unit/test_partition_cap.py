"""Option maxPartitions (issue 15, "Connections"), and the first line of a failed connect."""

from __future__ import annotations

import socket

import pytest

from sqlsink.errors import ConfigError, TransientError
from sqlsink.options import SinkOptions
from sqlsink.postgres.connection import connect
from sqlsink.spark.datasource import check_partition_cap

BASE = {"url": "postgresql://app@db/shop", "table": "t"}


def test_max_partitions_is_a_count_and_optional() -> None:
    assert SinkOptions.parse(BASE).max_partitions is None
    assert SinkOptions.parse({**BASE, "MAXPARTITIONS": "16"}).max_partitions == 16
    for bad in ("0", "-1", "many"):
        with pytest.raises(ConfigError, match="option maxPartitions"):
            SinkOptions.parse({**BASE, "maxPartitions": bad})


def test_a_task_beyond_the_cap_refuses_with_the_fix() -> None:
    options = SinkOptions.parse({**BASE, "maxPartitions": "4"})
    check_partition_cap(options, 3, batch_id=7)  # partitions 0..3: within the cap
    check_partition_cap(SinkOptions.parse(BASE), 500, batch_id=7)  # no cap
    with pytest.raises(ConfigError) as refused:
        check_partition_cap(options, 4, batch_id=7)
    assert str(refused.value).startswith(
        "batch 7 has more than maxPartitions=4 partitions (this task writes partition 4)"
    )
    assert "fix: write df.coalesce(4)" in str(refused.value)


def test_connection_refused_names_host_port_and_fix_first() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://app:topsecret@127.0.0.1:{port}/shop"
    with pytest.raises(TransientError) as failed:
        connect(url, application_name="test")
    text = str(failed.value)
    assert text.splitlines()[0].startswith(
        f"cannot connect to PostgreSQL at postgresql://app:***@127.0.0.1:{port}/shop: "
        f"nothing accepts connections at 127.0.0.1:{port} (connection refused); fix: "
    )
    assert len(text.splitlines()) == 1 and "topsecret" not in text
