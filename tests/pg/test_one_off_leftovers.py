"""A one-off batch load (no sinkId) whose driver died after a PREPARE: its sink id is
random, so no later run of that sink exists to finish what it left. ``sqlsink status``
says so, with the one command that resolves it."""

from __future__ import annotations

import time
import uuid

from tests.pg.protocol import Writer, ids_of, prepared_of
from tests.pg.test_cli import sqlsink


def test_status_names_a_dead_one_off_loads_leftovers_and_the_command(
    pg_url: str, keyed: str
) -> None:
    run = uuid.uuid4().hex
    sink = f"load-{run[:16]}"  # as format('sqlsink') names a load without sinkId
    load = Writer(pg_url, keyed, sink, query_id=None, run=run, extra={"runTimeout": "1s"})
    left = load.write(0, range(5))  # its driver dies before the commit
    assert left.gid is not None and prepared_of(pg_url, sink) == [left.gid]
    time.sleep(1.2)  # the run is no longer live (runTimeout 1s)

    result = sqlsink("status", "--url", pg_url, "--json")
    assert result.code == 1, result.out + result.err
    (warning,) = [w for w in result.json["warnings"] if w["sink_id"] == sink]
    assert warning["message"].startswith(
        f"1 prepared transaction(s) of a one-off batch load (a load without sinkId, sink id "
        f"{sink}), whose driver stopped before its commit or abort (run {run}"
    ), warning["message"]
    assert warning["message"].endswith(
        "): no later run of this sink id will ever exist, so nothing but sqlsink recover "
        "finishes them, and meanwhile each holds its locks and blocks VACUUM"
    ), warning["message"]
    assert warning["fix"] == (
        f"sqlsink recover --url '{pg_url}' --sink-id {sink}  (commits them if the load's "
        "batch was decided, else rolls them back: then run the load again)"
    )

    done = sqlsink("recover", "--url", pg_url, "--sink-id", sink, "--json")
    assert done.code == 0, done.out + done.err
    assert done.actions()[left.gid] == ("rollback", True)
    assert prepared_of(pg_url, sink) == [] and ids_of(pg_url, keyed) == []
    again = sqlsink("status", "--url", pg_url, "--json")
    assert [w for w in again.json["warnings"] if w["sink_id"] == sink] == []
