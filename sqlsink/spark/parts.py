"""One DataFrame of a foreachBatch batch: its shape before the write (the partition cap,
ranges of the table's key, one partition for a replace, the prepared-transaction
slots it needs) and the Spark job whose tasks prepare its partitions."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlsink.core.model import PartitionOutcome
from sqlsink.errors import ConfigError
from sqlsink.options import Mode, SinkOptions

if TYPE_CHECKING:
    from sqlsink.postgres.target import TargetPlan
    from sqlsink.spark.foreach_batch import Identity

_OUTCOME_SCHEMA = "outcome binary"


def capped(df: Any, options: SinkOptions) -> Any:
    """Option maxPartitions: each non-empty partition takes a connection and a
    prepared-transaction slot, so the DataFrame is coalesced to at most that many
    partitions (no shuffle; the work before it runs in as many tasks, which
    ``repartition(n)`` before the write avoids when it needs more)."""
    cap = options.max_partitions
    if cap is None:
        return df
    try:
        if int(df.rdd.getNumPartitions()) <= cap:
            return df
    except Exception:  # Spark Connect has no RDDs: coalesce anyway (fewer is a no-op)
        pass
    return df.coalesce(cap)


def by_key(df: Any, key: Sequence[str], options: SinkOptions) -> Any:
    """Rows in key order within each partition (the key-order trap, core/key_ranges.py):
    ``repartition(n)`` hands each partition its rows in random key order, and inserting
    them at random places of the key's index costs PostgreSQL 2-3x the CPU of key order
    (``benchmarks/trap.py``). Append: sorted within each partition, no shuffle. Upsert:
    also range-partitioned by the key first (as many partitions as before), so that all
    rows of a key are in one partition and no two prepared transactions of the batch
    lock the same row."""
    if options.mode is not Mode.UPSERT:
        return df.sortWithinPartitions(*key)
    try:
        partitions = int(df.rdd.getNumPartitions())
    except Exception:  # Spark Connect has no RDDs: Spark's shuffle partitions, then the cap
        ranged = df.repartitionByRange(*key)
        cap = options.max_partitions
        return (ranged.coalesce(cap) if cap is not None else ranged).sortWithinPartitions(*key)
    if partitions > 1:
        df = df.repartitionByRange(partitions, *key)
    return df.sortWithinPartitions(*key)


def one_partition(df: Any) -> Any:
    """Exactly one partition, even for an empty result (which must empty the table)."""
    single = df.coalesce(1)
    try:
        if int(single.rdd.getNumPartitions()) == 1:
            return single
    except Exception:  # Spark Connect has no RDDs: a shuffle into one partition always has one
        pass
    return df.repartition(1)


def check_slots(df: Any, options: SinkOptions, before: int, batch_id: int) -> int:
    """Issue 12 item 12: every partition of the batch stays prepared until its commit, so
    a server with fewer prepared-transaction slots than the batch's partitions can never
    commit it. This writer knows the count before writing (the data source does not):
    refuse before any slot is taken. Returns this DataFrame's partition count."""
    from sqlsink.options import Semantic
    from sqlsink.postgres import appnames
    from sqlsink.postgres.checks import require_prepared_transactions
    from sqlsink.postgres.connection import connect

    try:
        partitions = int(df.rdd.getNumPartitions())
    except Exception:  # Spark Connect has no RDDs: the tasks' own check (53200) remains
        return 0
    if options.semantic is not Semantic.EXACTLY_ONCE:
        return partitions
    total = before + partitions
    if total <= _SLOTS_OK.get(options.url, 0):  # the slots only change with a restart
        return partitions
    with connect(options.url, options.password, application_name=appnames.PLANNER) as conn:
        try:
            require_prepared_transactions(conn, total)
        except ConfigError as exc:
            if exc.context.get("value") == "0":
                raise  # disabled: no partition count helps, the sentence says what does
            raise ConfigError(
                f"batch {batch_id}: {total} partitions planned (this DataFrame's {partitions}"
                + (f", after {before} of the batch's earlier DataFrames" if before else "")
                + f"), nothing written: {exc.message}; or write fewer partitions "
                "(the option maxPartitions, or batch_df.coalesce(n))",
                **exc.context,
            ) from None
    _SLOTS_OK[options.url] = total
    return partitions


# url -> the most partitions a batch was checked to have slots for (this process);
# the tasks' own error (SQLSTATE 53200) stays the backstop after a server restart
_SLOTS_OK: dict[str, int] = {}


def prepare_part(
    df: Any,
    options: SinkOptions,
    target: TargetPlan,
    identity: Identity,
    batch_id: int,
    part: int,
) -> list[PartitionOutcome | None]:
    """One Spark job: every task prepares its partition; their outcomes, on the driver."""
    sink_id = options.sink_id
    assert sink_id is not None
    query_id, run_id = identity.query_id, identity.run_id

    def prepare(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from sqlsink.postgres.partition import write_partition
        from sqlsink.spark.task import current_task

        task = current_task(sink_id, batch_id, run_id, query_id, part)
        outcome = write_partition(options, target, task, batches)
        yield pa.RecordBatch.from_pydict(
            {"outcome": [pickle.dumps(outcome)]}, schema=pa.schema([("outcome", pa.binary())])
        )

    rows = df.mapInArrow(prepare, _OUTCOME_SCHEMA).collect()
    outcomes: list[PartitionOutcome | None] = [pickle.loads(r["outcome"]) for r in rows]
    return outcomes
