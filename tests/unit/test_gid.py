import pickle

import pytest

from sqlsink.core.gid import MAX_GID_BYTES, Gid, check_sink_id
from sqlsink.errors import (
    CommitError,
    ConfigError,
    DataLossError,
    SinkBindingError,
    SqlsinkError,
    TransientError,
    WriteError,
)

RUN = "53461c5d-463b-4b5b-8db0-bc2101650395"


def test_round_trip() -> None:
    gid = Gid("orders-1", 41, 3, RUN, 9001)
    assert str(gid) == f"sqlsink_orders-1_41_3_{RUN}_9001"
    assert Gid.parse(str(gid)) == gid


def test_longest_gid_fits_postgres_limit() -> None:
    gid = Gid("s" * 64, 2**63 - 1, 2**31 - 1, "r" * 64, 2**63 - 1)
    assert len(str(gid).encode()) <= MAX_GID_BYTES
    assert Gid.parse(str(gid)) == gid


@pytest.mark.parametrize(
    "foreign",
    [
        "",
        "sqlsink",
        "sqlsink_",
        "app_tx_42",
        "sqlsink_a_1_2_run",  # too few fields
        "sqlsink_a_1_2_run_3_4",  # too many
        "SQLSINK_a_1_2_run_3",  # prefix is case-sensitive
        "sqlsinkx_a_1_2_run_3",
        "sqlsink_a_01_2_run_3",  # leading zero: not what we write
        "sqlsink_a_-1_2_run_3",
        "sqlsink_a_1_2_run_3 ",
        "sqlsink_a b_1_2_run_3",
        "sqlsink_a;drop_1_2_run_3",
        "sqlsink__1_2_run_3",
        "sqlsink_a_1_2__3",
        "sqlsink_a_1_2_run_99999999999999999999",
        "sqlsink_é_1_2_run_3",
        "x" * 500,
    ],
)
def test_parse_never_raises_on_foreign(foreign: str) -> None:
    assert Gid.parse(foreign) is None


@pytest.mark.parametrize("bad", ["", "a_b", 'x"; DROP TABLE y; --', "é", "a" * 65, "-a"])
def test_sink_id_is_checked(bad: str) -> None:
    with pytest.raises(ConfigError, match="invalid sinkId"):
        check_sink_id(bad)


def test_sink_prefix() -> None:
    assert Gid.sink_prefix("orders") == "sqlsink_orders_"
    assert str(Gid("orders", 1, 2, RUN, 3)).startswith(Gid.sink_prefix("orders"))
    # a sink whose id extends another's does not share its prefix
    assert not str(Gid("orders-2", 1, 2, RUN, 3)).startswith(Gid.sink_prefix("orders"))


@pytest.mark.parametrize(
    "cls",
    [
        SqlsinkError,
        TransientError,
        ConfigError,
        SinkBindingError,
        DataLossError,
        WriteError,
        CommitError,
    ],
)
def test_errors_pickle(cls: type[SqlsinkError]) -> None:
    error = cls("batch 3, partition 1: something", batch=3, partition=1)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.context == {"batch": 3, "partition": 1}
    assert copy.transient == issubclass(cls, TransientError)


@pytest.mark.parametrize(
    "too_big",
    [
        "sqlsink_a_9223372036854775808_0_run_1",  # batch: 2^63, over bigint
        "sqlsink_a_9999999999999999999_0_run_1",
        "sqlsink_a_1_2147483648_run_1",  # partition: over integer
        "sqlsink_a_1_0_run_9223372036854775808",  # attempt
    ],
)
def test_numbers_beyond_the_commit_logs_columns_are_foreign(too_big: str) -> None:
    """Issue 12 item 14: a look-alike with a number over 2^63-1 broke every commit."""
    assert Gid.parse(too_big) is None


def test_the_largest_numbers_still_parse() -> None:
    assert Gid.parse(f"sqlsink_a_{2**63 - 1}_{2**31 - 1}_run_{2**63 - 1}") is not None
