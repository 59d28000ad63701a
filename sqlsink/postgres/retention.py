"""What leaves the commit log: retention and forgetting a retired sink.

Retention (docs/DESIGN.md 4.2) prunes complete decisions below the newest ones;
``sqlsink forget`` removes a finished sink's whole log. Neither ever erases an
incomplete decision (invariant 8): it is what the log is there to finish.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlsink.core.admin import Forgotten
from sqlsink.core.gid import Gid
from sqlsink.errors import ConfigError
from sqlsink.postgres import commit_log
from sqlsink.postgres.commit_log import like_prefix
from sqlsink.postgres.connection import Connection
from sqlsink.postgres.run_registry import RUNS_SQL


def prune_decisions(conn: Connection, sink_id: str, through: int) -> int:
    """Retention (docs/DESIGN.md 4.2): complete decisions up to ``through`` go, and
    ``sinks.pruned_through`` says so; an incomplete decision is never pruned."""
    with conn.transaction():
        row = conn.execute(
            "WITH gone AS (DELETE FROM sqlsink.decisions WHERE sink_id = %(sink)s "
            "  AND batch_id <= %(through)s AND completed_at IS NOT NULL RETURNING batch_id) "
            "SELECT count(*), max(batch_id) FROM gone",
            {"sink": sink_id, "through": through},
        ).fetchone()
        deleted, highest = (0, None) if row is None else (int(row[0]), row[1])
        if highest is not None:
            conn.execute(
                "UPDATE sqlsink.sinks SET pruned_through = greatest(pruned_through, %s) "
                "WHERE sink_id = %s",
                (highest, sink_id),
            )
    return deleted


# -- forgetting a retired sink (invariant 8: no advice may erase an incomplete decision) ---


def forget_sink(conn: Connection, sink_id: str) -> Forgotten:
    """Remove a finished sink's log, in one transaction; the caller holds the sink lock.

    Refused (ConfigError, nothing removed) while the sink has prepared transactions
    in this database, an incomplete decision, or a live run: those are exactly what
    the log is there to finish."""
    prefix = like_prefix(Gid.sink_prefix(sink_id))
    with conn.transaction():
        row = conn.execute(
            "SELECT ARRAY(SELECT gid FROM pg_prepared_xacts "
            "             WHERE gid LIKE %(prefix)s AND database = current_database()), "
            "       ARRAY(SELECT batch_id FROM sqlsink.decisions "
            "             WHERE sink_id = %(sink)s AND completed_at IS NULL ORDER BY 1), "
            f"       ARRAY(SELECT run_id FROM ({RUNS_SQL}) AS runs WHERE live), "
            "       (SELECT count(*) FROM sqlsink.decisions WHERE sink_id = %(sink)s), "
            "       (SELECT min(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s), "
            "       (SELECT max(batch_id) FROM sqlsink.decisions WHERE sink_id = %(sink)s), "
            "       (SELECT writer FROM sqlsink.sinks WHERE sink_id = %(sink)s), "
            f"       (SELECT max(heartbeat_at + timeout * interval '1 second') FROM ({RUNS_SQL}) "
            "        AS runs WHERE live), "
            "       EXISTS (SELECT 1 FROM sqlsink.sinks WHERE sink_id = %(sink)s) "
            "       OR EXISTS (SELECT 1 FROM sqlsink.runs WHERE sink_id = %(sink)s), "
            "       ARRAY(SELECT sink_id FROM sqlsink.sinks ORDER BY 1 LIMIT 20)",
            {"prefix": prefix, "sink": sink_id},
        ).fetchone()
        assert row is not None
        prepared = [g for g in row[0] if Gid.parse(str(g)) is not None]
        incomplete, live = list(row[1]), list(row[2])
        writer, live_until = row[6], row[7]
        if prepared or incomplete or live:
            load = writer == "load"
            refusal = _refusal(sink_id, prepared, incomplete, live, load=load, until=live_until)
            raise ConfigError(refusal, sink_id=sink_id)
        known = bool(row[8]) or int(row[3]) > 0
        if not known:
            return Forgotten(0, None, None, known=False, others=tuple(map(str, row[9])))
        conn.execute("SELECT set_config('sqlsink.forget', %s, true)", (sink_id,))
        for table in commit_log.sink_tables(conn):
            conn.execute(f"DELETE FROM sqlsink.{table} WHERE sink_id = %s", (sink_id,))
        return Forgotten(int(row[3]), row[4], row[5], None if writer is None else str(writer))


def _refusal(
    sink_id: str,
    prepared: list[str],
    incomplete: list[int],
    live: list[str],
    *,
    load: bool = False,
    until: datetime | None = None,
) -> str:
    """``load``: the sink is bound to a named batch load, which has no query to stop: its
    run is live until its runTimeout passes after it was last heard from (``until``)."""
    parts = []
    if prepared:
        parts.append(f"{len(prepared)} prepared transaction(s) ({', '.join(prepared[:3])})")
    if incomplete:
        parts.append(f"incomplete batch(es) {', '.join(map(str, incomplete[:10]))}")
    when = "" if until is None else f"{until.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    if live and load:
        parts.append(
            f"a live run ({', '.join(live)}): a named load's run is considered live until "
            "its runTimeout has passed since it was last heard from, even once the load "
            f"has finished{f' (here until {when})' if when else ''}"
        )
    elif live:
        parts.append(
            f"a live run ({', '.join(live)}) heard from within its timeout (runTimeout, "
            "or 3 x its batch interval if longer)"
        )
    if live and not (prepared or incomplete):
        fix = (
            f"once the load has finished, wait until {when or 'its runTimeout has passed'} "
            "(sqlsink status shows its run)"
            if load
            else "stop the query first, or wait for its timeout (sqlsink status shows it)"
        )
    else:
        stop = "let the load finish if it runs" if load else "stop the query if it runs"
        fix = f"run sqlsink recover --sink-id {sink_id} first (and {stop})"
    return (
        f"sink {sink_id} is not finished: it has {'; '.join(parts)}. Forgetting it now would "
        f"lose what its log is there to complete. Nothing was removed. Fix: {fix}, then run "
        "sqlsink forget again"
    )
