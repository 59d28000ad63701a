"""``sqlsink forget`` (issue 12 item 1): the one way to remove a sink's log, refused while
anything of the sink is unfinished, so that following the sink's advice can never
half-commit a batch."""

from __future__ import annotations

import time
from datetime import timezone

import psycopg

from sqlsink.core.model import NewDecision
from tests.pg.protocol import Writer, ids_of, prepared_of
from tests.pg.test_cli import sqlsink


def test_forget_refuses_an_unfinished_sink_then_frees_its_id(
    pg_url: str, keyed: str, sink: str
) -> None:
    old = Writer(pg_url, keyed, sink, query_id="q-old", extra={"runTimeout": "1s"})
    old.batch(0, range(5))
    outcomes = [old.write(1, range(5, 10), 0), old.write(1, range(10, 15), 1)]
    with old.committer() as committer:  # decided, one gid committed, the driver dies
        committer.backend.insert_decision(
            NewDecision(sink, 1, [o.gid for o in outcomes if o.gid], 10, "q-old", old.run)
        )
        assert outcomes[0].gid is not None
        committer.backend.commit_prepared(outcomes[0].gid)

    refused = sqlsink("forget", "--url", pg_url, "--sink-id", sink)
    assert refused.code == 1, refused.out + refused.err
    assert "1 prepared transaction(s)" in refused.out and "incomplete batch(es) 1" in refused.out
    assert f"sqlsink recover --sink-id {sink}" in refused.out
    assert prepared_of(pg_url, sink) == [outcomes[1].gid]  # nothing was touched

    time.sleep(1.2)  # the old run is no longer live (runTimeout 1s)
    recovered = sqlsink("recover", "--url", pg_url, "--sink-id", sink)
    assert recovered.code == 0, recovered.out + recovered.err
    assert ids_of(pg_url, keyed) == list(range(15))  # the batch was finished, not lost

    done = sqlsink("forget", "--url", pg_url, "--sink-id", sink, "--json")
    assert done.code == 0, done.out + done.err
    assert (done.json["forgotten"], done.json["decisions"]) == (True, 2)
    assert (done.json["first_batch"], done.json["last_batch"]) == (0, 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for table in ("sinks", "decisions", "runs", "markers"):
            row = conn.execute(f"SELECT count(*) FROM sqlsink.{table} WHERE sink_id = %s", (sink,))
            assert row.fetchone() == (0,), table

    # the sink id is free: another writer may use it now
    Writer(pg_url, keyed, sink, query_id="q-new").batch(0, range(100, 105))
    assert ids_of(pg_url, keyed) == [*range(15), *range(100, 105)]


def test_forget_refuses_a_live_run(pg_url: str, keyed: str, sink: str) -> None:
    Writer(pg_url, keyed, sink, query_id="q").batch(0, range(5))  # runTimeout 5 min
    refused = sqlsink("forget", "--url", pg_url, "--sink-id", sink)
    assert refused.code == 1 and "a live run" in refused.out and "stop the query" in refused.out


def test_forget_warns_that_a_replay_from_the_old_checkpoint_writes_again(
    pg_url: str, keyed: str, sink: str
) -> None:
    """The log is what made a replay of the last batch write nothing; the checkpoint that
    would replay it is not in the database, so forget says it, in words and in JSON."""
    writer = Writer(pg_url, keyed, sink, query_id="q", extra={"runTimeout": "1s"})
    writer.batch(0, range(5))
    writer.batch(1, range(5, 10))
    time.sleep(1.2)  # the run is no longer live (runTimeout 1s)
    warning = (
        "a query restarted from its old checkpoint replays its last batch (1) against the "
        "now empty log, so that batch's rows are written again (its driver may have "
        "stopped after the decision and before Spark recorded the batch); write sink id "
        f"{sink} again only from a new checkpointLocation"
    )
    done = sqlsink("forget", "--url", pg_url, "--sink-id", sink)
    assert done.code == 0, done.out + done.err
    said = done.out.splitlines()
    success = said.index(
        f"forgot sink {sink}: 2 decided batch(es), 0 to 1; the sink id can be used again"
    )
    assert said[success + 1] == f"warning: {warning}", done.out

    writer.batch(0, range(10, 15))  # the sink id again: forgotten with --json this time
    time.sleep(1.2)
    as_json = sqlsink("forget", "--url", pg_url, "--sink-id", sink, "--json")
    assert as_json.code == 0, as_json.out + as_json.err
    assert as_json.json["replay_warning"] == warning.replace("batch (1)", "batch (0)")
    nothing = sqlsink("forget", "--url", pg_url, "--sink-id", sink, "--json")
    assert (nothing.json["forgotten"], nothing.json["replay_warning"]) == (False, None)
    assert nothing.code == 2  # forgotten already: an unknown sink now
    assert nothing.json["error"]["message"] == (
        f"unknown sink {sink} in database {nothing.json['database']}: the commit log has "
        f"nothing of it (known sinks: {', '.join(known_sinks(pg_url))}); nothing was removed"
    )
    assert "sqlsink status lists the sinks" in nothing.json["error"]["fix"]


def test_forget_of_a_named_loads_sink_speaks_of_the_load_not_of_a_query(
    pg_url: str, keyed: str, sink: str
) -> None:
    """A sink bound to a named batch load: no query to stop while its run is live, no
    checkpoint to replay from once forgotten; what holds is said instead."""
    load = Writer(pg_url, keyed, sink, query_id=None, run="run-load", extra={"runTimeout": "3s"})
    load.batch(0, range(5), range(5, 10))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT heartbeat_at + live_for FROM sqlsink.runs WHERE sink_id = %s", (sink,)
        ).fetchone()
    assert row is not None
    until = f"{row[0].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    refused = sqlsink("forget", "--url", pg_url, "--sink-id", sink)
    assert refused.code == 1, refused.out + refused.err
    assert (
        f"refused: sink {sink} is not finished: it has a live run (run-load): a named load's "
        "run is considered live until its runTimeout has passed since it was last heard "
        f"from, even once the load has finished (here until {until}). Forgetting it now "
        "would lose what its log is there to complete. Nothing was removed. Fix: once the "
        f"load has finished, wait until {until} (sqlsink status shows its run), then run "
        "sqlsink forget again"
    ) in refused.out.splitlines(), refused.out

    time.sleep(3.2)  # the load's run is no longer live (runTimeout 3s)
    done = sqlsink("forget", "--url", pg_url, "--sink-id", sink, "--json")
    assert done.code == 0, done.out + done.err
    assert done.json["replay_warning"] == (
        f"sink id {sink} belonged to a named batch load, and its log is what made a re-run "
        "of that load write nothing: now a re-run of the old load (a job retried, or run "
        "again after a crash) writes that load's rows again; use sink id "
        f"{sink} again only for data that is not in the table yet"
    )
    # and so it does: the same load again, under the forgotten sink id
    Writer(pg_url, keyed, sink, query_id=None).batch(0, range(100, 105))
    assert ids_of(pg_url, keyed) == [*range(10), *range(100, 105)]


def known_sinks(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT sink_id FROM sqlsink.sinks ORDER BY 1")][
            :20
        ] or ["none"]


def test_forget_of_a_mistyped_sink_exits_2_and_lists_the_known_sinks(
    pg_url: str, keyed: str, sink: str
) -> None:
    """The first-contact trial: ``forget`` of a mistyped id said "nothing to forget" and
    exited 0 (``status --sink-id`` of the same typo exits 2 and lists the sinks)."""
    Writer(pg_url, keyed, sink, query_id="q", run="r1").batch(0, range(3))
    typo = sink + "x"
    result = sqlsink("forget", "--url", pg_url, "--sink-id", typo)
    assert result.code == 2, result.out + result.err
    said = result.out + result.err
    assert f"unknown sink {typo} in database" in said, said
    assert f"(known sinks: {', '.join(known_sinks(pg_url))})" in said, said  # the first 20
    assert "nothing was removed" in said
    assert ids_of(pg_url, keyed) == [0, 1, 2]


def test_forget_of_a_sink_with_only_its_registration_removes_it(
    pg_url: str, keyed: str, sink: str
) -> None:
    """A one-off load that failed before its decision leaves a registered sink with no
    decided batch (it cluttered status); forget removes it and says so, exit 0."""
    writer = Writer(pg_url, keyed, sink, query_id=None, run="r1")
    outcome = writer.write(0, range(3))
    writer.abort(0, [outcome])
    assert registered(pg_url, sink)
    time.sleep(1.2)
    result = sqlsink("forget", "--url", pg_url, "--sink-id", sink, "--json")
    assert result.code == 0, result.out + result.err
    assert result.json["forgotten"] is True and result.json["decisions"] == 0
    assert result.json["replay_warning"] is None
    assert not registered(pg_url, sink)


def registered(url: str, sink: str) -> bool:
    """The log has the sink's registration (the suite's database holds many sinks: the
    listing of the first 20 need not name it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM sqlsink.sinks WHERE sink_id = %s", (sink,))
        return bool(row.fetchone()[0])  # type: ignore[index]
