"""``sqlsink recover --checkpoint`` on a MariaDB URL with a real Spark checkpoint: a
streaming driver (its own process, real Spark) SIGKILLed after batch 1's branches were
prepared and before its decision. ``status`` shows its live run and its undecided
branches; ``recover --checkpoint`` finds the sink from the
checkpoint and leaves the live run's branches; ``--force --run-id`` declares the run
dead, and, since Spark's checkpoint has no commits/1, the branches are rolled back:
afterwards batch 0's rows exactly, XA RECOVER empty of the sink's branches."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.fix_mariadb import MariaServer
from tests.mariadb.protocol import ids_of, prepared_of
from tests.mariadb.test_cli import cli, document
from tests.spark.streams import query_id, write_source
from tests.spark.test_crash import kill_driver_at

pytestmark = pytest.mark.spark
BATCHES = [range(0, 30), range(30, 70), range(70, 100)]


def test_recover_with_the_queries_checkpoint_after_the_driver_was_killed(
    tmp_path: Path, mariadb_server: MariaServer
) -> None:
    url, table = mariadb_server.url(), f"m_{uuid.uuid4().hex[:10]}"
    write_source(tmp_path / "src", BATCHES)
    kill_driver_at("before_decision", 1, tmp_path, url, table)
    checkpoint = tmp_path / "chk"
    sink = query_id(checkpoint)
    left = prepared_of(url, sink)
    assert len(left) == 2 and ids_of(url, table) == list(range(30))

    status = document(cli(url, "status", "--json", "--sink-id", sink), "status")
    (doc,) = status["sinks"]
    assert sorted(p["gid"] for p in doc["prepared"]) == left and doc["live"] is True
    assert doc["last_complete_batch"] == 0 and doc["incomplete_batches"] == []
    run = doc["runs"][0]["run_id"]

    kept = cli(url, "recover", "--json", "--checkpoint", str(checkpoint))
    plan = document(kept, "recover")
    assert [s["sink_id"] for s in plan["sinks"]] == [sink]
    assert {(a["action"], a["why"]) for a in plan["actions"]} == {("leave", "live_run")}
    relation = {b["batch_id"]: b["state"] for b in plan["checkpoint"]["batches"]}
    assert relation[0] == "consistent" and 1 in relation, plan["checkpoint"]
    assert prepared_of(url, sink) == left

    done = cli(url, "recover", "--checkpoint", str(checkpoint), "--force", "--run-id", run)
    assert done.code == 0, done.out + done.err
    assert "committed in Spark and in the database" in done.out or "batch 0" in done.out
    assert prepared_of(url, sink) == [] and ids_of(url, table) == list(range(30))
