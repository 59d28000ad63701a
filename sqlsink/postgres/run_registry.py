"""The runs registry (``sqlsink.runs``, invariant 10): who is writing a sink now.

Each run of a sink registers (a fencing token and a heartbeat); a newer run
supersedes the older ones, an operator may fence a run (``sqlsink recover
--force``), and Spark's abort of a batch ends a run. This module owns those
statements and the one query that judges a run live or dead (``RUNS_SQL``), so that
recovery, forget and the CLI judge alike.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import psycopg

from sqlsink.core.admin import RunEnd, RunInfo
from sqlsink.core.model import Binding
from sqlsink.postgres.commit_log import binding_of
from sqlsink.postgres.connection import Connection

_REGISTER = "SELECT sqlsink.register_run(%s, %s, make_interval(secs => %s), %s)"


def register_run(
    conn: Connection,
    sink_id: str,
    run_id: str,
    live_for_s: float,
    *,
    holds_lock: bool,
    admit: Callable[[Binding | None, int | None], None] | None = None,
    token: str | None = None,
) -> str | None:
    """Record the run (fencing token, heartbeat); the run that fenced it, if it is fenced.
    ``admit(binding, highest)`` runs first with the sink's row locked, in the same
    transaction: when it raises, nothing is recorded. ``token``: the driver's, recorded
    once (schema version 7: the caller passes it only from that version on)."""
    args = (sink_id, run_id, live_for_s, holds_lock)
    # Its own transaction does not wait for its WAL flush (docs/DESIGN.md 4.4): WAL is one
    # sequence, so the first later commit that is flushed (a decision, a PREPARE, a COMMIT
    # or ROLLBACK PREPARED: all synchronous) flushes the registration before it. A crash
    # can lose only a registration nothing durable has followed: as if the run had not
    # registered this time; it registers again at its next step. Inside a caller's
    # transaction (a savepoint here) that transaction's own commit decides instead.
    own = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with conn.pipeline(), conn.transaction():  # BEGIN .. the select: one round trip
        if own:
            conn.execute("SET LOCAL synchronous_commit = off")
        if admit is not None:
            conn.execute(
                "INSERT INTO sqlsink.sinks (sink_id) VALUES (%s) ON CONFLICT DO NOTHING",
                (sink_id,),
            )
            bound_row = conn.execute(
                "SELECT s.writer, s.query_id, (SELECT max(batch_id) FROM sqlsink.decisions d "
                "                              WHERE d.sink_id = s.sink_id) "
                "FROM sqlsink.sinks s WHERE s.sink_id = %s FOR NO KEY UPDATE",
                (sink_id,),
            ).fetchone()
            assert bound_row is not None
            writer, query_id, highest = bound_row
            admit(binding_of(writer, query_id), None if highest is None else int(highest))
        row = conn.execute(_REGISTER, args).fetchone()
        _record_token(conn, sink_id, run_id, token, row)
    return None if row is None or row[0] is None else str(row[0])


def _record_token(
    conn: Connection, sink_id: str, run_id: str, token: str | None, row: tuple[object, ...] | None
) -> None:
    if token is None or (row is not None and row[0] is not None):  # none, or fenced
        return
    conn.execute(
        "UPDATE sqlsink.runs SET writer_token = %s "
        "WHERE sink_id = %s AND run_id = %s AND writer_token IS NULL",
        (token, sink_id, run_id),
    )


def run_of_token(conn: Connection, sink_id: str, token: str) -> str | None:
    """The newest run whose tasks registered with this driver token (None before
    version 7)."""
    if not has_writer_tokens(conn):
        return None
    row = conn.execute(
        "SELECT run_id FROM sqlsink.runs WHERE sink_id = %s AND writer_token = %s "
        "ORDER BY first_seen DESC LIMIT 1",
        (sink_id, token),
    ).fetchone()
    return None if row is None else str(row[0])


def has_writer_tokens(conn: Connection) -> bool:
    """Whether the commit log records driver tokens (version 7; an upgrade to it can be
    deferred while prepared leftovers hold sqlsink.markers, postgres/schema.py)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('sqlsink.runs') "
        "AND attname = 'writer_token' AND NOT attisdropped)"
    ).fetchone()
    return bool(row and row[0])


def mark_aborted(conn: Connection, sink_id: str, run_id: str, batch_id: int) -> None:
    """Spark aborted this run's batch: a task of it that prepares later rolls itself back."""
    conn.execute(
        "UPDATE sqlsink.runs SET aborted_batch = greatest(aborted_batch, %s) "
        "WHERE sink_id = %s AND run_id = %s",
        (batch_id, sink_id, run_id),
    )


# A run is live while it is neither fenced nor over (Spark aborted one of its batches:
# it aborts only when the query or the load fails or stops) and it was heard from within
# its timeout: the runTimeout it registered with, or three times its recent batch interval
# (the longest of the last three gaps between its decisions) when that is longer. The
# data source never learns the trigger; this is what the trigger shows. It is heard from
# when it registers (a task's start, a commit, the foreachBatch writer's heartbeat) and
# when a transaction of it prepares within its runTimeout (pg_prepared_xacts.prepared, on
# the server's clock): a task that writes for longer than runTimeout is heard from again
# when it prepares (docs/DESIGN.md invariant 10). A gid's fields are split on '_', which
# neither a sink id nor a run id holds (core/gid.py); its shape is checked as Gid.parse
# does, so that a foreign transaction named alike counts for no run. One statement, so
# that recovery, forget and the CLI judge alike. The batch intervals come from one pass
# over the decisions (the sink's, which retention bounds), not one per row of
# sqlsink.runs, which is never pruned: a run's last three gaps are those between its
# four newest decisions.
_ID = "[A-Za-z0-9][A-Za-z0-9-]{0,63}"  # a sink id, a run id
_NUMBER = "(0|[1-9][0-9]{0,18})"
_GID_SHAPE = f"^sqlsink_{_ID}_{_NUMBER}_{_NUMBER}_{_ID}_{_NUMBER}(_p[1-9][0-9]{{0,2}})?$"
RUNS_SQL = f"""
SELECT r.sink_id, r.run_id, r.first_seen, h.heard_at AS heartbeat_at,
       extract(epoch FROM clock_timestamp() - h.heard_at)::float8 AS age,
       extract(epoch FROM r.live_for)::float8 AS run_timeout,
       extract(epoch FROM g.batch_interval)::float8 AS batch_interval,
       extract(epoch FROM t.timeout)::float8 AS timeout,
       r.superseded_at, r.superseded_by, r.aborted_batch,
       (r.superseded_at IS NULL AND r.aborted_batch IS NULL
        AND h.heard_at > clock_timestamp() - t.timeout) AS live
FROM sqlsink.runs r
LEFT JOIN (
    SELECT sink_id, run_id, max(gap) AS batch_interval FROM (
        SELECT d.sink_id, d.run_id,
               d.decided_at - lag(d.decided_at) OVER (of_run ORDER BY d.batch_id) AS gap,
               row_number() OVER (of_run ORDER BY d.batch_id DESC) AS newest
        FROM sqlsink.decisions d
        WHERE (%(sink)s::text IS NULL OR d.sink_id = %(sink)s::text)
        WINDOW of_run AS (PARTITION BY d.sink_id, d.run_id)
    ) AS gaps
    WHERE newest <= 3
    GROUP BY 1, 2
) AS g ON g.sink_id = r.sink_id AND g.run_id = r.run_id
CROSS JOIN LATERAL (SELECT greatest(r.live_for, 3 * g.batch_interval) AS timeout) AS t
LEFT JOIN (
    SELECT split_part(gid, '_', 2) AS sink_id, split_part(gid, '_', 5) AS run_id,
           max(prepared) AS prepared_at
    FROM pg_prepared_xacts
    WHERE database = current_database()
      AND gid ~ '{_GID_SHAPE}'
    GROUP BY 1, 2
) AS p ON p.sink_id = r.sink_id AND p.run_id = r.run_id
CROSS JOIN LATERAL (
    SELECT CASE WHEN p.prepared_at > clock_timestamp() - r.live_for
                THEN greatest(r.heartbeat_at, p.prepared_at)
                ELSE r.heartbeat_at END AS heard_at
) AS h
WHERE (%(sink)s::text IS NULL OR r.sink_id = %(sink)s::text)
"""


def runs(conn: Connection, sink_id: str | None) -> list[RunInfo]:
    """Every run of the sink (of every sink for None), the most recently seen first."""
    rows = conn.execute(
        f"{RUNS_SQL} ORDER BY r.sink_id, r.first_seen DESC, r.run_id", {"sink": sink_id}
    ).fetchall()
    return [
        RunInfo(
            str(s), str(r), first, beat, float(age), float(run_timeout),
            None if interval is None else float(interval), float(timeout), sup,
            None if by is None else str(by), None if aborted is None else int(aborted), bool(live),
        )
        for s, r, first, beat, age, run_timeout, interval, timeout, sup, by, aborted, live in rows
    ]  # fmt: skip


def live_runs(conn: Connection, sink_id: str | None) -> dict[tuple[str, str], float]:
    """(sink, run) -> heartbeat age in seconds, for the live runs (``RUNS_SQL``)."""
    rows = conn.execute(
        f"SELECT sink_id, run_id, age FROM ({RUNS_SQL}) AS runs WHERE live", {"sink": sink_id}
    ).fetchall()
    return {(str(s), str(r)): float(age) for s, r, age in rows}


def fence_runs(conn: Connection, sink_id: str, run_ids: Collection[str]) -> list[str]:
    """Declare runs dead (``sqlsink recover --force``): superseded by 'operator', durably,
    so that they never decide, commit or resolve again (``register_run`` tells them so,
    and their late tasks roll back). Returns the runs this call fenced; one already
    superseded keeps its fencer."""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        # one at a time with register_run, which locks the same row
        conn.execute("SELECT 1 FROM sqlsink.sinks WHERE sink_id = %s FOR UPDATE", (sink_id,))
        rows = conn.execute(
            "UPDATE sqlsink.runs SET superseded_at = clock_timestamp(), "
            "superseded_by = 'operator' "
            "WHERE sink_id = %s AND run_id = ANY(%s) AND superseded_at IS NULL "
            "RETURNING run_id",
            (sink_id, list(run_ids)),
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


# -- a run's end, as its driver said it (schema version 10) --------------------------------

END_ERROR_MAX = 300  # characters of the error's first line kept
END_TIMEOUT = "5s"  # statement_timeout and lock_timeout of the end's statement


def has_run_ends(conn: Connection) -> bool:
    """Whether the commit log records runs' ends (version 10)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('sqlsink.runs') "
        "AND attname = 'ended_at' AND NOT attisdropped)"
    ).fetchone()
    return bool(row and row[0])


def record_end(conn: Connection, sink_id: str, run_id: str, how: str, error: str | None) -> bool:
    """Record that the run ended (``how``: 'stopped' or 'failed', ``error`` its first line,
    already scrubbed); the first record stands. One short statement, bounded by
    ``END_TIMEOUT``; it takes the run's row only (never the sink's, which registration
    locks first). False when nothing was recorded: no such run (its query stopped before
    any task registered it), already ended, or the commit log is older than version 10.
    Informational: a run's liveness (``RUNS_SQL``) does not read it."""
    if not has_run_ends(conn):
        return False
    with conn.transaction():
        conn.execute("SELECT set_config('statement_timeout', %s, true)", (END_TIMEOUT,))
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (END_TIMEOUT,))
        row = conn.execute(
            "UPDATE sqlsink.runs SET ended_at = clock_timestamp(), ended_how = %s, "
            "ended_error = %s WHERE sink_id = %s AND run_id = %s AND ended_at IS NULL "
            "RETURNING run_id",
            (how, None if error is None else error[:END_ERROR_MAX], sink_id, run_id),
        ).fetchone()
    return row is not None


def run_ends(conn: Connection, sink_id: str) -> dict[str, RunEnd]:
    """The recorded ends of the sink's runs, by run id ({} before version 10)."""
    if not has_run_ends(conn):
        return {}
    rows = conn.execute(
        "SELECT run_id, ended_at, ended_how, ended_error FROM sqlsink.runs "
        "WHERE sink_id = %s AND ended_at IS NOT NULL",
        (sink_id,),
    ).fetchall()
    return {
        str(r): RunEnd(str(r), at, str(how), None if err is None else str(err))
        for r, at, how, err in rows
    }
