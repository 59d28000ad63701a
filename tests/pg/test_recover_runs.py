"""``sqlsink recover`` and ``status`` judge liveness by the runs registry (issue 12 item 7,
the status part of item 16; docs/DESIGN.md invariant 10): a run is live while it is not
fenced, none of its batches was aborted, and its heartbeat is younger than its timeout
(``runTimeout``, or three times its recent batch interval), whatever is connected at
the moment. Each case runs the real command line beside the sink's own code."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlsink.core.gid import Gid
from sqlsink.errors import CommitError, FencedError
from sqlsink.postgres import locks, run_registry
from tests.pg.protocol import Writer, ids_of, prepare_by_hand, prepared_of
from tests.pg.test_cli import sqlsink

RUN_TIMEOUT_1S = {"runTimeout": "1s"}


def late_gid(url: str, table: str, sink: str, batch: int, run: str, ids: range) -> str:
    """A task of ``run`` that prepared and died before its own check after PREPARE (the
    check that rolls back a fenced run's or an aborted batch's attempt)."""
    return prepare_by_hand(url, table, Gid(sink, batch, 9, run, 900 + batch), ids)


def runs_of(url: str, sink: str) -> dict[str, run_registry.RunInfo]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {r.run_id: r for r in run_registry.runs(conn, sink)}


def sql_exec(url: str, query: str, *params: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query, params)


def driver_gone(url: str, sink: str, ago: str) -> None:
    """The sink's driver is gone: its runs were last heard from ``ago``. A transaction of a
    run prepared within its runTimeout counts as hearing from it too (invariant 10), and a
    prepare cannot be backdated: the prepared transactions are let age past 1 s (bounded),
    then the runs' runTimeout is lowered to 1 s as their heartbeat is set back."""
    deadline = time.monotonic() + 10
    while True:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(max(prepared) < clock_timestamp() - interval '1.1 s', true) "
                "FROM pg_prepared_xacts WHERE gid LIKE %s",
                (f"sqlsink\\_{sink}\\_%",),
            ).fetchone()
        if row is not None and row[0]:
            break
        assert time.monotonic() < deadline, "the prepared transactions did not age"
        time.sleep(0.1)
    sql_exec(
        url,
        "UPDATE sqlsink.runs SET heartbeat_at = clock_timestamp() - %s::interval, "
        "live_for = interval '1 s' WHERE sink_id = %s",
        ago,
        sink,
    )


def checkpoint_recorded(
    url: str, sink: str, root: Path, committed: range, query: str = "q"
) -> None:
    """What a stream's commit leaves: Spark's checkpoint (``commits/`` for ``committed``,
    ``offsets/`` one further), and its location recorded by each run's checkpoint check,
    which a plain ``sqlsink recover`` reads (no failover here: the batch in flight has no
    ``commits/``)."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": query}) + "\n")
    for n in range(committed.stop + 1):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + n, "conf": {}}
        (root / "offsets" / str(n)).write_text(f'v1\n{json.dumps(meta)}\n{{"logOffset":{n}}}')
    for n in committed:
        (root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    sql_exec(
        url,
        "UPDATE sqlsink.runs SET checkpoint_verdict = 'verified', checkpoint_detail = '', "
        "checkpoint_location = %s, checkpoint_checked_at = clock_timestamp() "
        "WHERE sink_id = %s",
        str(root),
        sink,
    )


def sink_doc(result: Any) -> dict[str, Any]:
    (sink,) = result.json["sinks"]
    return dict(sink)


def test_recover_leaves_a_live_runs_batch_while_nothing_of_it_is_connected(
    pg_url: str, keyed: str, sink: str
) -> None:
    """Item 7: every batch has seconds with its gids prepared and no session connected
    (tasks close after PREPARE; the commit runs in a fresh Python worker); recover took
    the sink for dead then, rolled the batch back, and the live commit failed. Now the
    live run's batch is left, and a dead run's leftover beside it is resolved."""
    old = Writer(pg_url, keyed, sink, query_id="q", run="run-old")
    old.batch(0, range(5))
    live = Writer(pg_url, keyed, sink, query_id="q", run="run-live")  # a restart: fences run-old
    live.batch(1, range(5, 10))
    in_flight = [live.write(2, range(10, 15), 0), live.write(2, range(15, 20), 1)]
    gids = sorted(o.gid for o in in_flight if o.gid)
    stale = late_gid(pg_url, keyed, sink, 2, "run-old", range(900, 905))  # the zombie's

    result = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json")
    assert result.code == 1, result.out + result.err  # something left: the live run's
    doc = sink_doc(result)
    assert doc["status"] == "recovered" and doc["live"] is True
    assert doc["live_runs"] == ["run-live"] and doc["sessions"] == []
    assert result.actions()[stale] == ("rollback", True)
    assert {result.actions()[g] for g in gids} == {("leave", False)}
    assert {a["reason"] for a in result.json["actions"] if a["gid"] in gids} == {
        "run run-live is live"
    }
    runs = {r["run_id"]: r for r in doc["runs"]}
    assert runs["run-live"]["state"] == "live" and runs["run-live"]["prepared"] == 2
    assert runs["run-live"]["heartbeat_age_seconds"] < 30
    assert runs["run-live"]["timeout_seconds"] == runs["run-live"]["run_timeout_seconds"] == 300
    assert runs["run-old"]["state"] == "fenced" and runs["run-old"]["superseded_by"] == "run-live"
    (said,) = [w for w in result.json["warnings"] if "run run-live is live" in w["message"]]
    assert "2 undecided prepared transaction(s) were left for its own commit" in said["message"]
    assert "live while heard from within 5m00s: its runTimeout" in said["message"]
    assert f"--sink-id {sink} --force --run-id run-live" in said["fix"]
    assert prepared_of(pg_url, sink) == gids

    human = sqlsink("recover", "--url", pg_url, "--sink-id", sink)
    assert human.code == 1, human.out + human.err
    assert "live run run-live (live: heard from" in human.out

    status = sqlsink("status", "--url", pg_url, "--sink-id", sink, "--json")
    assert status.code == 0, status.out + status.err  # nothing stranded: its run is live
    assert sink_doc(status)["live"] is True
    assert not any(p["stranded"] for p in sink_doc(status)["prepared"])

    # naming a run that is already fenced fences nothing more, and leaves the live run be
    again = sqlsink(
        "recover", "--url", pg_url, "--sink-id", sink, "--force", "--run-id", "run-old", "--json"
    )
    assert again.code == 1, again.out + again.err
    assert sink_doc(again)["fenced_runs"] == [] and prepared_of(pg_url, sink) == gids
    assert any("already fenced" in w["message"] for w in again.json["warnings"])

    live.commit(2, list(in_flight))  # the live commit goes through
    assert ids_of(pg_url, keyed) == list(range(20))
    assert prepared_of(pg_url, sink) == []


def test_recover_resolves_a_run_once_its_heartbeat_is_older_than_its_timeout(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    writer = Writer(
        pg_url, keyed, sink, query_id="q", extra={"runTimeout": "30s"}
    )  # a loaded machine starts the CLI in seconds
    writer.batch(0, range(5))
    in_flight = [writer.write(1, range(5, 10), 0), writer.write(1, range(10, 15), 1)]
    fresh = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json")
    assert sink_doc(fresh)["live_runs"] == [writer.run]
    assert len(prepared_of(pg_url, sink)) == 2

    # the driver is gone: nothing of the run is heard from any more
    checkpoint_recorded(pg_url, sink, tmp_path / "chk", range(1))
    driver_gone(pg_url, sink, "45 s")
    late = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json")
    assert late.code == 0, late.out + late.err
    doc = sink_doc(late)
    assert doc["live"] is False and doc["live_runs"] == [] and doc["rolled_back"] == 2
    (run,) = doc["runs"]
    assert run["state"] == "dead" and run["heartbeat_age_seconds"] >= 45
    assert run["timeout_seconds"] == run["run_timeout_seconds"] == 1
    assert prepared_of(pg_url, sink) == []
    # were the driver only slow, its commit now fails loudly, and nothing of it is visible
    with pytest.raises(CommitError, match="no longer prepared"):
        writer.commit(1, list(in_flight))
    assert ids_of(pg_url, keyed) == list(range(5))


def test_the_timeout_follows_the_runs_batch_interval(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """The data source never learns the trigger: a run is live while heard from within
    max(runTimeout, 3 x its recent batch interval) (the longest of the last three gaps
    between its decisions). A 10-minute trigger keeps a run live for 30 minutes."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra=RUN_TIMEOUT_1S)
    for batch in range(5):
        writer.batch(batch, range(batch * 10, batch * 10 + 5))
    # decided 10 minutes apart, the last one just now; only the last 4 decisions count,
    # so the 5 hours before batch 1 (the source was idle) do not
    sql_exec(
        pg_url,
        "UPDATE sqlsink.decisions SET decided_at = clock_timestamp() "
        "  - (4 - batch_id) * interval '10 min' - CASE WHEN batch_id = 0 "
        "  THEN interval '5 hours' ELSE interval '0' END WHERE sink_id = %s",
        sink,
    )
    in_flight = [writer.write(5, range(50, 55))]  # its tasks prepared; then silence
    age = (
        "UPDATE sqlsink.runs SET heartbeat_at = clock_timestamp() - %s::interval WHERE sink_id = %s"
    )
    sql_exec(pg_url, age, "20 min", sink)

    status = sqlsink("status", "--url", pg_url, "--sink-id", sink, "--json")
    assert status.code == 0, status.out + status.err
    (run,) = sink_doc(status)["runs"]
    assert run["state"] == "live" and run["run_timeout_seconds"] == 1
    assert run["batch_interval_seconds"] == pytest.approx(600, abs=1)
    assert run["timeout_seconds"] == pytest.approx(1800, abs=3)
    kept = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json")
    assert sink_doc(kept)["live_runs"] == [writer.run] and len(prepared_of(pg_url, sink)) == 1
    human = sqlsink("status", "--url", pg_url, "--sink-id", sink)
    assert "timeout 30m00s: 3 x its batch interval 10m00s" in human.out, human.out

    checkpoint_recorded(pg_url, sink, tmp_path / "chk", range(5))
    driver_gone(pg_url, sink, "31 min")
    gone = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json")
    assert gone.code == 0, gone.out + gone.err
    assert sink_doc(gone)["live_runs"] == [] and sink_doc(gone)["rolled_back"] == 1
    assert runs_of(pg_url, sink)[writer.run].state == "dead"
    with pytest.raises(CommitError, match="no longer prepared"):
        writer.commit(5, list(in_flight))
    assert ids_of(pg_url, keyed) == [i for b in range(5) for i in range(b * 10, b * 10 + 5)]


def test_force_fences_the_named_run_ends_its_session_and_resolves(
    pg_url: str, keyed: str, sink: str
) -> None:
    """--force --run-id: the run is declared dead in the commit log; its session that holds
    the sink's lock (a committer paused mid-commit) is ended; its batch is rolled back;
    and it can never commit again."""
    writer = Writer(pg_url, keyed, sink, query_id="q", run="run-stuck")
    writer.batch(0, range(5))
    in_flight = [writer.write(1, range(5, 10), 0), writer.write(1, range(10, 15), 1)]
    gids = sorted(o.gid for o in in_flight if o.gid)

    dry = sqlsink(
        "recover", "--url", pg_url, "--sink-id", sink, "--force", "--run-id", "run-stuck",
        "--dry-run", "--json",
    )  # fmt: skip
    assert dry.code == 1, dry.out + dry.err
    assert {dry.actions()[g] for g in gids} == {("rollback", False)}
    assert sink_doc(dry)["fenced_runs"] == [] and sink_doc(dry)["live_runs"] == []
    assert runs_of(pg_url, sink)["run-stuck"].state == "live"  # a dry run fences nothing

    with psycopg.connect(pg_url, autocommit=True) as paused:  # the run's committer, stuck
        assert locks.try_sink_lock(paused, sink)
        run_registry.register_run(paused, sink, "run-stuck", 300.0, holds_lock=True)
        pid = paused.info.backend_pid
        forced = sqlsink(
            "recover", "--url", pg_url, "--sink-id", sink, "--force", "--run-id", "run-stuck",
            "--json",
        )  # fmt: skip
        assert forced.code == 0, forced.out + forced.err
        doc = sink_doc(forced)
        assert doc["fenced_runs"] == ["run-stuck"] and doc["ended_sessions"] == [pid]
        assert doc["status"] == "recovered" and doc["rolled_back"] == 2 and doc["live"] is False
        assert forced.json["forced"] is True and forced.json["run_ids"] == ["run-stuck"]
        (run,) = doc["runs"]
        assert (run["state"], run["superseded_by"]) == ("fenced", "operator")
        with pytest.raises(psycopg.OperationalError):
            paused.execute("SELECT 1")  # its session was ended
    assert prepared_of(pg_url, sink) == []

    with pytest.raises(FencedError) as refused:  # the run wakes up: refused, touches nothing
        writer.commit(1, list(in_flight))
    assert str(refused.value).startswith(f"sink {sink!r}: run run-stuck was superseded by an ")
    assert "an operator (sqlsink recover --force)" in str(refused.value)
    with pytest.raises(FencedError):
        writer.write(2, range(15, 20))
    assert ids_of(pg_url, keyed) == list(range(5))  # nothing of batch 1 was committed
    assert prepared_of(pg_url, sink) == []
    # a restart of the query (a new run) goes on
    Writer(pg_url, keyed, sink, query_id="q").batch(1, range(5, 15))
    assert ids_of(pg_url, keyed) == list(range(15))


def test_status_warns_about_leftovers_that_no_live_run_will_finish(
    pg_url: str, keyed: str, sink: str, tmp_path: Path
) -> None:
    """Item 16: a stream that receives no more data runs no task and no commit to sweep
    what its last batch left: status says so, with the command to run."""
    writer = Writer(pg_url, keyed, sink, query_id="q", run="run-stopped")
    writer.batch(0, range(5))
    writer.abort(1, [None])  # query.stop() while batch 1 ran: Spark aborts it ...
    late = late_gid(pg_url, keyed, sink, 1, "run-stopped", range(5, 10))  # ... a task prepared

    result = sqlsink("status", "--url", pg_url, "--sink-id", sink, "--json")
    assert result.code == 1, result.out + result.err
    doc = sink_doc(result)
    assert doc["live"] is False
    assert [(p["gid"], p["stranded"]) for p in doc["prepared"]] == [(late, True)]
    (run,) = doc["runs"]
    assert (run["run_id"], run["state"], run["aborted_batch"]) == ("run-stopped", "dead", 1)
    (warning,) = [w for w in result.json["warnings"] if w["sink_id"] == sink]
    assert "1 prepared transaction(s) have no live run to finish them" in warning["message"]
    assert "Spark aborted its batch 1" in warning["message"] and late in warning["message"]
    assert "a retired query never does" in warning["message"]
    assert f"sqlsink recover --url '{pg_url}' --sink-id {sink}" in warning["fix"]
    assert f"sqlsink forget --url '{pg_url}' --sink-id {sink}" in warning["fix"]

    human = sqlsink("status", "--url", pg_url, "--sink-id", sink)
    assert human.code == 1
    assert "STRANDED" in human.out and "runs:" in human.out and "batch 1 aborted" in human.out

    # a dead run's leftovers too, whatever their age
    other = Writer(pg_url, keyed, sink, query_id="q", extra={"runTimeout": "30s"})
    resolved = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json")
    assert resolved.code == 0 and resolved.actions()[late] == ("rollback", True)
    other.batch(1, range(5, 10))
    left = [other.write(2, range(10, 15))]
    assert sqlsink("status", "--url", pg_url, "--sink-id", sink).code == 0  # live: fine
    checkpoint_recorded(pg_url, sink, tmp_path / "chk", range(2))
    driver_gone(pg_url, sink, "1 min")
    dead = sqlsink("status", "--url", pg_url, "--sink-id", sink, "--json")
    assert dead.code == 1, dead.out + dead.err
    (warning,) = [w for w in dead.json["warnings"] if w["sink_id"] == sink]
    # the command's own start takes seconds on a loaded machine
    said = rf"run {other.run} \(dead: heard from 1m0\ds ago, timeout 1s: its runTimeout\)"
    assert re.search(said, warning["message"]), warning["message"]
    assert sqlsink("recover", "--url", pg_url, "--sink-id", sink).code == 0
    assert prepared_of(pg_url, sink) == [] and left[0].gid is not None
    clean = sqlsink("status", "--url", pg_url, "--sink-id", sink, "--json")
    assert clean.code == 0 and clean.json["warnings"] == []
    assert ids_of(pg_url, keyed) == list(range(10))


def test_a_dry_run_does_not_say_nothing_is_prepared_of_a_live_run_whose_batch_it_finishes(
    pg_url: str, keyed: str, sink: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first-contact trial: a live run's driver stopped after the decision of batch 1,
    before its COMMIT PREPAREDs. ``recover --dry-run`` said "1 prepared transaction(s) to
    finish" and, for the same run, "nothing of it is prepared". The run's notice now says
    what recover does with them: they are of a decided batch, finished by recover."""
    from sqlsink.core.faults import ENV as FAULTS_ENV

    live = Writer(pg_url, keyed, sink, query_id="q", run="run-live")
    live.batch(0, range(5))
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "after_decision", "batch": 1, "action": "raise"}]))
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    outcome = live.write(1, range(5, 10))
    with pytest.raises(RuntimeError, match="injected fault at after_decision"):
        live.commit(1, [outcome])
    monkeypatch.delenv(FAULTS_ENV)
    assert prepared_of(pg_url, sink) == [outcome.gid]

    for args, verb in ((["--dry-run"], "would be"), ([], "were")):
        result = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json", *args)
        (said,) = [w for w in result.json["warnings"] if "run run-live is live" in w["message"]]
        assert "nothing of it is prepared" not in said["message"], said
        assert (
            f"its 1 prepared transaction(s) of decided batches {verb} committed by this "
            "recover; none is left for its own commit"
        ) in said["message"]
    assert prepared_of(pg_url, sink) == []
    assert ids_of(pg_url, keyed) == list(range(10))
