"""The first errors a new user meets, as PySpark raises them (issue 15 item 1), and the
cap on a batch's partitions (issue 15, "Connections": option maxPartitions).

Against a server as installed (max_prepared_transactions = 0), a server that refuses
a password, and a port where nothing listens: the first line of what the user reads
(``str(exception)``) must carry the sink's own sentence and fix, right after Spark's
fixed prefix, with no Python traceback, no PicklingError, no secret; and nothing may
be written. Spark's own prefix ("[STREAM_FAILED] Query [...] terminated with
exception: [PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer:")
is not the sink's to change.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sqlsink
from sqlsink.embedded import EmbeddedPostgres
from sqlsink.errors import ConfigError
from tests.spark.streams import SCHEMA, start_query, table_ids, write_source

pytestmark = pytest.mark.spark

# what Spark puts before the writer's error: the query's wrapper (streaming), then the
# data source's
SPARK_PREFIX = re.compile(
    r"^(\[STREAM_FAILED\] Query \[id = [0-9a-f-]+, runId = [0-9a-f-]+\] terminated with "
    r"exception: )?\[PYTHON_DATA_SOURCE_ERROR\] Failed to initialize Python data source "
    r"writer: "
)
DISABLED = "prepared transactions are disabled on this server (127.0.0.1:{port}): set "
DISABLED += "max_prepared_transactions to at least 64 and restart PostgreSQL"
SECRET = "s3cret-not-shown"


@pytest.fixture(scope="module")
def no_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A server as installed: max_prepared_transactions = 0; the role app logs in with
    the password 'right' only (scram), the rest is trusted."""
    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("noslots")), settings={"max_prepared_transactions": 0}
    )
    with server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE ROLE app LOGIN SUPERUSER PASSWORD 'right'")
            hba = server.data_dir / "pg_hba.conf"
            rules = "host all app 127.0.0.1/32 scram-sha-256\n"
            hba.write_text(rules + hba.read_text(), encoding="utf-8")
            conn.execute("SELECT pg_reload_conf()")
        yield server


@pytest.fixture(scope="module")
def four_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with four prepared-transaction slots: a batch of six partitions can
    never commit there."""
    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("fourslots")), settings={"max_prepared_transactions": 4}
    )
    with server:
        yield server.url()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def first_line(exc: BaseException) -> str:
    """The first line of what PySpark shows, after Spark's own fixed prefix."""
    text = str(exc)
    line = text.splitlines()[0]
    match = SPARK_PREFIX.match(line)
    assert match, f"not Spark's prefix: {line[:300]}"
    assert "Traceback" not in text and "PicklingError" not in text, text[:2000]
    assert SECRET not in text
    return line[match.end() :]


def stream_error(spark: Any, tmp: Path, options: dict[str, str]) -> BaseException:
    write_source(tmp / "src", [range(0, 5)])
    query = start_query(spark, tmp / "src", tmp / "chk", options)
    with pytest.raises(Exception) as failed:
        query.awaitTermination()
    return failed.value


def batch_error(spark: Any, options: dict[str, str]) -> BaseException:
    writer = spark.range(0, 5).write.format("sqlsink").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception) as failed:
        writer.save()
    return failed.value


def foreach_batch_error(spark: Any, tmp: Path, url: str) -> tuple[BaseException, str]:
    """(the error of the query, its Python error line) for a foreachBatch writer."""
    writer = sqlsink.ForeachBatchWriter(url=url, sink_id="first", createTable="true")
    write_source(tmp / "src", [range(0, 5)])
    events = spark.readStream.schema(SCHEMA).json(str(tmp / "src"))
    query = (
        events.writeStream.foreachBatch(writer.to("events"))
        .option("checkpointLocation", str(tmp / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as failed:
        query.awaitTermination()
    text = str(failed.value)
    assert SECRET not in text and "PicklingError" not in text
    # py4j hands Spark the function's traceback (traceback.format_exc()): the sink's
    # line is its last; what the sink controls is that line
    lines = [line for line in text.splitlines() if line.startswith("sqlsink.errors.")]
    assert lines, text[:2000]
    return failed.value, lines[0]


def nothing_written(server: EmbeddedPostgres) -> None:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT to_regclass('public.events'), to_regnamespace('sqlsink'), "
            "(SELECT count(*) FROM pg_prepared_xacts)"
        ).fetchone()
    assert row == (None, None, 0)


# -- max_prepared_transactions = 0 ---------------------------------------------------------


def test_stream_without_prepared_transactions(
    spark: Any, tmp_path: Path, no_slots: EmbeddedPostgres
) -> None:
    options = {"url": no_slots.url(), "table": "events", "createTable": "true"}
    line = first_line(stream_error(spark, tmp_path, options))
    assert line.startswith("sqlsink.errors.ConfigError: " + DISABLED.format(port=no_slots.port))
    assert "fix: ALTER SYSTEM SET max_prepared_transactions = 64" in line
    nothing_written(no_slots)


def test_batch_write_without_prepared_transactions(spark: Any, no_slots: EmbeddedPostgres) -> None:
    options = {"url": no_slots.url(), "table": "events", "createTable": "true"}
    line = first_line(batch_error(spark, options))
    assert line.startswith("sqlsink.errors.ConfigError: " + DISABLED.format(port=no_slots.port))
    nothing_written(no_slots)


def test_foreach_batch_without_prepared_transactions(
    spark: Any, tmp_path: Path, no_slots: EmbeddedPostgres
) -> None:
    _, line = foreach_batch_error(spark, tmp_path, no_slots.url())
    assert line.startswith("sqlsink.errors.ConfigError: " + DISABLED.format(port=no_slots.port))
    # called directly (its own batch() in foreachBatch, a test), the error is the sink's
    writer = sqlsink.ForeachBatchWriter(url=no_slots.url(), sink_id="first", query_id="q")
    with pytest.raises(ConfigError) as refused:
        writer.to("events")(spark.range(0, 5), 0)
    assert str(refused.value).startswith(DISABLED.format(port=no_slots.port))
    nothing_written(no_slots)


# -- cannot connect: nothing listens, or a wrong password ---------------------------------


def test_nothing_listening(spark: Any, tmp_path: Path) -> None:
    port = free_port()
    url = f"postgresql://app:{SECRET}@127.0.0.1:{port}/shop"
    expected = (
        f"sqlsink.errors.TransientError: cannot connect to PostgreSQL at "
        f"postgresql://app:***@127.0.0.1:{port}/shop: nothing accepts connections at "
        f"127.0.0.1:{port} (connection refused); fix: start PostgreSQL there, or correct "
        "the host and port in the url option"
    )
    options = {"url": url, "table": "events"}
    assert first_line(stream_error(spark, tmp_path, options)).startswith(expected)
    assert first_line(batch_error(spark, options)).startswith(expected)
    _, line = foreach_batch_error(spark, tmp_path / "fb", url)
    assert line.startswith(expected)


def test_wrong_password(spark: Any, tmp_path: Path, no_slots: EmbeddedPostgres) -> None:
    url = f"postgresql://app:{SECRET}@127.0.0.1:{no_slots.port}/postgres"
    expected = (
        f"sqlsink.errors.TransientError: cannot connect to PostgreSQL at "
        f"postgresql://app:***@127.0.0.1:{no_slots.port}/postgres: the server at "
        f"127.0.0.1:{no_slots.port} refused the login of user app (wrong password, or "
        "pg_hba.conf does not let this client in); fix: give the user's current password"
    )
    options = {"url": url, "table": "events", "createTable": "true"}
    assert first_line(stream_error(spark, tmp_path, options)).startswith(expected)
    assert first_line(batch_error(spark, options)).startswith(expected)
    _, line = foreach_batch_error(spark, tmp_path / "fb", url)  # the foreachBatch writer's
    assert line.startswith(expected)
    assert SECRET not in line
    nothing_written(no_slots)


# -- maxPartitions ---------------------------------------------------------------------------


def test_foreach_batch_coalesces_to_max_partitions(spark: Any, four_slots: str) -> None:
    """Six partitions on a server with four slots: refused before writing without the
    cap (issue 12 item 12); with maxPartitions=2 each batch is coalesced and commits."""
    frame = spark.range(0, 60).repartition(6)
    plain = sqlsink.ForeachBatchWriter(
        url=four_slots, sink_id="cap-plain", query_id="q-plain", createTable="true"
    )
    with pytest.raises(ConfigError, match="6 partitions planned"):
        plain.to("capped_plain")(frame, 0)
    capped = sqlsink.ForeachBatchWriter(
        url=four_slots,
        sink_id="cap-fb",
        query_id="q-fb",
        createTable="true",
        maxPartitions="2",
    )
    capped.to("capped_fb")(frame, 0)
    assert table_ids(four_slots, "capped_fb") == list(range(60))
    with psycopg.connect(four_slots, autocommit=True) as conn:
        row = conn.execute(
            "SELECT cardinality(gids) FROM sqlsink.decisions WHERE sink_id = 'cap-fb'"
        ).fetchone()
    assert row is not None and 0 < row[0] <= 2  # one gid per non-empty partition


def test_data_source_refuses_a_batch_beyond_max_partitions(spark: Any, four_slots: str) -> None:
    """format('sqlsink') cannot coalesce: a task beyond the cap refuses before it
    connects, naming the cap and the fix; nothing is committed, nothing stays prepared."""
    options = {"url": four_slots, "table": "capped_ds", "createTable": "true"}

    def save(df: Any, **more: str) -> None:
        writer = df.write.format("sqlsink").mode("append")
        for key, value in {**options, **more}.items():
            writer = writer.option(key, value)
        writer.save()

    with pytest.raises(Exception) as refused:
        save(spark.range(0, 60).repartition(3), maxPartitions="2")
    text = str(refused.value)
    assert "batch 0 has more than maxPartitions=2 partitions" in text
    assert "fix: write df.coalesce(2)" in text
    with psycopg.connect(four_slots, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM capped_ds").fetchone() == (0,)
    save(spark.range(0, 60).repartition(3).coalesce(2), maxPartitions="2")
    assert table_ids(four_slots, "capped_ds") == list(range(60))


def test_max_partitions_above_the_slots_is_refused_at_planning(spark: Any, four_slots: str) -> None:
    """maxPartitions=8 on a server with four slots: no batch of that size could commit,
    so planning refuses before the commit log or the table is touched."""
    options = {
        "url": four_slots,
        "table": "capped_never",
        "createTable": "true",
        "maxPartitions": "8",
    }
    line = first_line(batch_error(spark, options))
    assert line.startswith(
        "sqlsink.errors.ConfigError: max_prepared_transactions = 4 is fewer than the 8 "
        "partitions of a batch"
    )
    assert "maxPartitions=2" in line
    with psycopg.connect(four_slots, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.capped_never')").fetchone() == (None,)
