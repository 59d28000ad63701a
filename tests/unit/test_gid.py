import pytest

from sqlsink.core.gid import MAX_GID_BYTES, Gid, check_sink_id
from sqlsink.errors import ConfigError

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


def test_part_zero_keeps_the_original_form() -> None:
    gid = Gid("orders-1", 41, 3, RUN, 9001, part=0)
    assert str(gid) == f"sqlsink_orders-1_41_3_{RUN}_9001"
    assert gid == Gid("orders-1", 41, 3, RUN, 9001)


def test_part_round_trip() -> None:
    gid = Gid("orders-1", 41, 3, RUN, 9001, part=2)
    assert str(gid) == f"sqlsink_orders-1_41_3_{RUN}_9001_p2"
    assert Gid.parse(str(gid)) == gid
    assert Gid.parse(str(gid)) != Gid("orders-1", 41, 3, RUN, 9001)


def test_old_gids_still_parse() -> None:
    # a leftover written before parts existed: the six-field form, part 0
    parsed = Gid.parse(f"sqlsink_orders-1_41_3_{RUN}_9001")
    assert parsed is not None and parsed.part == 0 and parsed.partition_id == 3


def test_longest_gid_with_a_part_fits_postgres_limit() -> None:
    gid = Gid("s" * 64, 2**63 - 1, 2**31 - 1, "r" * 64, 2**63 - 1, part=999)
    assert len(str(gid).encode()) <= MAX_GID_BYTES
    assert Gid.parse(str(gid)) == gid


@pytest.mark.parametrize(
    "foreign",
    [
        "sqlsink_a_1_2_run_3_p0",
        "sqlsink_a_1_2_run_3_p01",
        "sqlsink_a_1_2_run_3_p1000",
        "sqlsink_a_1_2_run_3_p",
        "sqlsink_a_1_2_run_3_P1",
        "sqlsink_a_1_2_run_3_p1_p1",
        "sqlsink_a_1_2_run_3_p-1",
    ],
)
def test_part_look_alikes_are_foreign(foreign: str) -> None:
    assert Gid.parse(foreign) is None


@pytest.mark.parametrize("part", [-1, 1000])
def test_part_out_of_range(part: int) -> None:
    with pytest.raises(ConfigError, match="part"):
        Gid("a", 1, 2, "run", 3, part=part)


def test_resolution_treats_every_part_as_its_batch() -> None:
    """A two-part batch: the decision names part 0 and part 1 (same partition number);
    an undecided attempt of part 1 rolls back; a live run leaves all its parts in flight."""
    from datetime import datetime, timezone

    from sqlsink.core.model import Decision, PreparedTransaction
    from sqlsink.core.resolution import Action, Scope, plan_resolution

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    p0, p1 = str(Gid("s1", 5, 0, RUN, 10)), str(Gid("s1", 5, 0, RUN, 11, part=1))
    other = str(Gid("s1", 5, 0, RUN, 12, part=1))  # a late copy of part 1, not chosen
    prepared = [PreparedTransaction(g, "shop", "app", now) for g in (p0, p1, other)]
    decided = {("s1", 5): Decision("s1", 5, frozenset({p0, p1}), 10, now, False)}
    plan = plan_resolution(
        prepared, decided, database="shop", sink_id="s1", scope=Scope.everything()
    )
    assert {a.prepared.gid: a.action for a in plan.actions} == {
        p0: Action.COMMIT,
        p1: Action.COMMIT,
        other: Action.ROLLBACK,
    }
    in_flight = plan_resolution(
        prepared, {}, database="shop", sink_id="s1", scope=Scope.live(RUN, 5)
    )
    assert {a.action for a in in_flight.actions} == {Action.LEAVE}
