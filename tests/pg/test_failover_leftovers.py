"""A failover that lost batch K's decision but kept K's prepared transactions (docs/DESIGN.md
invariant 9, section 3.4): the last copy of K's rows is never rolled back by the next
run's tasks, its commit's sweep or ``sqlsink recover``; the commit reports it, naming the
transactions and the command that commits them, and that command makes the batch whole.

The state is what the promoted standby holds after an asynchronous failover: K's PREPAREs
arrived, K's decision did not, and Spark's checkpoint has ``commits/K`` (the old primary
had decided and committed K). Spark restarts at K+1. No Spark: the tasks and commits are
the sink's own code (tests/pg/protocol.py), the checkpoint is written by hand.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from sqlsink.checkpoint.parse import checkpoint_policy
from sqlsink.core.checkpoint_check import CheckpointMode, CheckpointPolicy
from sqlsink.core.gid import Gid
from sqlsink.core.model import PartitionOutcome, ResolutionReport
from sqlsink.errors import DataLossError
from tests.pg.protocol import Writer, ids_of, prepare_by_hand, prepared_of
from tests.pg.test_checkpoint_check import (
    QUERY,
    checked,
    checks,
    decided,
    make_checkpoint,
    new_run,
)
from tests.pg.test_cli import Result, sqlsink
from tests.pg.test_recover_runs import driver_gone

WARN = CheckpointMode.WARN
BATCH_ROWS = {0: range(0, 3), 1: range(10, 13), 2: range(20, 26), 3: range(30, 33)}


def commit_checked(
    writer: Writer, batch: int, outcomes: list[PartitionOutcome | None], policy: CheckpointPolicy
) -> ResolutionReport:
    """The stream's commit() with its checkpoint check; on failure Spark's abort()."""
    try:
        with checked(writer, policy) as committer:
            return committer.commit_batch(batch, outcomes, query_id=QUERY, run_id=writer.run)
    except Exception:
        writer.abort(batch, outcomes)
        raise


def commit_unchecked(
    writer: Writer, batch: int, outcomes: list[PartitionOutcome | None]
) -> ResolutionReport:
    """A commit without any checkpoint check (a foreachBatch writer that does not know the
    checkpoint); on failure the abort."""
    try:
        return writer.commit(batch, outcomes)
    except Exception:
        writer.abort(batch, outcomes)
        raise


def lost_batch_2(
    pg_url: str, table: str, sink: str, chk: Path
) -> tuple[Writer, CheckpointPolicy, list[str]]:
    """Batches 0 and 1 committed; batch 2 prepared in two partitions by the same run, its
    decision lost; Spark's checkpoint has commits/0..2 and offsets/0..3."""
    make_checkpoint(chk, range(4), range(3))
    policy = checkpoint_policy(str(chk), WARN)
    old = Writer(pg_url, table, sink, QUERY)
    for batch in (0, 1):
        commit_checked(old, batch, [old.write(batch, BATCH_ROWS[batch])], policy)
    first, second = old.write(2, range(20, 23), 0), old.write(2, range(23, 26), 1)
    gids = sorted(str(o.gid) for o in (first, second))
    assert prepared_of(pg_url, sink) == gids and decided(pg_url, sink) == [0, 1]
    return old, policy, gids


def run_dead(pg_url: str, sink: str, run: str) -> None:
    """The run's heartbeat is older than its timeout (what time does to a stopped query)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE sqlsink.runs SET heartbeat_at = clock_timestamp() - interval '1 hour' "
            "WHERE sink_id = %s AND run_id = %s",
            (sink, run),
        )


def recover(pg_url: str, sink: str, *args: str) -> Result:
    return sqlsink("recover", "--url", pg_url, "--sink-id", sink, *args, "--json")


def assert_whole(pg_url: str, table: str, sink: str, through: int) -> None:
    """Every batch up to ``through`` in the table exactly once, nothing left prepared."""
    expected = [i for b in range(through + 1) for i in BATCH_ROWS[b]]
    assert ids_of(pg_url, table) == expected
    assert prepared_of(pg_url, sink) == []
    assert decided(pg_url, sink) == list(range(through + 1))


@pytest.mark.parametrize("same_run", [False, True], ids=["restarted", "same-run"])
def test_a_lost_decisions_transactions_stay_prepared_until_commit_lost_commits_them(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, same_run: bool
) -> None:
    """restarted: Spark restarts at batch 3 in a new run. same-run: the failover happened
    between two batches of one run, which goes on with batch 3."""
    chk = tmp_path / "chk"
    old, policy, lost = lost_batch_2(pg_url, keyed, sink, chk)
    writer = old if same_run else new_run(old)

    task = writer.write(3, BATCH_ROWS[3])  # the first task of batch 3 resolves leftovers
    assert set(lost) <= set(prepared_of(pg_url, sink)), "the task rolled back batch 2"
    with pytest.raises(DataLossError) as raised:
        commit_checked(writer, 3, [task], policy)
    message = str(raised.value)
    assert message.startswith(
        f"data loss: sink {sink!r}: batch 2 has no decision in the commit log, but its 2 "
        f"transactions are still prepared ({lost[0]}, {lost[1]}) while Spark runs batch 3"
    ), message
    assert "so the decision of batch 2 was certainly lost" in message
    assert f"run sqlsink recover --sink-id {sink} --commit-lost 2" in message
    assert "Batch 3 is not decided: its transactions are rolled back" in message
    assert raised.value.context["lost"] == [2]
    assert raised.value.context["prepared"] == {2: lost}
    # Spark's abort of batch 3 rolled back batch 3 only
    assert prepared_of(pg_url, sink) == lost
    assert checks(pg_url, sink)[0].verdict == "loss"
    assert checks(pg_url, sink)[0].lost == (2,)

    # the operator's command, as the error gives it
    done = recover(pg_url, sink, "--commit-lost", "2")
    assert done.code == 0, done.out + done.err
    assert done.json["commit_lost"] == [2]
    [doc] = done.json["sinks"]
    assert doc["decided_batches"] == [2] and doc["committed"] == 2
    assert doc["completed_batches"] == [2]
    assert {a["gid"]: a["result"] for a in done.json["actions"]} == {g: "committed" for g in lost}
    assert_whole(pg_url, keyed, sink, 2)

    # the restarted query re-runs batch 3; its check passes
    again = new_run(old)
    commit_checked(again, 3, [again.write(3, BATCH_ROWS[3])], policy)
    assert_whole(pg_url, keyed, sink, 3)
    assert checks(pg_url, sink)[0].verdict == "verified"


def test_recover_with_the_checkpoint_relates_first_and_leaves_the_lost_batch(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The operator runs recover --checkpoint before restarting the query, once the old
    run is dead: batch 2 (commits/2, no decision) is left prepared and named."""
    chk = tmp_path / "chk"
    old, policy, lost = lost_batch_2(pg_url, keyed, sink, chk)
    run_dead(pg_url, sink, old.run)

    looked = recover(pg_url, sink, "--checkpoint", str(chk))
    assert prepared_of(pg_url, sink) == lost, "recover --checkpoint rolled back batch 2"
    assert looked.code == 1, looked.out + looked.err
    reasons = {a["gid"]: (a["action"], a["reason"]) for a in looked.json["actions"]}
    for gid in lost:
        action, reason = reasons[gid]
        assert action == "leave"
        assert reason.startswith("batch 2 has no decision, but Spark committed it"), reason
        assert f"sqlsink recover --sink-id {sink} --commit-lost 2 commits them" in reason
    [doc] = looked.json["sinks"]
    assert doc["lost_decision_batches"] == [2] and doc["decided_batches"] == []
    [warning] = [w for w in looked.json["warnings"] if "--commit-lost" in (w["fix"] or "")]
    assert warning["message"].startswith(
        "batch 2 has no decision, but its 2 transaction(s) are still prepared"
    )
    assert f"sqlsink recover --sink-id {sink} --commit-lost 2" in warning["fix"]
    [batch2] = [b for b in looked.json["checkpoint"]["batches"] if b["batch_id"] == 2]
    assert batch2["state"] == "no_decision"
    assert "2 prepared transaction(s) of it hold its rows" in batch2["message"]
    human = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--checkpoint", str(chk))
    assert "--commit-lost 2" in human.out and prepared_of(pg_url, sink) == lost

    done = recover(pg_url, sink, "--checkpoint", str(chk), "--commit-lost", "2")
    assert done.code == 0, done.out + done.err
    assert_whole(pg_url, keyed, sink, 2)
    [batch2] = [b for b in done.json["checkpoint"]["batches"] if b["batch_id"] == 2]
    assert batch2["state"] == "consistent"

    restarted = new_run(old)
    commit_checked(restarted, 3, [restarted.write(3, BATCH_ROWS[3])], policy)
    assert_whole(pg_url, keyed, sink, 3)


@pytest.mark.parametrize("check", ["none", "unreadable"])
def test_without_a_readable_checkpoint_the_commit_itself_reports_the_lost_batch(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, check: str
) -> None:
    """No checkpoint check (a foreachBatch writer without the checkpoint), or one that
    cannot read it: the prepared leftovers below the running batch prove the loss."""
    old, _, lost = lost_batch_2(pg_url, keyed, sink, tmp_path / "chk")
    restarted = new_run(old)
    task = restarted.write(3, BATCH_ROWS[3])
    assert set(lost) <= set(prepared_of(pg_url, sink))
    with pytest.raises(DataLossError) as raised:
        if check == "none":
            commit_unchecked(restarted, 3, [task])
        else:
            commit_checked(restarted, 3, [task], checkpoint_policy(None, WARN))
    message = str(raised.value)
    assert f"({lost[0]}, {lost[1]}) while Spark runs batch 3" in message
    assert f"sqlsink recover --sink-id {sink} --commit-lost 2" in message
    assert prepared_of(pg_url, sink) == lost

    # no checkpoint to check against: the commit log's own evidence (a later batch was
    # aborted because of batch 2) lets the command act
    done = recover(pg_url, sink, "--commit-lost", "2")
    assert done.code == 0, done.out + done.err
    assert_whole(pg_url, keyed, sink, 2)
    again = new_run(old)
    commit_unchecked(again, 3, [again.write(3, BATCH_ROWS[3])])
    assert_whole(pg_url, keyed, sink, 3)


def test_commit_lost_refuses_what_it_cannot_prove(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    old, _, lost = lost_batch_2(pg_url, keyed, sink, chk)
    run_dead(pg_url, sink, old.run)

    # nothing shows yet that Spark went past batch 2 (no checkpoint given, the one the query
    # recorded not readable here, no later batch checked or aborted): it may be the batch
    # Spark re-runs
    chk.rename(tmp_path / "elsewhere")
    unproven = recover(pg_url, sink, "--commit-lost", "2")
    (tmp_path / "elsewhere").rename(chk)
    assert unproven.code == 2, unproven.out + unproven.err
    assert unproven.json["error"]["message"].startswith(
        f"sink {sink}: nothing shows that Spark committed batch 2"
    )
    assert "--checkpoint" in unproven.json["error"]["fix"]
    # a checkpoint that does not record it
    other = tmp_path / "chk-behind"
    make_checkpoint(other, range(3), range(2))
    behind = recover(pg_url, sink, "--checkpoint", str(other), "--commit-lost", "2")
    assert behind.code == 2, behind.out + behind.err
    assert "does not record batch 2 as committed (no commits/2)" in behind.json["error"]["message"]
    # a batch that is decided, or below the highest decided one
    decided_one = recover(pg_url, sink, "--checkpoint", str(chk), "--commit-lost", "1")
    assert decided_one.code == 2
    assert "batch 1 is decided already" in decided_one.json["error"]["message"]
    # a batch without prepared transactions: --commit-lost has nothing to commit
    nothing = recover(pg_url, sink, "--checkpoint", str(chk), "--commit-lost", "3")
    assert nothing.code == 2
    assert "batch 3 has no prepared transaction" in nothing.json["error"]["message"]
    # two attempts of one partition: which one Spark took is not known here
    twin = Gid(sink, 2, 0, uuid.uuid4().hex, 9)
    extra = prepare_by_hand(pg_url, keyed, twin, range(100, 103))
    ambiguous = recover(pg_url, sink, "--checkpoint", str(chk), "--commit-lost", "2")
    assert ambiguous.code == 2
    message = ambiguous.json["error"]["message"]
    assert "not one attempt per partition" in message and extra in message
    assert prepared_of(pg_url, sink) == sorted([*lost, extra])  # nothing was done
    assert decided(pg_url, sink) == [0, 1]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the operator's choice
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(extra)))
    done = recover(pg_url, sink, "--checkpoint", str(chk), "--commit-lost", "2")
    assert done.code == 0, done.out + done.err
    assert_whole(pg_url, keyed, sink, 2)


def test_a_dry_run_of_commit_lost_changes_nothing(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    chk = tmp_path / "chk"
    old, _, lost = lost_batch_2(pg_url, keyed, sink, chk)
    run_dead(pg_url, sink, old.run)
    planned = recover(pg_url, sink, "--checkpoint", str(chk), "--commit-lost", "2", "--dry-run")
    assert planned.code == 1, planned.out + planned.err
    assert planned.json["sinks"][0]["decided_batches"] == []
    assert any(
        "would decide batch 2 with its 2 prepared transaction(s)" in w["message"]
        for w in planned.json["warnings"]
    )
    assert prepared_of(pg_url, sink) == lost and decided(pg_url, sink) == [0, 1]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the test's own clean-up
        for gid in lost:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def test_the_old_rule_still_rolls_back_what_nobody_can_decide(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A crash before the decision (no commits/2): Spark re-runs batch 2 in a new run,
    whose first task rolls back the old run's batch 2, as before."""
    old = Writer(pg_url, keyed, sink, QUERY)
    make_checkpoint(tmp_path / "chk", range(3), range(2))
    policy = checkpoint_policy(str(tmp_path / "chk"), WARN)
    for batch in (0, 1):
        commit_checked(old, batch, [old.write(batch, BATCH_ROWS[batch])], policy)
    stale = str(old.write(2, range(200, 203)).gid)
    rerun = replace(old, run=uuid.uuid4().hex)
    task = rerun.write(2, range(20, 26))
    assert stale not in prepared_of(pg_url, sink)
    commit_checked(rerun, 2, [task], policy)
    assert_whole(pg_url, keyed, sink, 2)


def test_re_running_the_lost_batch_from_a_rewound_checkpoint_is_the_other_way_out(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The error's other advice: when the source still holds batch 2, rewind the checkpoint
    to it; the re-run's first task rolls the old transactions of batch 2 back."""
    chk = tmp_path / "chk"
    old, policy, lost = lost_batch_2(pg_url, keyed, sink, chk)
    restarted = new_run(old)
    with pytest.raises(DataLossError, match="re-running the batch from Spark's checkpoint"):
        commit_checked(restarted, 3, [restarted.write(3, BATCH_ROWS[3])], policy)
    for name in ("commits/2", "commits/.2.crc", "offsets/3", "offsets/.3.crc"):
        (chk / name).unlink(missing_ok=True)
    rerun = new_run(old)
    task = rerun.write(2, BATCH_ROWS[2])
    assert not set(lost) & set(prepared_of(pg_url, sink))
    commit_checked(rerun, 2, [task], policy)
    (chk / "commits" / "2").write_text('v1\n{"nextBatchWatermarkMs":0}')
    commit_checked(rerun, 3, [rerun.write(3, BATCH_ROWS[3])], policy)
    assert_whole(pg_url, keyed, sink, 3)
    assert checks(pg_url, sink)[0].verdict == "verified"


# -- plain recover (no --checkpoint) between the failover and the query's next commit --------


def test_plain_recover_reads_the_recorded_checkpoint_and_keeps_the_lost_batch(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """Nothing in the commit log shows yet that Spark went past batch 2; the checkpoint the
    query's runs recorded does (commits/2): plain recover reads it before it resolves."""
    chk = tmp_path / "chk"
    old, policy, lost = lost_batch_2(pg_url, keyed, sink, chk)
    driver_gone(pg_url, sink, "1 hour")

    looked = recover(pg_url, sink)
    assert prepared_of(pg_url, sink) == lost, "plain recover rolled back batch 2's last copy"
    assert looked.code == 1, looked.out + looked.err
    [doc] = looked.json["sinks"]
    assert doc["lost_decision_batches"] == [2]
    assert doc["checkpoint_read"] == str(chk)
    assert doc["undecided_kept_batches"] == []
    for action in looked.json["actions"]:
        assert action["action"] == "leave"
        assert action["reason"].startswith("batch 2 has no decision, but Spark committed it")
    [warning] = [w for w in looked.json["warnings"] if "--commit-lost" in (w["fix"] or "")]
    assert "Spark's checkpoint records it as committed (commits/2)" in warning["message"]
    assert f"the checkpoint this sink's query recorded ({chk})" in warning["message"]

    done = recover(pg_url, sink, "--commit-lost", "2")
    assert done.code == 0, done.out + done.err
    assert_whole(pg_url, keyed, sink, 2)
    restarted = new_run(old)
    commit_checked(restarted, 3, [restarted.write(3, BATCH_ROWS[3])], policy)
    assert_whole(pg_url, keyed, sink, 3)


def test_plain_recover_without_a_readable_checkpoint_keeps_undecided_leftovers(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The recorded checkpoint cannot be read from here: batch 2, above the highest decided
    batch of a streaming sink, may be a batch Spark committed; it is kept, with the ways
    out, until the operator says it is not (--rollback-undecided 2)."""
    chk = tmp_path / "chk"
    _, _, lost = lost_batch_2(pg_url, keyed, sink, chk)
    driver_gone(pg_url, sink, "1 hour")
    away = tmp_path / "elsewhere"
    chk.rename(away)

    looked = recover(pg_url, sink)
    assert prepared_of(pg_url, sink) == lost, "plain recover rolled back batch 2's last copy"
    assert looked.code == 1, looked.out + looked.err
    [doc] = looked.json["sinks"]
    assert doc["undecided_kept_batches"] == [2] and doc["lost_decision_batches"] == []
    assert doc["checkpoint_read"] is None
    for action in looked.json["actions"]:
        assert action["action"] == "leave"
        assert action["reason"] == (
            "batch 2 has no decision and is above the highest decided batch (1) of a "
            "streaming sink, and no checkpoint of its query was read: Spark may have "
            "committed it (a failover that lost its decision), so these transactions may "
            "hold its only copy"
        )
    [warning] = [w for w in looked.json["warnings"] if "--rollback-undecided" in (w["fix"] or "")]
    assert warning["message"] == (
        f"batch 2 has no decision, but its 2 transaction(s) are still prepared ({lost[0]}, "
        f"{lost[1]}) above the highest decided batch (1): nothing read here shows whether "
        "Spark committed it (the checkpoint this sink's query recorded, "
        f"{chk}, cannot be read: checkpoint {str(chk)!r} is not a directory (or is not "
        "readable)), "
        "so they may hold the only copy of its rows and were left prepared"
    ), warning["message"]
    assert warning["fix"] == (
        f"pass the query's checkpoint: sqlsink recover --sink-id {sink} --checkpoint DIR; or "
        "restart the query (its first task rolls them back if Spark runs batch 2 again, "
        "else its commit reports the loss); or, if Spark's checkpoint has no commits/2, roll "
        "them back: "
        f"sqlsink recover --sink-id {sink} --rollback-undecided 2"
    ), warning["fix"]

    human = sqlsink("recover", "--url", pg_url, "--sink-id", sink)
    assert human.code == 1 and "--rollback-undecided 2" in human.out
    planned = recover(pg_url, sink, "--dry-run")
    assert planned.json["sinks"][0]["undecided_kept_batches"] == [2]
    assert prepared_of(pg_url, sink) == lost

    # the checkpoint readable again, and recording commits/2: the flag is refused
    away.rename(chk)
    refused = recover(pg_url, sink, "--rollback-undecided", "2")
    assert refused.code == 2, refused.out + refused.err
    assert refused.json["error"]["message"] == (
        f"sink {sink}: Spark's checkpoint {chk} records batch 2 as committed (commits/2): "
        "its transactions hold the only copy of its rows; nothing was rolled back"
    )
    assert prepared_of(pg_url, sink) == lost
    chk.rename(away)

    # the operator knows better (here: wrongly, to show the flag acts)
    done = recover(pg_url, sink, "--rollback-undecided", "2")
    assert done.code == 0, done.out + done.err
    assert {a["gid"]: a["result"] for a in done.json["actions"]} == {g: "rolled back" for g in lost}
    assert prepared_of(pg_url, sink) == [] and decided(pg_url, sink) == [0, 1]
    assert ids_of(pg_url, keyed) == [*BATCH_ROWS[0], *BATCH_ROWS[1]]


def test_plain_recover_still_rolls_back_a_crashed_batch(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """A driver killed mid-batch, no failover: the recorded checkpoint has no commits/2, so
    batch 2's transactions are a dead run's leftovers, rolled back as before."""
    chk = tmp_path / "chk"
    make_checkpoint(chk, range(3), range(2))
    policy = checkpoint_policy(str(chk), WARN)
    old = Writer(pg_url, keyed, sink, QUERY)
    for batch in (0, 1):
        commit_checked(old, batch, [old.write(batch, BATCH_ROWS[batch])], policy)
    stale = sorted(str(old.write(2, range(200 + 3 * p, 203 + 3 * p), p).gid) for p in (0, 1))
    driver_gone(pg_url, sink, "1 hour")

    done = recover(pg_url, sink)
    assert done.code == 0, done.out + done.err
    assert {a["gid"]: a["result"] for a in done.json["actions"]} == {
        g: "rolled back" for g in stale
    }
    [doc] = done.json["sinks"]
    assert doc["checkpoint_read"] == str(chk) and doc["undecided_kept_batches"] == []
    assert prepared_of(pg_url, sink) == [] and decided(pg_url, sink) == [0, 1]
    assert ids_of(pg_url, keyed) == [*BATCH_ROWS[0], *BATCH_ROWS[1]]


def test_a_re_runs_partial_leftovers_of_a_batch_once_lost_are_not_named_for_commit_lost(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The loss of batch 2 was recorded (the commit of batch 3 found it); the operator chose
    to re-deliver it (the checkpoint rewound to 2). The re-run prepared partition 0 of batch
    2 and its driver died. Its leftover is part of a re-run, not the lost copy: recover
    without a readable checkpoint must not advise committing it, --commit-lost refuses."""
    chk = tmp_path / "chk"
    old, policy, _ = lost_batch_2(pg_url, keyed, sink, chk)
    restarted = new_run(old)
    with pytest.raises(DataLossError):
        commit_checked(restarted, 3, [restarted.write(3, BATCH_ROWS[3])], policy)
    for name in ("commits/2", "commits/.2.crc", "offsets/3", "offsets/.3.crc"):
        (chk / name).unlink(missing_ok=True)
    rerun = new_run(old)
    partial = str(rerun.write(2, range(20, 23), 0).gid)  # partition 1 never ran
    assert prepared_of(pg_url, sink) == [partial]
    driver_gone(pg_url, sink, "1 hour")
    away = tmp_path / "elsewhere"
    chk.rename(away)

    looked = recover(pg_url, sink)
    assert prepared_of(pg_url, sink) == [partial]
    assert looked.code == 1, looked.out + looked.err
    [doc] = looked.json["sinks"]
    assert doc["lost_decision_batches"] == [] and doc["undecided_kept_batches"] == [2]
    assert not any("--commit-lost" in (w["fix"] or "") for w in looked.json["warnings"])
    assert "--commit-lost" not in looked.out

    refused = recover(pg_url, sink, "--commit-lost", "2")
    assert refused.code == 2, refused.out + refused.err
    assert refused.json["error"]["message"] == (
        f"sink {sink}: batch 2's prepared transaction(s) {partial} are of run {rerun.run}, "
        "which started after what shows that Spark committed batch 2 (a commit of a later "
        "batch found its decision missing): a re-run of the batch (its checkpoint rewound), "
        "not the lost copy, and maybe part of it; nothing was decided"
    ), refused.json["error"]["message"]
    assert refused.json["error"]["fix"] == (
        "restart the query: it runs batch 2 again, and its first task rolls these back; or "
        "pass --checkpoint DIR to check batch 2 against Spark's commit log"
    )
    assert prepared_of(pg_url, sink) == [partial] and decided(pg_url, sink) == [0, 1]

    # with the checkpoint readable again (no commits/2): a dead run's leftover, rolled back
    away.rename(chk)
    done = recover(pg_url, sink)
    assert done.code == 0, done.out + done.err
    assert prepared_of(pg_url, sink) == [] and decided(pg_url, sink) == [0, 1]
    assert ids_of(pg_url, keyed) == [*BATCH_ROWS[0], *BATCH_ROWS[1]]


def test_commit_lost_after_a_failover_that_lost_a_partitions_prepare_says_what_it_cannot_see(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The standby received partition 0's PREPARE of batch 2, not partition 1's: nothing in
    the database tells (an empty partition prepares nothing either). The texts say so and
    offer the re-run; --commit-lost commits what is left, exactly that."""
    chk = tmp_path / "chk"
    _, _, lost = lost_batch_2(pg_url, keyed, sink, chk)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the PREPARE the failover lost
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(lost[1])))
    driver_gone(pg_url, sink, "1 hour")

    looked = recover(pg_url, sink)
    assert looked.code == 1 and prepared_of(pg_url, sink) == [lost[0]]
    [warning] = [w for w in looked.json["warnings"] if "--commit-lost" in (w["fix"] or "")]
    assert (
        "they hold the rows of each partition whose PREPARE survived: if the failover lost "
        "some, theirs are missing and nothing here can tell; re-running batch 2 from the "
        "rewound checkpoint, when the source still holds it, is exact either way"
    ) in warning["fix"], warning["fix"]

    done = recover(pg_url, sink, "--commit-lost", "2")
    assert done.code == 0, done.out + done.err
    [said] = [w["message"] for w in done.json["warnings"] if "decided batch 2" in w["message"]]
    assert said == (
        f"decided batch 2 with its 1 prepared transaction(s) ({lost[0]}): the recovery commits "
        "them (the rows of each partition whose PREPARE survived the failover: one whose "
        "PREPARE it lost cannot be seen here)"
    )
    assert ids_of(pg_url, keyed) == [*BATCH_ROWS[0], *BATCH_ROWS[1], 20, 21, 22]
    assert prepared_of(pg_url, sink) == [] and decided(pg_url, sink) == [0, 1, 2]
