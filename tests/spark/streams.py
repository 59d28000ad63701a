"""A replayable source of numbered records (JSON files, one per batch) and query helpers."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

SCHEMA = "id BIGINT, payload STRING, ts TIMESTAMP, amount DOUBLE"


def write_source(directory: Path, batches: Sequence[Iterable[int]]) -> None:
    """One file per batch; with maxFilesPerTrigger=1 each file is one micro-batch."""
    directory.mkdir(parents=True, exist_ok=True)
    for number, ids in enumerate(batches):
        lines = [
            json.dumps(
                {
                    "id": i,
                    "payload": f"record {i} ✓",
                    "ts": f"2026-01-01T00:00:{i % 60:02d}Z",
                    "amount": i / 4,
                }
            )
            for i in ids
        ]
        path = directory / f"part-{number:05d}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.rename(path)


def write_records(directory: Path, batches: Sequence[Sequence[dict[str, Any]]]) -> None:
    """Explicit records, one file per batch, in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    for number, records in enumerate(batches):
        path = directory / f"part-{number:05d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def start_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    options: dict[str, str],
    partitions: int | None = 2,
    schema: str = SCHEMA,
) -> Any:
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(source))
    if partitions:  # round-robin: a replay may regroup rows (invariant 7)
        events = events.repartition(partitions)
    writer = events.writeStream.format("sqlsink").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.trigger(availableNow=True).start()


def run_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    options: dict[str, str],
    partitions: int | None = 2,
    schema: str = SCHEMA,
) -> None:
    """Run until the source is drained; raise the query's error if it failed."""
    query = start_query(spark, source, checkpoint, options, partitions, schema)
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()


def table_ids(url: str, table: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
        return [int(str(r[0])) for r in rows]


def decided_batches(url: str, sink_id: str) -> dict[int, bool]:
    """batch -> complete, from the commit log."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT batch_id, completed_at IS NOT NULL FROM sqlsink.decisions "
            "WHERE sink_id = %s ORDER BY batch_id",
            (sink_id,),
        ).fetchall()
    return {int(str(b)): bool(c) for b, c in rows}


def query_id(checkpoint: Path) -> str:
    return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])
