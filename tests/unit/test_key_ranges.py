"""The key-order trap's rule (sqlsink/core/key_ranges.py), without Spark or a server."""

from __future__ import annotations

from sqlsink.core.key_ranges import MIN_ROWS, trap_warning, unordered
from sqlsink.core.model import KeyRange, PartitionOutcome


def outcome(partition: int, key_range: KeyRange | None) -> PartitionOutcome:
    rows = key_range.rows if key_range else 0
    return PartitionOutcome(
        "s", 0, partition, f"g{partition}", rows, False, "q", "r", 0.0, 1.0, key_range
    )


def test_a_partition_whose_key_goes_down_often_is_the_trap() -> None:
    found = unordered(
        [
            outcome(0, KeyRange("id", 0, 9_999, 5_000, 2_490)),  # random order: ~50% down
            outcome(1, KeyRange("id", 1, 9_998, 5_000, 2_510)),
            outcome(2, KeyRange("id", 10_000, 14_999, 5_000, 0)),  # sorted
        ]
    )
    assert found is not None
    column, partitions, share = found
    assert (column, partitions) == ("id", 2) and 0.50 < share < 0.51
    assert "2 partition(s) wrote their rows in random order of the key 'id' (50% of" in (
        trap_warning("s", 3, column, partitions, share)
    )


def test_sorted_partitions_small_ones_and_none_are_not() -> None:
    # interleaved ranges whose rows each come in key order cost what range-split ones do
    sorted_interleaved = [
        outcome(0, KeyRange("id", 0, 9_998, 5_000, 0)),
        outcome(1, KeyRange("id", 1, 9_999, 5_000, 3)),
    ]
    assert unordered(sorted_interleaved) is None
    small = [outcome(0, KeyRange("id", 0, 99, MIN_ROWS - 1, MIN_ROWS // 2))]
    assert unordered(small) is None
    assert unordered([None, outcome(1, None)]) is None
