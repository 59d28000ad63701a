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
    from sqlsink.core.loading import TargetPlan
    from sqlsink.spark.identity import Identity

_OUTCOME_SCHEMA = "outcome binary"


def partition_count(df: Any) -> int | None:
    """The DataFrame's partitions, when Spark can say without running anything; None where
    it cannot (and on Spark Connect, which has no plans to ask). Asked once per DataFrame,
    before it is reshaped.

    A plan without a shuffle answers from its RDD, which builds no job. A plan with one is
    adaptive (AQE): building its RDD runs its shuffle stages, and the write that follows
    plans the DataFrame again and runs them again, so every batch would compute its input
    twice (``df.rdd.getNumPartitions()`` did, for a stream after ``repartition(n)``). Its
    count is read from the plan when the user fixed it (``repartition(n)``,
    ``repartitionByRange(n, ...)``, below operators that keep it); the shuffles Spark adds
    for a join or an aggregation are coalesced by AQE when they run, so their count is
    unknown here. With AQE switched off, building the RDD runs nothing but a range
    partitioning's sampling job, as asking Spark's own RDD always did."""
    try:
        execution = df._jdf.queryExecution()
        plan = execution.executedPlan()
        if plan.nodeName() != "AdaptiveSparkPlan":
            return int(execution.toRdd().getNumPartitions())
        return _fixed_by_user(plan.inputPlan())
    except Exception:  # Spark Connect (no _jdf), or a Spark whose plans differ
        return None


def _fixed_by_user(node: Any) -> int | None:
    """The partition count of a physical plan when a user's repartition fixed it: its
    exchange (of origin REPARTITION_BY_NUM), reached through the operators above it that
    keep their child's partitioning."""
    while True:
        if node.getClass().getSimpleName() == "ShuffleExchangeExec":
            if str(node.shuffleOrigin().toString()) == "REPARTITION_BY_NUM":
                return int(node.outputPartitioning().numPartitions())
            return None
        children = node.children()
        if children.size() != 1:
            return None
        child = children.apply(0)
        if not node.outputPartitioning().equals(child.outputPartitioning()):
            return None
        node = child


def capped(df: Any, options: SinkOptions, count: int | None) -> tuple[Any, int | None]:
    """Option maxPartitions: each non-empty partition takes a connection and a
    prepared-transaction slot, so the DataFrame is coalesced to at most that many
    partitions (no shuffle; the work before it runs in as many tasks, which
    ``repartition(n)`` before the write avoids when it needs more). Returns it with its
    partition count (None: unknown)."""
    cap = options.max_partitions
    if cap is None or (count is not None and count <= cap):
        return df, count
    # an unknown count is coalesced anyway (fewer is a no-op)
    return df.coalesce(cap), None if count is None else cap


def by_key(df: Any, key: Sequence[str], options: SinkOptions, count: int | None) -> Any:
    """Rows in key order within each partition (the key-order trap, core/key_ranges.py):
    ``repartition(n)`` hands each partition its rows in random key order, and inserting
    them at random places of the key's index costs PostgreSQL 2-3x the CPU of key order
    (``benchmarks/trap.py``). Append: sorted within each partition, no shuffle. Upsert:
    also range-partitioned by the key first (the same ``count`` of partitions), so that
    all rows of a key are in one partition and no two prepared transactions of the batch
    lock the same row."""
    if options.mode is Mode.UPSERT:
        if count is None:  # Spark Connect: Spark's shuffle partitions, then the cap
            ranged = df.repartitionByRange(*key)
            cap = options.max_partitions
            df = ranged.coalesce(cap) if cap is not None else ranged
        elif count > 1:
            df = df.repartitionByRange(count, *key)
    return df.sortWithinPartitions(*key)


def one_partition(df: Any, count: int | None) -> Any:
    """Exactly one partition, even for an empty result (which must empty the table): a
    DataFrame without partitions, or of an unknown count, is shuffled into one."""
    return df.coalesce(1) if count else df.repartition(1)


def check_slots(count: int | None, options: SinkOptions, before: int, batch_id: int) -> int:
    """Issue 12 item 12: every partition of the batch stays prepared until its commit, so
    a server with fewer prepared-transaction slots than the batch's partitions can never
    commit it. This writer knows the count before writing (the data source does not):
    refuse before any slot is taken. Returns this DataFrame's partition count (0 when
    unknown: then the tasks' own check, SQLSTATE 53200, remains)."""
    from sqlsink.options import Semantic
    from sqlsink.spark.plan import database_of

    if count is None:
        return 0
    partitions = count
    if options.semantic is not Semantic.EXACTLY_ONCE:
        return partitions
    total = before + partitions
    if total <= _SLOTS_OK.get(options.url, 0):  # the slots only change with a restart
        return partitions
    exc = database_of(options).loading().slots_refusal(options, total)
    if exc is not None:
        if exc.context.get("value") == "0":
            raise exc  # disabled: no partition count helps, the sentence says what does
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

        from sqlsink.backends import open_database
        from sqlsink.spark.task import current_task

        task = current_task(sink_id, batch_id, run_id, query_id, part)
        loading = open_database(options.url).loading()
        outcome = loading.write_partition(options, target, task, batches)
        yield pa.RecordBatch.from_pydict(
            {"outcome": [pickle.dumps(outcome)]}, schema=pa.schema([("outcome", pa.binary())])
        )

    rows = df.mapInArrow(prepare, _OUTCOME_SCHEMA).collect()
    outcomes: list[PartitionOutcome | None] = [pickle.loads(r["outcome"]) for r in rows]
    return outcomes
