"""What leaves the commit log on MariaDB: retention, forgetting a retired sink, and the
checkpoint check's rows (postgres/retention.py and checkpoint_records.py's meaning)."""

from __future__ import annotations

import json
from collections.abc import Collection

from sqlsink.core.checkpoint_check import LogCoverage, RunCheck, Verdict
from sqlsink.errors import ConfigError
from sqlsink.mariadb.connection import Connection, execute, rows
from sqlsink.mariadb.run_registry import runs_sql


def prune_decisions(conn: Connection, db: str, sink_id: str, through: int) -> int:
    """Complete decisions up to ``through`` go, and ``pruned_through`` says so."""
    execute(conn, "BEGIN")
    try:
        found = rows(
            conn,
            f"SELECT max(batch_id) FROM `{db}`.decisions WHERE sink_id = %s "
            "AND batch_id <= %s AND completed_at IS NOT NULL",
            (sink_id, through),
        )
        deleted = execute(
            conn,
            f"DELETE FROM `{db}`.decisions WHERE sink_id = %s AND batch_id <= %s "
            "AND completed_at IS NOT NULL",
            (sink_id, through),
        )
        if deleted and found[0][0] is not None:
            execute(
                conn,
                f"UPDATE `{db}`.sinks SET pruned_through = "
                "greatest(coalesce(pruned_through, %s), %s) WHERE sink_id = %s",
                (found[0][0], found[0][0], sink_id),
            )
        execute(conn, "COMMIT")
    except BaseException:
        if conn.open:
            execute(conn, "ROLLBACK")
        raise
    return deleted


def forget_sink(conn: Connection, db: str, sink_id: str, prepared: list[str]) -> int:
    """Remove a finished sink's log (the caller holds the sink lock; ``prepared``: the
    sink's branches, from XA RECOVER); refused while anything of it is unfinished.
    Returns how many decisions went."""
    incomplete = [
        int(r[0])
        for r in rows(
            conn,
            f"SELECT batch_id FROM `{db}`.decisions WHERE sink_id = %s "
            "AND completed_at IS NULL ORDER BY 1",
            (sink_id,),
        )
    ]
    live = [
        str(r[1])
        for r in rows(conn, f"SELECT * FROM ({runs_sql(db)}) AS runs WHERE live", {"sink": sink_id})
    ]
    if prepared or incomplete or live:
        parts = []
        if prepared:
            parts.append(f"{len(prepared)} prepared branch(es) ({', '.join(prepared[:3])})")
        if incomplete:
            parts.append(f"incomplete batch(es) {', '.join(map(str, incomplete[:10]))}")
        if live:
            parts.append(f"a live run ({', '.join(live)})")
        raise ConfigError(
            f"sink {sink_id} is not finished: it has {'; '.join(parts)}. Forgetting it now "
            "would lose what its log is there to complete. Nothing was removed. Fix: run "
            f"sqlsink recover --sink-id {sink_id} first (and stop the query if it runs), "
            "then sqlsink forget again",
            sink_id=sink_id,
        )
    execute(conn, "BEGIN")
    try:
        execute(conn, "SET @sqlsink_forget = %s", (sink_id,))
        deleted = 0
        for table in ("handovers", "decisions", "runs", "sinks"):
            count = execute(conn, f"DELETE FROM `{db}`.{table} WHERE sink_id = %s", (sink_id,))
            deleted = count if table == "decisions" else deleted
        _delete_markers(conn, db, sink_id)
        execute(conn, "COMMIT")
    except BaseException:
        if conn.open:
            execute(conn, "ROLLBACK")
        raise
    finally:
        if conn.open:
            execute(conn, "SET @sqlsink_forget = NULL")
    return deleted


def _delete_markers(conn: Connection, db: str, sink_id: str) -> None:
    """The sink's markers by their primary key: a ``DELETE ... WHERE sink_id`` may scan
    (the optimizer's choice on a small table) and wait on the marker rows another sink's
    prepared branches hold locked, for as long as those stay prepared. The read takes no
    lock (READ COMMITTED); no marker of this sink comes meanwhile (the caller holds the
    sink lock and refused a live run or a prepared branch)."""
    gids = [
        str(r[0])
        for r in rows(conn, f"SELECT gid FROM `{db}`.markers WHERE sink_id = %s", (sink_id,))
    ]
    for start in range(0, len(gids), 500):
        chunk = gids[start : start + 500]
        marks = ", ".join(["%s"] * len(chunk))
        execute(conn, f"DELETE FROM `{db}`.markers WHERE gid IN ({marks})", chunk)


def run_check(conn: Connection, db: str, sink_id: str, run_id: str) -> RunCheck:
    found = rows(
        conn,
        f"SELECT coalesce((SELECT checkpoint_checked_at IS NOT NULL FROM `{db}`.runs "
        "                  WHERE sink_id = %(sink)s AND run_id = %(run)s), false), "
        f"       (SELECT max(batch_id) FROM `{db}`.decisions WHERE sink_id = %(sink)s)",
        {"sink": sink_id, "run": run_id},
    )
    checked, highest = found[0]
    return RunCheck(bool(checked), None if highest is None else int(highest))


def coverage(conn: Connection, db: str, sink_id: str, batch_ids: Collection[int]) -> LogCoverage:
    """One snapshot (a consistent read in one transaction), so a pruning cannot fall
    between the lowest kept, ``pruned_through`` and the decided batches."""
    wanted = sorted(set(batch_ids))
    execute(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
    try:
        first, pruned = rows(
            conn,
            f"SELECT (SELECT min(batch_id) FROM `{db}`.decisions WHERE sink_id = %(sink)s), "
            f"       (SELECT pruned_through FROM `{db}`.sinks WHERE sink_id = %(sink)s)",
            {"sink": sink_id},
        )[0]
        decided: list[tuple[object, ...]] = []
        if wanted:
            marks = ", ".join(["%s"] * len(wanted))
            decided = rows(
                conn,
                f"SELECT batch_id FROM `{db}`.decisions WHERE sink_id = %s "
                f"AND batch_id IN ({marks})",
                (sink_id, *wanted),
            )
    finally:
        execute(conn, "COMMIT")
    return LogCoverage(
        None if first is None else int(first),
        None if pruned is None else int(pruned),
        frozenset(int(str(r[0])) for r in decided),
    )


def record_check(
    conn: Connection,
    db: str,
    sink_id: str,
    run_id: str,
    batch_id: int,
    location: str | None,
    verdict: Verdict,
) -> None:
    execute(
        conn,
        f"UPDATE `{db}`.runs SET checkpoint_verdict = %s, checkpoint_detail = %s, "
        "checkpoint_lost = %s, checkpoint_location = %s, checkpoint_batch = %s, "
        "checkpoint_checked_at = current_timestamp(6) WHERE sink_id = %s AND run_id = %s",
        (
            verdict.kind, verdict.detail, json.dumps(list(verdict.lost)), location, batch_id,
            sink_id, run_id,
        ),
    )  # fmt: skip
