"""The interleaved-key trap (README "Performance"): partitions that append interleaved
ranges of an increasing key.

Round-robin (``repartition(n)``) or hash partitions of a stream whose key increases
(an id, a timestamp) each hold keys from the whole of the batch's range, all above
the table's highest key. Every partition's session then inserts into the same
rightmost leaf page of the key's b-tree and they queue on its lock: PostgreSQL
inserts 2-3x slower than with one range per partition. Each partition reports the
range of the key it wrote and whether all of it lies above the table's highest key
when the batch was planned (``KeyRange``); the trap is two or more such ranges that
overlap. Keys inserted inside the table's range (random keys, an upsert of old keys)
spread over the index and are not the trap.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlsink.core.model import PartitionOutcome


def interleaved(outcomes: Sequence[PartitionOutcome | None]) -> tuple[str, int] | None:
    """(the key column, how many partitions overlap) when two or more partitions appended
    overlapping ranges above the table's keys; None otherwise (or when not comparable)."""
    given = [o.key_range for o in outcomes if o is not None and o.key_range is not None]
    edge = [r for r in given if r.above_table and r.low is not None and r.high is not None]
    if len(edge) < 2:
        return None
    overlapping = 0
    try:
        edge.sort(key=lambda r: r.low)
        highest = edge[0].high
        for current in edge[1:]:
            if current.low <= highest:
                overlapping += 1
            highest = max(highest, current.high)
    except TypeError:  # keys of types that do not compare: say nothing
        return None
    return (edge[0].column, overlapping + 1) if overlapping else None


def trap_warning(sink_id: str, batch_id: int, column: str, partitions: int) -> str:
    return (
        f"sqlsink {sink_id}: batch {batch_id}: {partitions} partitions appended interleaved "
        f"ranges of the key {column!r} above the table's highest key, so their inserts all go "
        "to the same index page and queue on its lock (PostgreSQL inserts 2-3x slower). "
        f"Fix: partition by range before the sink, df.repartitionByRange(n, {column!r}) "
        "instead of df.repartition(n) (the foreachBatch writer range-partitions by the key "
        "by default). Shown once per driver"
    )
