"""Spark's TimestampType into ``timestamp`` (without time zone) keeps the wall time of the
session time zone (``spark.sql.session.timeZone``), as the user sees it in Spark: 00:00 in
New York is stored as 00:00, not 05:00 (issue 29 item 4). Into ``timestamptz`` the instant
is exact. Both entry points, a stream and a batch write, in New York and in UTC, with the
values around New York's spring-forward.

The suite shares one SparkSession (in UTC): each test sets the zone and restores it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg import sql

import sqlsink
from tests.spark.streams import write_records

pytestmark = pytest.mark.spark

ZONES = ["America/New_York", "UTC"]
# wall times as a user writes them in Spark, in the session's zone: midnight, the last
# microsecond before New York's 2026 spring-forward (02:00 EST -> 03:00 EDT) and the first
# after, and a summer (EDT) midnight
WALL = [
    dt.datetime(2026, 1, 15),
    dt.datetime(2026, 3, 8, 1, 59, 59, 999_999),
    dt.datetime(2026, 3, 8, 3),
    dt.datetime(2026, 7, 1),
]
SCHEMA = "id BIGINT, at TIMESTAMP"
DDL = "CREATE TABLE {} (id bigint PRIMARY KEY, local_at timestamp, at timestamptz)"


@pytest.fixture(params=ZONES)
def zone(request: pytest.FixtureRequest, spark: Any) -> Iterator[str]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", request.param)
    try:
        yield str(request.param)
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def make(url: str, table: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(DDL).format(sql.Identifier(table)))


def records() -> list[dict[str, Any]]:
    # no offset in the text: Spark reads it in the session's zone
    return [{"id": i, "at": t.isoformat()} for i, t in enumerate(WALL)]


def frame(spark: Any) -> Any:
    """The records as a DataFrame with both columns from the one TimestampType value."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [(r["id"], r["at"]) for r in records()], "id BIGINT, text STRING"
    ).select("id", F.to_timestamp("text").alias("at"))
    return df.select("id", F.col("at").alias("local_at"), "at")


def stored(url: str, table: str) -> list[tuple[int, dt.datetime, dt.datetime]]:
    with psycopg.connect(url) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        query = sql.SQL("SELECT id, local_at, at FROM {} ORDER BY id").format(sql.Identifier(table))
        return conn.execute(query).fetchall()


def check(url: str, table: str, zone: str) -> None:
    want = [
        (i, wall, wall.replace(tzinfo=ZoneInfo(zone)).astimezone(dt.timezone.utc))
        for i, wall in enumerate(WALL)
    ]
    assert stored(url, table) == want


def test_stream(spark: Any, pg_url: str, table: str, tmp_path: Path, zone: str) -> None:
    make(pg_url, table)
    write_records(tmp_path / "src", [records()[:2], records()[2:]])
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
    stream = events.json(str(tmp_path / "src")).selectExpr("id", "at AS local_at", "at")
    query = (
        stream.writeStream.format("sqlsink")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .option("url", pg_url)
        .option("table", table)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    check(pg_url, table, zone)


def test_batch_write(spark: Any, pg_url: str, table: str, zone: str) -> None:
    make(pg_url, table)
    frame(spark).repartition(2).write.format("sqlsink").mode("append").option("url", pg_url).option(
        "table", table
    ).save()
    check(pg_url, table, zone)


def test_foreach_batch_writer(
    spark: Any, pg_url: str, table: str, tmp_path: Path, zone: str
) -> None:
    make(pg_url, table)
    write_records(tmp_path / "src", [records()])
    writer = sqlsink.ForeachBatchWriter(url=pg_url, sink_id=f"fb-{table[2:]}")
    to_table = writer.to(table)

    def write(df: Any, batch_id: int) -> None:
        to_table(df.selectExpr("id", "at AS local_at", "at"), batch_id)

    events = spark.readStream.schema(SCHEMA).json(str(tmp_path / "src"))
    query = (
        events.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    check(pg_url, table, zone)


def test_created_table_keeps_the_instant(spark: Any, pg_url: str, table: str, zone: str) -> None:
    """createTable makes TimestampType a timestamptz column: the instant, in every zone."""
    frame(spark).drop("local_at").write.format("sqlsink").mode("append").option(
        "url", pg_url
    ).option("table", table).option("createTable", "true").save()
    with psycopg.connect(pg_url) as conn:
        kind = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attname = 'at'",
            (table,),
        ).fetchone()
    assert kind == ("timestamp with time zone",)
    got = [row[1] for row in sorted(stored_at(pg_url, table))]
    assert got == [w.replace(tzinfo=ZoneInfo(zone)).astimezone(dt.timezone.utc) for w in WALL]


def stored_at(url: str, table: str) -> list[tuple[int, dt.datetime]]:
    with psycopg.connect(url) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        query = sql.SQL("SELECT id, at FROM {}").format(sql.Identifier(table))
        return conn.execute(query).fetchall()
