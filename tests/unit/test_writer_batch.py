"""The foreachBatch writer's batch rules (sqlsink/core/writer_batch.py), as pure functions."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from sqlsink.core.model import Decision
from sqlsink.core.writer_batch import (
    FIX,
    HandedBatches,
    PartStart,
    check_skip_outside,
    fillable,
    gap_warning,
    judge_part,
)
from sqlsink.errors import ConfigError

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def decided(run: str | None, tables: tuple[str, ...] | None) -> Decision:
    return Decision("shop", 3, frozenset({"g"}), 5, NOW, True, "q", run, 0.0, tables)


ORDERS, LINES = "public.orders", "public.order_lines"


@pytest.mark.parametrize("table", [ORDERS, LINES, None])
def test_an_undecided_batch_is_written(table: str | None) -> None:
    assert judge_part("shop", 3, "run-a", table, None) is PartStart.WRITE


@pytest.mark.parametrize(
    ("tables", "table"),
    [
        ((ORDERS, LINES), ORDERS),
        ((ORDERS, LINES), LINES),
        (None, ORDERS),  # a decision before the log recorded tables: unknown
        (None, None),  # an empty batch replayed
        ((ORDERS,), None),  # the function now hands the replay empty: nothing to write
    ],
)
def test_a_new_runs_replay_of_a_decided_table_is_skipped(
    tables: tuple[str, ...] | None, table: str | None
) -> None:
    assert judge_part("shop", 3, "run-b", table, decided("run-a", tables)) is PartStart.REPLAY


@pytest.mark.parametrize("tables", [(ORDERS,), (ORDERS, LINES), None])
@pytest.mark.parametrize("table", [ORDERS, LINES, None])
def test_a_second_write_by_the_same_run_is_refused_whatever_its_table(
    tables: tuple[str, ...] | None, table: str | None
) -> None:
    with pytest.raises(ConfigError) as refused:
        judge_part("shop", 3, "run-a", table, decided("run-a", tables))
    text = str(refused.value)
    assert text.startswith("sink 'shop': batch 3 was already decided by this very run")
    assert text.endswith(f"Fix: {FIX}")
    if tables:
        assert all(repr(t) in text for t in tables)
    if table is not None:
        assert f"Nothing of {table!r} was written for batch 3" in text


def test_a_table_the_decision_lacks_is_refused_in_a_new_run_too() -> None:
    with pytest.raises(ConfigError) as refused:
        judge_part("shop", 3, "run-b", LINES, decided("run-a", (ORDERS,)))
    assert str(refused.value) == (
        "sink 'shop': batch 3 was decided by an earlier run with 'public.orders', without "
        "'public.order_lines': this replay would skip 'public.order_lines', whose rows were "
        "never written for it. The decision of batch 3 is final: to go on, hand batch 3 to "
        "the writer without 'public.order_lines' (that batch only: later batches write it as "
        "usual) and load batch 3's rows of 'public.order_lines' yourself, or accept that they "
        "are missing. Nothing of 'public.order_lines' was written for batch 3. "
        f"Fix: {FIX}"
    )
    assert refused.value.context["decided"] == [ORDERS]


def test_handed_batches_report_the_batches_a_run_skipped() -> None:
    handed = HandedBatches()
    assert handed.hand("shop", "run-a", 4) == range(0)  # the run's first: nothing known
    assert handed.hand("shop", "run-a", 5) == range(0)
    assert handed.hand("shop", "run-a", 8) == range(6, 8)
    assert handed.hand("shop", "run-a", 8) == range(0)  # a second hand-over: no gap
    assert handed.hand("shop", "run-a", 2) == range(0)  # behind: the forward check's
    assert handed.last("shop", "run-a") == 8
    assert handed.hand("shop", "run-b", 10) == range(0)  # another run: its own
    assert handed.hand("other", "run-a", 10) == range(0)  # another sink: its own
    assert handed.hand("shop", "run-a", 10) == range(9, 10)


def test_handed_batches_forget_the_oldest_run_first() -> None:
    handed = HandedBatches(keep=2)
    handed.hand("s", "r1", 0)
    handed.hand("s", "r2", 0)
    handed.hand("s", "r1", 1)  # r1 is now the newest
    handed.hand("s", "r3", 0)
    assert handed.last("s", "r2") is None
    assert handed.last("s", "r1") == 1 and handed.last("s", "r3") == 0


def test_fillable_is_the_part_of_a_gap_above_the_highest_decided() -> None:
    assert fillable(range(6, 8), None) == range(6, 8)
    assert fillable(range(6, 8), 5) == range(6, 8)
    assert fillable(range(6, 8), 6) == range(7, 8)
    assert fillable(range(6, 8), 9) == range(10, 10)


def test_the_gap_warning_names_the_batches_and_the_fix() -> None:
    text = gap_warning("shop", "run-a", range(6, 8), range(6, 8), 8)
    assert text == (
        "sqlsink: sink 'shop': run run-a handed batch 8 to the writer, but not batches 6..7: Spark "
        "ran them and recorded them as committed without the foreachBatch function calling "
        "the writer, so decided batches 6..7 as empty (nothing written for them), before "
        "batch 8. Fix: hand every batch to the writer, writer.batch(batch_id) or "
        "writer.skip(batch_id) (a skipped last batch before a stop is seen by nobody, and "
        "the restart stops on it)"
    )


def test_a_same_run_refusal_of_a_decided_table_also_names_a_retry_of_a_committed_write() -> None:
    """Found by the review of this change: a user's retry loop around a write whose commit
    decided the batch and raised afterwards got only "two to() calls, two blocks"."""
    with pytest.raises(ConfigError) as refused:
        judge_part("shop", 3, "run-a", ORDERS, decided("run-a", (ORDERS,)))
    assert (
        "; or the function retries a write of 'public.orders' whose commit decided the batch "
        "and raised afterwards: then its rows are committed, and batch 3 must not be handed "
        "to the writer again. Nothing of 'public.orders' was written for batch 3"
    ) in str(refused.value)
    with pytest.raises(ConfigError) as other:
        judge_part("shop", 3, "run-a", LINES, decided("run-a", (ORDERS,)))
    assert "retries" not in str(other.value)


@pytest.mark.parametrize(
    "decision",
    [None, decided("run-a", (ORDERS,)), decided("run-a", None)],
    ids=["undecided (a block still open)", "decided by an earlier run", "tables unknown"],
)
def test_a_second_hand_over_by_the_same_run_is_refused_whatever_the_decision(
    decision: Decision | None,
) -> None:
    """Found by the writer's state machine: a new run replays batch 3, whose decision
    names orders; its first write of orders is a replay, and its second write of orders
    (rows the first run never wrote: its own second write had been refused) was skipped
    too, silently. And a writer call inside an open block of the same batch took the
    block's transaction for its own. A run's second hand-over of a batch is refused."""
    assert judge_part("shop", 3, "run-b", ORDERS, decision) in (
        PartStart.WRITE,
        PartStart.REPLAY,
    )
    with pytest.raises(ConfigError) as refused:
        judge_part("shop", 3, "run-b", ORDERS, decision, handed_before=True)
    assert str(refused.value) == (
        "sink 'shop': batch 3 was already handed to the writer by this very run in this "
        "process (two to() calls, two `with writer.batch(batch_id)` blocks, two writers with "
        "one sink_id, or a writer call inside an open block): this second hand-over, of "
        "table 'public.orders', would be skipped as a replay or taken for the first one's "
        f"transactions. Nothing of it was written for batch 3. Fix: {FIX}"
    )


def test_handed_batches_knows_a_batch_handed_before_by_the_same_run_only() -> None:
    handed = HandedBatches()
    assert not handed.handed("shop", "run-a", 3)
    handed.hand("shop", "run-a", 3)
    assert handed.handed("shop", "run-a", 3)
    assert handed.handed("shop", "run-a", 2)
    assert not handed.handed("shop", "run-a", 4)
    assert not handed.handed("shop", "run-b", 3)
    assert not handed.handed("other", "run-a", 3)


def test_a_new_runs_write_of_a_table_into_a_batch_decided_empty_is_refused() -> None:
    """Found by the writer's state machine: an empty decision's tables read as NULL, which
    counted as unknown, so a new run's write of any table was a replay: its rows skipped,
    silently. A decision without a transaction wrote no table."""
    empty = Decision("shop", 3, frozenset(), 0, NOW, True, "q", "run-a", tables=None)
    assert judge_part("shop", 3, "run-b", None, empty) is PartStart.REPLAY
    with pytest.raises(ConfigError, match="decided by an earlier run with no table"):
        judge_part("shop", 3, "run-b", ORDERS, empty)
    legacy = Decision("shop", 3, frozenset({"g"}), 5, NOW, True, "q", "run-a", tables=None)
    assert judge_part("shop", 3, "run-b", ORDERS, legacy) is PartStart.REPLAY


def test_a_skip_outside_passes_over_later_committed_batches_with_nothing_prepared() -> None:
    commits = frozenset({0, 1, 2, 3, 4})
    prepared = {3: ["sqlsink_shop_3_0_r_1"]}
    assert check_skip_outside("shop", 1, "/chk", commits, prepared) == frozenset({2, 4})
    with pytest.raises(ConfigError, match="batch 3 has prepared transactions"):
        check_skip_outside("shop", 3, "/chk", commits, prepared)


def test_the_process_run_id_is_one_per_sink_and_query_and_renewed_once() -> None:
    from sqlsink.spark.identity import ProcessRuns

    runs = ProcessRuns()
    first = runs.get("shop", "q")
    assert runs.get("shop", "q") == first
    assert runs.get("shop", "q2") != first and runs.get("other", "q") != first
    runs.renew("shop", "q", first)
    second = runs.get("shop", "q")
    assert second != first
    runs.renew("shop", "q", first)  # another thread's renewal of the same run: done
    assert runs.get("shop", "q") == second


@pytest.mark.parametrize(
    ("group", "running", "refused"),
    [
        ("3f2a5c1e-9b7d-4e2f-8a6c-1d2e3f4a5b6c", None, False),
        ("3f2a5c1e-9b7d-4e2f-8a6c-1d2e3f4a5b6c", "3f2a5c1e-9b7d-4e2f-8a6c-1d2e3f4a5b6c", False),
        ("3f2a5c1e-9b7d-4e2f-8a6c-1d2e3f4a5b6c", "0a2a5c1e-9b7d-4e2f-8a6c-1d2e3f4a5b6c", True),
        ("nightly", None, True),
        ("nightly", "0a2a5c1e-9b7d-4e2f-8a6c-1d2e3f4a5b6c", True),
    ],
)
def test_a_job_group_that_is_not_the_run_id_is_refused(
    group: str, running: str | None, refused: bool
) -> None:
    from sqlsink.spark.identity import check_job_group

    if not refused:
        check_job_group("shop", 4, group, running)
        return
    with pytest.raises(ConfigError) as error:
        check_job_group("shop", 4, group, running)
    assert str(error.value).startswith(
        f"sink 'shop': Spark's job group on this foreachBatch thread is {group!r}, "
    )
    assert "Nothing was written for batch 4. Fix: don't call setJobGroup" in str(error.value)


def test_handed_batches_keep_a_runs_failed_batches_until_decided_and_carry_them() -> None:
    handed = HandedBatches()
    handed.hand("s", "r1", 0)
    handed.fail("s", "r1", 0)
    assert handed.failed_before("s", "r1", 0) == []  # a retry of the batch itself
    assert handed.failed_before("s", "r1", 1) == [0]
    assert handed.failed_before("s", "r2", 1) == []  # a new run (a restart): not its own
    handed.carry("s", "r1", "r1b")  # the process renewed its run after the abort
    assert handed.failed_before("s", "r1b", 1) == [0]
    assert not handed.handed("s", "r1b", 0)  # a retry of batch 0 is its first hand-over
    handed.settle("s", "r1b", 0)  # the retry decided it
    assert handed.failed_before("s", "r1b", 1) == []
    assert handed.failed_before("s", "r1", 1) == [0]


def test_the_swallowed_errors_name_the_batch_and_the_way_out() -> None:
    from sqlsink.core.writer_batch import swallowed_error, swallowed_loss_error

    lost = str(swallowed_loss_error("s", [0], 1))
    assert lost.startswith("data loss: sink 's': this run's write of batch 0 failed")
    assert "The rows of batch 0 were not written" in lost
    assert "sqlsink recover --sink-id s --mark-skipped 0 --checkpoint DIR" in lost
    more = str(swallowed_loss_error("s", [0, 1, 2], 3))
    assert "(so did this run's writes of batches 1, 2 after it" in more
    text = str(swallowed_error("s", 1, RuntimeError("boom\nmore")))
    assert text.startswith(
        "sink 's': the foreachBatch function returned normally although the writer's "
        "write of batch 1 failed (RuntimeError: boom): the error was caught in the function"
    )
