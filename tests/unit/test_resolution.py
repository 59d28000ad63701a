from datetime import datetime, timezone

from sqlsink.core.gid import Gid
from sqlsink.core.model import Decision, PreparedTransaction
from sqlsink.core.resolution import Action, Scope, Why, plan_resolution, sentence, whose

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
RUN, DEAD = "run-live", "run-dead"


def txn(gid: str, database: str = "shop") -> PreparedTransaction:
    return PreparedTransaction(gid, database, "app", NOW)


def g(batch: int, partition: int, run: str = RUN, sink: str = "s1", attempt: int = 0) -> str:
    return str(Gid(sink, batch, partition, run, attempt))


def decision(batch: int, *gids: str, complete: bool = False, sink: str = "s1") -> Decision:
    return Decision(sink, batch, frozenset(gids), 10, NOW, complete)


def actions(plan: object) -> dict[str, Action]:
    return {a.prepared.gid: a.action for a in plan.actions}  # type: ignore[attr-defined]


def test_decided_gids_commit_and_others_of_the_batch_roll_back() -> None:
    chosen, denied = g(5, 0, attempt=1), g(5, 0, attempt=2)
    plan = plan_resolution(
        [txn(chosen), txn(denied)],
        {("s1", 5): decision(5, chosen)},
        database="shop",
        sink_id="s1",
        scope=Scope.everything(),
    )
    assert actions(plan) == {chosen: Action.COMMIT, denied: Action.ROLLBACK}


def test_recovery_rolls_back_every_undecided_gid() -> None:
    gids = [g(7, 0), g(7, 1, run=DEAD), g(8, 0)]
    plan = plan_resolution(
        [txn(x) for x in gids], {}, database="shop", sink_id="s1", scope=Scope.everything()
    )
    assert set(actions(plan).values()) == {Action.ROLLBACK}


def test_live_run_leaves_its_in_flight_gids() -> None:
    in_flight, later, earlier, dead = g(7, 0), g(8, 0), g(6, 1), g(7, 1, run=DEAD)
    plan = plan_resolution(
        [txn(in_flight), txn(later), txn(earlier), txn(dead)],
        {},
        database="shop",
        sink_id="s1",
        scope=Scope.live(RUN, 7),
    )
    assert actions(plan) == {
        in_flight: Action.LEAVE,
        later: Action.LEAVE,
        earlier: Action.ROLLBACK,
        dead: Action.ROLLBACK,
    }


def test_abort_rolls_back_its_own_batch() -> None:
    mine, later = g(7, 0), g(8, 0)
    plan = plan_resolution(
        [txn(mine), txn(later)], {}, database="shop", sink_id="s1", scope=Scope.aborting(RUN, 7)
    )
    assert actions(plan) == {mine: Action.ROLLBACK, later: Action.LEAVE}


def test_foreign_other_sink_and_other_database_are_left() -> None:
    foreign = ["app_tx_1", "sqlsink_s1_7_0", "sqlsink_s1-x_7_0_run_1", g(7, 0, sink="s2")]
    other_db = g(7, 0)
    plan = plan_resolution(
        [txn(x) for x in foreign] + [txn(other_db, database="other")],
        {("s2", 7): decision(7, g(7, 0, sink="s2"), sink="s2")},
        database="shop",
        sink_id="s1",
        scope=Scope.everything(),
    )
    assert set(actions(plan).values()) == {Action.LEAVE}
    # a decided gid of this sink in another database is not ours to verify either
    assert plan.to_verify == []


def test_all_sinks_mode_still_leaves_other_databases() -> None:
    plan = plan_resolution(
        [txn(g(1, 0, sink="a")), txn(g(1, 0, sink="b"), database="x")],
        {},
        database="shop",
        sink_id=None,
        scope=Scope.everything(),
    )
    assert [a.action for a in plan.actions] == [Action.ROLLBACK, Action.LEAVE]


def test_decided_gids_that_are_gone_are_to_verify() -> None:
    done, gone, pending = g(3, 0), g(3, 1), g(3, 2)
    plan = plan_resolution(
        [txn(pending)],
        {
            ("s1", 3): decision(3, done, gone, pending),
            ("s1", 2): decision(2, g(2, 0), complete=True),
        },
        database="shop",
        sink_id="s1",
        scope=Scope.everything(),
    )
    assert actions(plan) == {pending: Action.COMMIT}
    assert plan.to_verify == [(3, done), (3, gone)]


def test_a_batch_between_the_highest_decided_and_the_running_one_is_left() -> None:
    """Spark went past batch 6 (it runs 7) and the log's highest decision is 5: batch 6's
    decision was lost, and its gids hold its rows, whichever run prepared them."""
    lost, lost_dead, orphan, dead = g(6, 0), g(6, 1, run=DEAD), g(5, 0, attempt=9), g(7, 1, DEAD)
    prepared = [txn(x) for x in (lost, lost_dead, orphan, dead)]
    for scope in (Scope.live(RUN, 7).knowing(5), Scope.aborting(RUN, 7).knowing(5)):
        plan = plan_resolution(prepared, {}, database="shop", sink_id="s1", scope=scope)
        assert actions(plan)[lost] == actions(plan)[lost_dead] == Action.LEAVE
        assert actions(plan)[orphan] == Action.ROLLBACK  # below the highest decided
        assert plan.lost_decisions == {6: sorted([lost, lost_dead])}
        reasons = {a.prepared.gid: a.reason for a in plan.actions}
        assert reasons[lost].startswith("batch 6 has no decision, but Spark runs batch 7")
        assert "sqlsink recover --sink-id s1 --commit-lost 6 commits them" in reasons[lost]
    # not told the highest decided batch (the old rule), or nothing between: rolled back
    for scope in (Scope.live(RUN, 7), Scope.live(RUN, 7).knowing(6)):
        plan = plan_resolution(prepared[:1], {}, database="shop", sink_id="s1", scope=scope)
        assert actions(plan)[lost] == Action.ROLLBACK and plan.lost_decisions == {}


def test_recovery_leaves_the_batches_spark_committed() -> None:
    lost, rerun = g(6, 0, run=DEAD), g(7, 0, run=DEAD)
    scope = Scope.everything(lost=frozenset({6}))
    plan = plan_resolution([txn(lost), txn(rerun)], {}, database="shop", sink_id="s1", scope=scope)
    assert actions(plan) == {lost: Action.LEAVE, rerun: Action.ROLLBACK}
    assert plan.lost_decisions == {6: [lost]}


def test_every_reason_is_data_with_one_sentence() -> None:
    """The plan carries ``why`` (what callers branch on); ``sentence`` words every value,
    and the action's ``reason`` is that sentence."""
    lost, live, mine = g(6, 0, run=DEAD), g(9, 0, run="run-other"), g(8, 0)
    scope = Scope.everything(live_runs=frozenset({"run-other"}), lost=frozenset({6}))
    prepared = [txn(lost), txn(live), txn(mine), txn("xa-foreign"), txn(g(3, 0), "elsewhere")]
    plan = plan_resolution(prepared, {}, database="shop", sink_id="s1", scope=scope)
    whys = {a.prepared.gid: a.why for a in plan.actions}
    assert whys[lost] is Why.LOST_DECISION and whys[live] is Why.LIVE_RUN
    assert whys[mine] is Why.UNDECIDED and whys["xa-foreign"] is Why.FOREIGN
    assert whys[g(3, 0)] is Why.OTHER_DATABASE
    for a in plan.actions:
        assert a.reason == sentence(a.why, a.prepared, Gid.parse(a.prepared.gid), scope)
    gid = Gid.parse(mine)
    texts = {why: sentence(why, txn(mine), gid, Scope.live(RUN, 9).knowing(5)) for why in Why}
    assert all(texts.values()) and len(set(texts.values())) == len(Why)


def test_status_and_recover_sort_the_others_by_one_rule() -> None:
    """``whose``: foreign first, then another sink's (when one is named), then another
    database's; the same gid gets the same ``why`` in ``plan_resolution``."""
    other_sink_elsewhere = txn(g(1, 0, sink="s2"), "elsewhere")
    cases = [
        (txn("xa-foreign"), "s1", Why.FOREIGN),
        (other_sink_elsewhere, "s1", Why.OTHER_SINK),
        (other_sink_elsewhere, None, Why.OTHER_DATABASE),
        (txn(g(1, 0)), "s1", None),
    ]
    for prepared, sink_id, expected in cases:
        assert whose(prepared, Gid.parse(prepared.gid), "shop", sink_id) is expected
        plan = plan_resolution([prepared], {}, database="shop", sink_id=sink_id, scope=Scope())
        if expected is not None:
            assert plan.actions[0].why is expected


def test_no_code_branches_on_a_reasons_words() -> None:
    """Rewording a sentence must not change what a command does: nothing in the package
    compares or searches an action's ``reason`` (branch on ``why``)."""
    import ast
    from pathlib import Path

    import sqlsink

    found = []
    for path in Path(sqlsink.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            reads = [
                n for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr == "reason"
            ]
            if not reads:
                continue
            if isinstance(node, ast.Compare) or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"startswith", "endswith", "find", "index"}
                and any(n is node.func.value for n in reads)
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_the_json_contract_page_lists_every_why() -> None:
    """docs/reference/json.md names each value ``why`` can take, so a new one is documented."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs/reference/json.md").read_text()
    assert [w.value for w in Why if f'`"{w.value}"`' not in page] == []
