"""The one local[2] SparkSession of the benchmark, and streaming queries run to the end."""

from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload import SPARK_SCHEMA

JDBC_JAR = Path("/usr/share/java/postgresql.jar")


def start_session() -> Any:
    """local[2]; the JDBC driver on the class path when installed (scripts/ensure-jdbc.sh)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import sqlsink

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("sqlsink-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    )
    if JDBC_JAR.is_file():
        builder = builder.config("spark.jars", str(JDBC_JAR))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sqlsink.register(spark)
    return spark


def spark_facts(spark: Any) -> dict[str, Any]:
    jvm = spark.sparkContext._jvm
    return {
        "spark": spark.version,
        "java": str(jvm.System.getProperty("java.version")),
        "master": spark.sparkContext.master,
        "jdbc_jar": str(JDBC_JAR) if JDBC_JAR.is_file() else None,
    }


@dataclass(frozen=True)
class StreamRun:
    """A streaming query run from start() to awaitTermination()."""

    seconds: float
    progress: list[dict[str, Any]]

    def trigger_ms(self) -> list[int]:
        return [int(p["durationMs"].get("triggerExecution", 0)) for p in self.progress]


@dataclass(frozen=True)
class Sink:
    """Where a streaming query writes: a format and its options."""

    format: str
    options: dict[str, str]

    @classmethod
    def sqlsink(cls, url: str, table: str, semantic: str, mode: str = "append") -> Sink:
        return cls("sqlsink", {"url": url, "table": table, "semantic": semantic, "mode": mode})

    @classmethod
    def noop(cls) -> Sink:
        return cls("noop", {})


def read_stream(spark: Any, source: Path, *, files_per_trigger: int | None = None) -> Any:
    reader = spark.readStream.schema(SPARK_SCHEMA)
    if files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", files_per_trigger)
    return reader.parquet(str(source))


def start_query(frame: Any, sink: Sink, checkpoints: Path, trigger: dict[str, Any]) -> Any:
    """Start with a fresh checkpoint (so a fresh query id, so a fresh sink id)."""
    checkpoint = checkpoints / f"{sink.format}-{uuid.uuid4().hex[:12]}"
    writer = frame.writeStream.format(sink.format).option("checkpointLocation", str(checkpoint))
    for key, value in sink.options.items():
        writer = writer.option(key, value)
    return writer.trigger(**trigger).start()


def run_foreach_batch_available_now(
    frame: Any, function: Any, checkpoints: Path, name: str
) -> StreamRun:
    """The same through ``foreachBatch(function)``, with a fresh checkpoint."""
    checkpoint = checkpoints / f"{name}-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    query = (
        frame.writeStream.foreachBatch(function)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"streaming query through foreachBatch failed: {query.exception()}")
    return StreamRun(seconds, list(query.recentProgress))


def run_available_now(frame: Any, sink: Sink, checkpoints: Path) -> StreamRun:
    """Drain the source with trigger(availableNow=True); timed from start() to the end."""
    started = time.perf_counter()
    query = start_query(frame, sink, checkpoints, {"availableNow": True})
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"streaming query into {sink.format} failed: {query.exception()}")
    return StreamRun(seconds, list(query.recentProgress))
