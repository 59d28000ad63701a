"""Every error pickles (Spark ships a task's error from the executor to the driver)
with its type, message and context, including the errors the core builds."""

from __future__ import annotations

import pickle

import pytest

from sqlsink import errors
from sqlsink.core.admission import binding_error, checkpoint_error, fenced_error
from sqlsink.core.model import Binding
from sqlsink.core.resolver import data_loss_error
from sqlsink.errors import (
    CheckpointError,
    CommitError,
    ConfigError,
    DataLossError,
    FencedError,
    SinkBindingError,
    SqlsinkError,
    TransientError,
    WriteError,
)

ALL = [
    SqlsinkError,
    TransientError,
    ConfigError,
    SinkBindingError,
    DataLossError,
    WriteError,
    CommitError,
    CheckpointError,
    FencedError,
]

GID = "sqlsink_orders_3_1_run-1_301"


def test_the_list_holds_every_error_of_the_tree() -> None:
    tree = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, SqlsinkError)
    }
    assert tree == set(ALL)


@pytest.mark.parametrize("cls", ALL)
def test_errors_pickle(cls: type[SqlsinkError]) -> None:
    error = cls("batch 3, partition 1: something", batch=3, partition=1)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.context == {"batch": 3, "partition": 1}
    assert copy.transient == issubclass(cls, TransientError)


@pytest.mark.parametrize(
    "error",
    [
        fenced_error("orders", "run-1", "run-2"),
        fenced_error("orders", "run-1", "operator"),
        fenced_error("orders", "run-1", "run-2", load=True),
        binding_error("orders", Binding.of("q1"), Binding("load")),
        checkpoint_error("orders", 3, 7),
        data_loss_error([(3, GID), (3, "not-a-gid")]),
        data_loss_error([(b, f"{GID}{b}") for b in range(25)]),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_errors_the_core_builds_pickle_with_their_context(error: SqlsinkError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.message == error.message and str(copy) == str(error)
    assert copy.context == error.context and copy.context
    assert copy.args == error.args
    raised = pickle.loads(pickle.dumps(copy))  # and again: what a retry ships back
    assert raised.context == error.context


def test_data_loss_names_each_batch_and_partition_and_caps_the_list() -> None:
    error = data_loss_error([(3, GID), (3, "not-a-gid")])
    assert f"batch 3 partition 1 ({GID})" in error.message
    assert "batch 3 partition ? (not-a-gid)" in error.message
    assert error.context == {"lost": [(3, GID), (3, "not-a-gid")]}
    many = data_loss_error([(b, f"{GID}{b}") for b in range(25)])
    assert "and 5 more" in many.message and f"{GID}19" in many.message
    assert f"{GID}20" not in many.message
    assert len(pickle.loads(pickle.dumps(many)).context["lost"]) == 25


def test_fencing_names_the_fencer() -> None:
    assert "superseded by run run-2" in fenced_error("orders", "run-1", "run-2").message
    by_hand = fenced_error("orders", "run-1", "operator")
    assert "an operator (sqlsink recover --force)" in by_hand.message
    assert by_hand.context == {"sink_id": "orders", "run": "run-1", "fenced_by": "operator"}


def test_a_fenced_load_is_told_of_the_operator_not_of_another_load() -> None:
    """A named batch load's run ended by recover --force: no checkpoint, no query, and
    no other load to name."""
    assert fenced_error("orders", "run-1", "operator", load=True).message == (
        "sink 'orders': run run-1 was superseded by an operator (sqlsink recover --force): "
        "an operator ended this load's run, so this load stops. Nothing of this load was "
        "written: it decides nothing, and its prepared parts are rolled back (by sqlsink "
        "recover --sink-id orders). Fix: run the load again under the same sinkId (it "
        "writes its rows once)"
    )
