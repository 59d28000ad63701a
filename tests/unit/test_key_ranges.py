"""The interleaved-key trap's rule (sqlsink/core/key_ranges.py), without Spark or a server."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlsink.core.key_ranges import interleaved
from sqlsink.core.model import KeyRange, PartitionOutcome


def outcome(partition: int, key_range: KeyRange | None) -> PartitionOutcome:
    return PartitionOutcome(
        "s", 0, partition, f"g{partition}", 10, False, "q", "r", 0.0, 1.0, key_range
    )


def test_overlapping_ranges_above_the_table_are_the_trap() -> None:
    found = interleaved(
        [
            outcome(0, KeyRange("id", 100, 199, True)),
            outcome(1, KeyRange("id", 101, 198, True)),
            outcome(2, KeyRange("id", 102, 200, True)),
        ]
    )
    assert found == ("id", 3)


def test_disjoint_ranges_one_partition_or_keys_inside_the_table_are_not() -> None:
    assert (
        interleaved(
            [outcome(0, KeyRange("id", 0, 99, True)), outcome(1, KeyRange("id", 100, 199, True))]
        )
        is None
    )
    assert interleaved([outcome(0, KeyRange("id", 0, 99, True)), None, outcome(2, None)]) is None
    inside = [outcome(0, KeyRange("id", 0, 99, False)), outcome(1, KeyRange("id", 5, 90, False))]
    assert interleaved(inside) is None  # random keys spread over the index


def test_timestamps_compare_and_mixed_types_say_nothing() -> None:
    t = [datetime(2026, 1, 1, 0, 0, s, tzinfo=timezone.utc) for s in range(4)]
    assert interleaved(
        [outcome(0, KeyRange("ts", t[0], t[2], True)), outcome(1, KeyRange("ts", t[1], t[3], True))]
    ) == ("ts", 2)
    assert (
        interleaved(
            [outcome(0, KeyRange("k", 1, 5, True)), outcome(1, KeyRange("k", "a", "z", True))]
        )
        is None
    )
