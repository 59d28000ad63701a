"""The runs registry on MariaDB (postgres/run_registry.py's meaning, invariant 10):
registration with fencing, liveness, the abort, the operator's fence, driver tokens.

Liveness differs in one point: PostgreSQL also hears from a run when one of its
transactions prepares (pg_prepared_xacts.prepared); XA RECOVER gives no time, so here a
run is heard from when it registers only."""

from __future__ import annotations

from collections.abc import Callable, Collection

from sqlsink.core.model import Binding
from sqlsink.mariadb.commit_log import binding_of
from sqlsink.mariadb.connection import Connection, execute, rows


def register_run(
    conn: Connection,
    db: str,
    sink_id: str,
    run_id: str,
    live_for_s: float,
    *,
    holds_lock: bool,
    admit: Callable[[Binding | None, int | None], None] | None = None,
    token: str | None = None,
) -> str | None:
    """Record the run; the run that fenced it, if it is fenced. One transaction, with the
    sink's row locked first (one registration of a sink at a time); ``admit`` runs under
    that lock and, when it raises, nothing is recorded."""
    # the sink's row first, in a statement of its own: inside the transaction, INSERT
    # IGNORE leaves a shared lock on the (duplicate) row, and two registrations holding
    # it both wait for FOR UPDATE's exclusive lock: a deadlock (1213) whenever two
    # partitions of a batch register at once (tests/mariadb/test_registration_race.py).
    # A row left by a registration that admit then refuses is an unbound sink's row, as
    # between any registration and its bind.
    execute(conn, f"INSERT IGNORE INTO `{db}`.sinks (sink_id) VALUES (%s)", (sink_id,))
    execute(conn, "BEGIN")
    try:
        locked = rows(
            conn,
            f"SELECT writer, query_id FROM `{db}`.sinks WHERE sink_id = %s FOR UPDATE",
            (sink_id,),
        )
        writer, query_id = locked[0]
        # a plain (consistent) read, in a statement of its own: inside FOR UPDATE, the
        # subquery would lock the decisions too, and wait for a decision being written
        # by a driver paused inside its transaction (tests/chaos/test_mariadb_paused_decision.py)
        highest = rows(
            conn, f"SELECT max(batch_id) FROM `{db}`.decisions WHERE sink_id = %s", (sink_id,)
        )[0][0]
        if admit is not None:
            admit(binding_of(writer, query_id), None if highest is None else int(highest))
        fenced = _register(conn, db, sink_id, run_id, live_for_s, holds_lock, token)
        execute(conn, "COMMIT")
    except BaseException:
        if conn.open:
            execute(conn, "ROLLBACK")
        raise
    return fenced


def _register(
    conn: Connection,
    db: str,
    sink_id: str,
    run_id: str,
    live_for_s: float,
    holds_lock: bool,
    token: str | None,
) -> str | None:
    known = rows(
        conn,
        f"SELECT coalesce(superseded_by, CASE WHEN superseded_at IS NOT NULL "
        f"THEN 'operator' END) FROM `{db}`.runs WHERE sink_id = %s AND run_id = %s",
        (sink_id, run_id),
    )
    if known and known[0][0] is not None:
        return str(known[0][0])
    if not known:
        execute(
            conn,
            f"UPDATE `{db}`.runs SET superseded_at = current_timestamp(6), superseded_by = %s "
            "WHERE sink_id = %s AND superseded_at IS NULL",
            (run_id, sink_id),
        )
        execute(
            conn,
            f"INSERT INTO `{db}`.runs (sink_id, run_id, live_for_s, writer_token) "
            "VALUES (%s, %s, %s, %s)",
            (sink_id, run_id, live_for_s, token),
        )
        execute(
            conn, f"UPDATE `{db}`.sinks SET newest_run = %s WHERE sink_id = %s", (run_id, sink_id)
        )
    elif token is not None:
        execute(
            conn,
            f"UPDATE `{db}`.runs SET writer_token = %s "
            "WHERE sink_id = %s AND run_id = %s AND writer_token IS NULL",
            (token, sink_id, run_id),
        )
    if holds_lock:
        execute(
            conn,
            f"UPDATE `{db}`.runs SET heartbeat_at = current_timestamp(6), live_for_s = %s, "
            "lock_conn = CONNECTION_ID() WHERE sink_id = %s AND run_id = %s",
            (live_for_s, sink_id, run_id),
        )
    elif known:
        execute(
            conn,
            f"UPDATE `{db}`.runs SET heartbeat_at = current_timestamp(6), live_for_s = %s "
            "WHERE sink_id = %s AND run_id = %s "
            "AND heartbeat_at < current_timestamp(6) - INTERVAL 1 SECOND",
            (live_for_s, sink_id, run_id),
        )
    return None


def run_of_token(conn: Connection, db: str, sink_id: str, token: str) -> str | None:
    found = rows(
        conn,
        f"SELECT run_id FROM `{db}`.runs WHERE sink_id = %s AND writer_token = %s "
        "ORDER BY first_seen DESC LIMIT 1",
        (sink_id, token),
    )
    return None if not found else str(found[0][0])


def mark_aborted(conn: Connection, db: str, sink_id: str, run_id: str, batch_id: int) -> None:
    execute(
        conn,
        f"UPDATE `{db}`.runs SET aborted_batch = greatest(coalesce(aborted_batch, %s), %s) "
        "WHERE sink_id = %s AND run_id = %s",
        (batch_id, batch_id, sink_id, run_id),
    )


# A run is live while neither fenced nor over (a batch of it aborted) and heard from
# within its timeout: its runTimeout, or three times the longest of the gaps between its
# four newest decisions when that is longer (postgres/run_registry.py's RUNS_SQL).
RUNS_SQL = """
SELECT r.sink_id, r.run_id,
       timestampdiff(microsecond, r.heartbeat_at, current_timestamp(6)) / 1e6 AS age,
       greatest(r.live_for_s, 3 * coalesce(g.batch_interval, 0)) AS timeout,
       r.superseded_at IS NULL AND r.aborted_batch IS NULL
       AND timestampdiff(microsecond, r.heartbeat_at, current_timestamp(6)) / 1e6
           < greatest(r.live_for_s, 3 * coalesce(g.batch_interval, 0)) AS live,
       g.batch_interval
FROM {L}.runs r
LEFT JOIN (
    SELECT sink_id, run_id, max(gap) AS batch_interval FROM (
        SELECT sink_id, run_id,
               timestampdiff(microsecond,
                   lag(decided_at) OVER (PARTITION BY sink_id, run_id ORDER BY batch_id),
                   decided_at) / 1e6 AS gap,
               row_number() OVER (PARTITION BY sink_id, run_id ORDER BY batch_id DESC) AS newest
        FROM {L}.decisions WHERE (%(sink)s IS NULL OR sink_id = %(sink)s)
    ) AS gaps WHERE newest <= 3 GROUP BY sink_id, run_id
) AS g ON g.sink_id = r.sink_id AND g.run_id = r.run_id
WHERE (%(sink)s IS NULL OR r.sink_id = %(sink)s)
"""


def runs_sql(db: str) -> str:
    return RUNS_SQL.replace("{L}", f"`{db}`")


def live_runs(conn: Connection, db: str, sink_id: str | None) -> dict[tuple[str, str], float]:
    found = rows(conn, f"SELECT * FROM ({runs_sql(db)}) AS runs WHERE live", {"sink": sink_id})
    return {(str(r[0]), str(r[1])): float(r[2]) for r in found}


def fence_runs(conn: Connection, db: str, sink_id: str, run_ids: Collection[str]) -> list[str]:
    """Superseded by 'operator', durably; the runs this call fenced."""
    wanted = sorted(set(run_ids))
    if not wanted:
        return []
    marks = ", ".join(["%s"] * len(wanted))
    execute(conn, "BEGIN")
    try:
        rows(conn, f"SELECT 1 FROM `{db}`.sinks WHERE sink_id = %s FOR UPDATE", (sink_id,))
        found = rows(
            conn,
            f"SELECT run_id FROM `{db}`.runs WHERE sink_id = %s AND run_id IN ({marks}) "
            "AND superseded_at IS NULL FOR UPDATE",
            (sink_id, *wanted),
        )
        execute(
            conn,
            f"UPDATE `{db}`.runs SET superseded_at = current_timestamp(6), "
            f"superseded_by = 'operator' WHERE sink_id = %s AND run_id IN ({marks}) "
            "AND superseded_at IS NULL",
            (sink_id, *wanted),
        )
        execute(conn, "COMMIT")
    except BaseException:
        if conn.open:
            execute(conn, "ROLLBACK")
        raise
    return sorted(str(r[0]) for r in found)


END_ERROR_MAX = 2000  # the recorded error's first characters


def record_end(
    conn: Connection, db: str, sink_id: str, run_id: str, how: str, error: str | None
) -> bool:
    """Record that the run ended (``how``: 'stopped' or 'failed', ``error`` its first line,
    already scrubbed); the first record stands. One statement on the run's row, bounded by
    the session's innodb_lock_wait_timeout. False when nothing was recorded: no such run,
    or already ended. Informational: a run's liveness does not read it."""
    changed = execute(
        conn,
        f"UPDATE `{db}`.runs SET ended_at = current_timestamp(6), ended_how = %s, "
        "ended_error = %s WHERE sink_id = %s AND run_id = %s AND ended_at IS NULL",
        (how, None if error is None else error[:END_ERROR_MAX], sink_id, run_id),
    )
    return changed > 0
