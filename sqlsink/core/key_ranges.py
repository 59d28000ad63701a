"""The key-order trap (docs/performance.md): partitions that hand PostgreSQL their rows
in random order of the table's key.

``repartition(n)`` (round robin after Spark's local sort by row hash) gives each
partition its rows in random key order, so each session inserts at random places of
the key's b-tree: PostgreSQL spends 2-3x the CPU of rows in key order on it, even from
one session (measured in ``benchmarks/trap.py``: 2.42 against 1.50 CPU-s per million
rows through Spark; interleaved sessions that each send sorted keys cost what
range-split ones do, so the order within a partition is what matters). Each partition
reports the range of the key's first column it wrote and how often the key went down
from one row to the next (``KeyRange``); the trap is a partition of some size whose key
goes down often. Sorting within each partition by the key removes it without a shuffle.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlsink.core.model import PartitionOutcome

MIN_ROWS = 1000  # smaller partitions cost little either way
UNORDERED = 0.1  # the share of steps that go down from which a partition is "in random order"


def unordered(outcomes: Sequence[PartitionOutcome | None]) -> tuple[str, int, float] | None:
    """(the key column, how many partitions, the largest share of steps down) when some
    partition of at least ``MIN_ROWS`` rows wrote its key out of order; None otherwise."""
    found = [
        (r.column, r.descents / (r.rows - 1))
        for o in outcomes
        if o is not None and (r := o.key_range) is not None and r.rows >= MIN_ROWS
        if r.descents / (r.rows - 1) >= UNORDERED
    ]
    if not found:
        return None
    return found[0][0], len(found), max(share for _, share in found)


def trap_warning(sink_id: str, batch_id: int, column: str, partitions: int, share: float) -> str:
    return (
        f"sqlsink {sink_id}: batch {batch_id}: {partitions} partition(s) wrote their rows in "
        f"random order of the key {column!r} ({share:.0%} of consecutive rows go down), so "
        "PostgreSQL inserts each at a random place of the key's index, which costs it 2-3x "
        "the CPU of rows in key order. Fix: df.sortWithinPartitions("
        f"{column!r}) before the sink (no shuffle), or df.repartitionByRange(n, {column!r}) "
        "(the foreachBatch writer sorts by the key by default). Shown once per driver"
    )
