"""A sink with nothing but its registration (no decision, nothing prepared, no run live,
no session): e.g. a one-off batch load (no sinkId) whose job failed before its decision.
Its tasks registered the run, the abort rolled back what they prepared, and nothing will
ever come of the sink id. ``sqlsink status`` does not list it among the sinks; it counts
such sinks in a line of their own, with their ids and the command that removes them
(issue 30 item 4)."""

from __future__ import annotations

import time
import uuid

from tests.fix_pg import forget_sink
from tests.pg.protocol import Writer, prepared_of
from tests.pg.test_cli import sqlsink


def test_a_failed_one_off_loads_empty_sink_is_not_listed_as_a_sink(
    pg_url: str, keyed: str, sink: str
) -> None:
    run = uuid.uuid4().hex
    load_sink = f"load-{run[:16]}"  # as format('sqlsink') names a load without sinkId
    try:
        load = Writer(pg_url, keyed, load_sink, query_id=None, run=run, extra={"runTimeout": "1s"})
        outcome = load.write(0, range(5))  # a task registers the run and prepares
        load.abort(0, [outcome])  # the job failed: Spark's abort, before any decision
        assert prepared_of(pg_url, load_sink) == []
        Writer(pg_url, keyed, sink, query_id="q").batch(0, range(10, 15))  # a sink that wrote
        time.sleep(1.2)  # the load's run is no longer live (runTimeout 1s)

        shown = sqlsink("status", "--url", pg_url)
        assert shown.code in (0, 1), shown.out + shown.err
        lines = shown.out.splitlines()
        assert any(line.split()[:1] == [sink] for line in lines), shown.out  # a sink's row
        assert not any(line.split()[:1] == [load_sink] for line in lines), shown.out
        (never,) = [line for line in lines if line.startswith("registered, never wrote: ")]
        assert load_sink in never, never
        assert f"sqlsink forget --url '{pg_url}' --sink-id <id> removes them" in never, never
        assert sink not in never, never

        doc = sqlsink("status", "--url", pg_url, "--json").json
        flags = {s["sink_id"]: s["never_wrote"] for s in doc["sinks"]}
        assert (flags[load_sink], flags[sink]) == (True, False)

        # with --sink-id it is shown in full, as any sink
        alone = sqlsink("status", "--url", pg_url, "--sink-id", load_sink)
        assert alone.code == 0, alone.out + alone.err
        assert f"sink {load_sink}  (not bound to a query)" in alone.out, alone.out

        # the command the line gives removes it
        gone = sqlsink("forget", "--url", pg_url, "--sink-id", load_sink)
        assert gone.code == 0, gone.out + gone.err
        after = sqlsink("status", "--url", pg_url, "--json").json
        assert load_sink not in {s["sink_id"] for s in after["sinks"]}
    finally:
        forget_sink(pg_url, load_sink)
