"""The operator commands' reads on MariaDB (postgres/survey/'s meaning): who the session
is, the commit log's sinks and decisions, the server's prepared XA branches, the runs as
the registry judges them (``run_registry.RUNS_SQL``), the sink's sessions. Nothing here
writes. Every function takes an autocommit session and the commit log's database.

Where MariaDB shows less than PostgreSQL:
- XA RECOVER gives no database, owner or time: a branch is reported in the commit log's
  database, owned by the session's user, prepared at the server's "now" (its age is
  unknown, so no branch is ever "old"; a branch whose run is not live is still told).
- A session has no application name: the sink's sessions are those its commit log names,
  the partition tasks connected (``task_sessions``, joined to the process list) and the
  holder of the sink lock (``IS_USED_LOCK``), named here as PostgreSQL's sessions are.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlsink.core.admin import (
    BatchSummary,
    CheckpointCheckRow,
    DecisionRow,
    RoleInfo,
    RunEnd,
    RunInfo,
    Session,
    SinkRow,
)
from sqlsink.core.gid import Gid
from sqlsink.core.model import BatchFigures, PreparedTransaction
from sqlsink.mariadb import locks, schema, xid
from sqlsink.mariadb.commit_log import utc
from sqlsink.mariadb.connection import Connection, errno, rows
from sqlsink.mariadb.run_registry import runs_sql


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _json(value: Any) -> Any:
    return None if value is None else json.loads(value)


def _at(value: Any) -> datetime:
    at = utc(value)
    assert at is not None
    return at


# -- who ------------------------------------------------------------------------------------


def version_num(version: str) -> int:
    """'10.11.6-MariaDB-log' -> 101106 (major * 10000 + minor * 100 + patch)."""
    numbers = version.split("-", 1)[0].split(".")
    try:
        major, minor, patch = (int(n) for n in ([*numbers, "0", "0"])[:3])
    except ValueError:
        return 0
    return major * 10000 + minor * 100 + patch


def role_info(conn: Connection, log_database: str) -> RoleInfo:
    """The user (CURRENT_USER(), without its host), whether it has SUPER (or MariaDB's
    finer-grained administration), the commit log's database, the server's version."""
    user, version = rows(conn, "SELECT CURRENT_USER(), VERSION()")[0]
    name, _, host = str(user).rpartition("@")
    grantee = f"'{name}'@'{host}'"
    found = rows(
        conn,
        "SELECT count(*) FROM information_schema.USER_PRIVILEGES "
        "WHERE GRANTEE = %s AND PRIVILEGE_TYPE = 'SUPER'",
        (grantee,),
    )
    return RoleInfo(name, bool(found[0][0]), log_database, str(version), version_num(str(version)))


def is_mariadb(conn: Connection) -> bool:
    return "mariadb" in str(rows(conn, "SELECT VERSION()")[0][0]).lower()


def server_now(conn: Connection) -> datetime:
    return _at(rows(conn, "SELECT UTC_TIMESTAMP(6)")[0][0])


def schema_version(conn: Connection, db: str) -> int:
    return schema.version(conn, db) or 0


# -- the commit log -------------------------------------------------------------------------


def sinks(conn: Connection, db: str) -> dict[str, SinkRow]:
    found = rows(
        conn, f"SELECT sink_id, query_id, created_at, bound_at FROM `{db}`.sinks ORDER BY 1"
    )
    return {
        str(s): SinkRow(str(s), None if q is None else str(q), _at(c), _at(b))
        for s, q, c, b in found
    }


def sink_tables(conn: Connection, db: str, sink_id: str) -> list[str]:
    found = rows(
        conn,
        f"SELECT tables FROM `{db}`.decisions WHERE sink_id = %s AND tables IS NOT NULL "
        "ORDER BY batch_id DESC LIMIT 1",
        (sink_id,),
    )
    return [] if not found else [str(t) for t in _json(found[0][0]) or []]


def batch_summary(conn: Connection, db: str, sink_id: str) -> BatchSummary:
    count, first, last, last_complete, incomplete = rows(
        conn,
        "SELECT count(*), min(batch_id), max(batch_id), "
        "max(CASE WHEN completed_at IS NOT NULL THEN batch_id END), "
        f"coalesce(sum(completed_at IS NULL), 0) FROM `{db}`.decisions WHERE sink_id = %s",
        (sink_id,),
    )[0]
    return BatchSummary(int(count), _int(first), _int(last), _int(last_complete), int(incomplete))


_DECISION_COLUMNS = (
    "sink_id, batch_id, gids, row_count, decided_at, completed_at, query_id, run_id, "
    "first_write_at, commit_ms, orphans, figures"
)


def _decision(row: tuple[Any, ...]) -> DecisionRow:
    s, b, gids, count, decided_at, completed_at, query, run = row[:8]
    first_write_at, commit_ms, orphans, figures = row[8:]
    listed = _json(gids)
    return DecisionRow(
        str(s), int(b), tuple(str(g) for g in listed) if isinstance(listed, list) else (),
        int(count), _at(decided_at), utc(completed_at),
        None if query is None else str(query), None if run is None else str(run),
        utc(first_write_at), None if commit_ms is None else float(commit_ms), _int(orphans),
        BatchFigures.from_json(_json(figures)),
    )  # fmt: skip


def recent_decisions(conn: Connection, db: str, sink_id: str, limit: int) -> list[DecisionRow]:
    found = rows(
        conn,
        f"SELECT {_DECISION_COLUMNS} FROM `{db}`.decisions WHERE sink_id = %s "
        "ORDER BY batch_id DESC LIMIT %s",
        (sink_id, limit),
    )
    return [_decision(r) for r in found]


def decisions_from(
    conn: Connection, db: str, sink_id: str, first_batch: int
) -> dict[int, DecisionRow]:
    found = rows(
        conn,
        f"SELECT {_DECISION_COLUMNS} FROM `{db}`.decisions WHERE sink_id = %s "
        "AND batch_id >= %s ORDER BY batch_id",
        (sink_id, first_batch),
    )
    return {d.batch_id: d for d in map(_decision, found)}


def incomplete_decisions(conn: Connection, db: str, sink_id: str | None) -> list[DecisionRow]:
    found = rows(
        conn,
        f"SELECT {_DECISION_COLUMNS} FROM `{db}`.decisions WHERE completed_at IS NULL "
        "AND (%s IS NULL OR sink_id = %s) ORDER BY sink_id, batch_id",
        (sink_id, sink_id),
    )
    return [_decision(r) for r in found]


# -- prepared branches ----------------------------------------------------------------------


def foreign_name(row: tuple[Any, ...]) -> str:
    """A branch that is not the sink's, as XA statements spell its xid."""
    format_id, gtrid_length, _, data = row[:4]
    raw = bytes(data) if isinstance(data, bytes | bytearray) else str(data).encode()
    cut = int(gtrid_length)
    return xid.Xid(int(format_id), raw[:cut], raw[cut:]).sql()


def all_prepared(conn: Connection, db: str, user: str) -> list[PreparedTransaction]:
    """Every prepared XA branch of the server: the sink's by their gid, any other by its
    xid (``X'gtrid',X'bqual',formatID``, which no gid parses as)."""
    now = server_now(conn)
    out = []
    for row in rows(conn, "XA RECOVER"):
        gid = xid.from_recover_row(row)
        name = str(gid) if gid is not None else foreign_name(row)
        out.append(PreparedTransaction(name, db, user, now))
    return sorted(out, key=lambda t: t.gid)


def still_prepared(conn: Connection, gids: Collection[str]) -> set[str]:
    found = {str(g) for r in rows(conn, "XA RECOVER") if (g := xid.from_recover_row(r))}
    return found & set(gids)


def confirm_lost(conn: Connection, db: str, candidates: Collection[str]) -> set[str]:
    """postgres/survey/prepared.py's: read again, prepared first and markers second (a
    gid committed in between shows its marker), then drop the gids of batches completed
    meanwhile (their markers were deleted: they were committed)."""
    from sqlsink.mariadb.commit_log import visible_markers

    if not candidates:
        return set()
    rest = set(candidates) - still_prepared(conn, candidates)
    rest -= visible_markers(conn, db, rest)
    if not rest:
        return set()
    batches = sorted({(g.sink_id, g.batch_id) for t in rest if (g := Gid.parse(t))})
    if not batches:
        return rest
    where = " OR ".join(["(sink_id = %s AND batch_id = %s)"] * len(batches))
    found = rows(
        conn,
        f"SELECT gids FROM `{db}`.decisions WHERE completed_at IS NOT NULL AND ({where})",
        [v for pair in batches for v in pair],
    )
    committed = {str(g) for r in found for g in _json(r[0]) or []}
    return rest - committed


# -- sessions -------------------------------------------------------------------------------


def task_name(sink_id: str, batch_id: int, partition_id: int) -> str:
    """A partition task's session, as PostgreSQL's application_name says it."""
    return f"sqlsink sink {sink_id}, batch {batch_id}, partition {partition_id}"


def committer_name(sink_id: str) -> str:
    return f"sqlsink {sink_id} commit"


def of_sink(name: str, sink_id: str) -> bool:
    return name.startswith(f"sqlsink sink {sink_id}, batch ") or name == committer_name(sink_id)


_PROCESS = "p.ID, p.USER, p.HOST, p.COMMAND, p.TIME"


def _session(name: str, row: tuple[Any, ...]) -> Session:
    pid, user, host, command, _ = row
    client = None if host is None or str(host) == "localhost" else str(host).rsplit(":", 1)[0]
    return Session(
        int(pid), name, None if user is None else str(user), client,
        None if command is None else str(command).lower(), None, None,
    )  # fmt: skip


def sqlsink_sessions(conn: Connection, db: str) -> list[Session]:
    """The sink's connected sessions its commit log names: partition tasks
    (``task_sessions``) and the committers recorded as holding a sink lock (a run's
    ``lock_conn``), but this session."""
    out: list[Session] = []
    try:
        tasks = rows(
            conn,
            f"SELECT t.sink_id, t.batch_id, t.partition_id, {_PROCESS} "
            f"FROM `{db}`.task_sessions t JOIN information_schema.PROCESSLIST p "
            "ON p.ID = t.conn_id WHERE p.ID <> CONNECTION_ID() ORDER BY p.ID",
        )
        committers = rows(
            conn,
            f"SELECT DISTINCT r.sink_id, {_PROCESS} FROM `{db}`.runs r "
            "JOIN information_schema.PROCESSLIST p ON p.ID = r.lock_conn "
            f"WHERE r.superseded_at IS NULL AND {locks.RECORDED_SINCE_START} "
            "AND p.ID <> CONNECTION_ID() ORDER BY p.ID",
            {"uptime": locks.uptime_s(conn)},
        )
    except Exception as exc:
        if errno(exc) in (1146, 1049):  # no commit log (yet): no session of a sink
            return []
        raise
    for sink, batch, partition, *process in tasks:
        out.append(_session(task_name(str(sink), int(batch), int(partition)), tuple(process)))
    for sink, *process in committers:
        out.append(_session(committer_name(str(sink)), tuple(process)))
    return sorted(out, key=lambda s: s.pid)


def sink_sessions(sessions: Collection[Session], sink_id: str) -> list[Session]:
    return [s for s in sessions if of_sink(s.application_name, sink_id)]


def lock_holders(conn: Connection, db: str, sink_id: str) -> list[Session]:
    """The other session holding the sink's named lock (``IS_USED_LOCK``), named the
    sink's committer when a run of the sink records it as its lock holder."""
    found = rows(
        conn,
        f"SELECT {_PROCESS}, EXISTS (SELECT 1 FROM `{db}`.runs r "
        "WHERE r.sink_id = %(sink)s AND r.lock_conn = p.ID "
        f"AND {locks.RECORDED_SINCE_START}) FROM information_schema.PROCESSLIST p "
        "WHERE p.ID = IS_USED_LOCK(%(lock)s) AND p.ID <> CONNECTION_ID()",
        {"sink": sink_id, "lock": locks.lock_name(sink_id), "uptime": locks.uptime_s(conn)},
    )
    return [_session(committer_name(sink_id) if r[5] else "", tuple(r[:5])) for r in found]


# -- runs -----------------------------------------------------------------------------------


def runs(conn: Connection, db: str, sink_id: str | None) -> list[RunInfo]:
    """Every run of the sink (of every sink for None), the most recently seen first."""
    found = rows(
        conn,
        "SELECT r.sink_id, r.run_id, r.first_seen, r.heartbeat_at, j.age, r.live_for_s, "
        "j.batch_interval, j.timeout, r.superseded_at, r.superseded_by, r.aborted_batch, "
        f"j.live FROM ({runs_sql(db)}) AS j "
        f"JOIN `{db}`.runs r ON r.sink_id = j.sink_id AND r.run_id = j.run_id "
        "ORDER BY r.sink_id, r.first_seen DESC, r.run_id",
        {"sink": sink_id},
    )
    return [
        RunInfo(
            str(s), str(r), _at(first), _at(beat), float(age), float(run_timeout),
            None if interval is None else float(interval), float(timeout), utc(sup),
            None if by is None else str(by), _int(aborted), bool(live),
        )
        for s, r, first, beat, age, run_timeout, interval, timeout, sup, by, aborted, live in found
    ]  # fmt: skip


def run_ends(conn: Connection, db: str, sink_id: str) -> dict[str, RunEnd]:
    found = rows(
        conn,
        f"SELECT run_id, ended_at, ended_how, ended_error FROM `{db}`.runs "
        "WHERE sink_id = %s AND ended_at IS NOT NULL",
        (sink_id,),
    )
    return {
        str(r): RunEnd(str(r), _at(at), str(how), None if err is None else str(err))
        for r, at, how, err in found
    }


def checkpoint_checks(
    conn: Connection, db: str, sink_id: str, limit: int
) -> list[CheckpointCheckRow]:
    found = rows(
        conn,
        "SELECT run_id, superseded_at IS NULL, checkpoint_verdict, checkpoint_detail, "
        "checkpoint_lost, checkpoint_location, checkpoint_batch, checkpoint_checked_at "
        f"FROM `{db}`.runs WHERE sink_id = %s AND checkpoint_checked_at IS NOT NULL "
        "ORDER BY checkpoint_checked_at DESC LIMIT %s",
        (sink_id, limit),
    )
    return [
        CheckpointCheckRow(
            str(run), bool(newest), str(verdict), str(detail or ""),
            tuple(int(b) for b in _json(lost) or []), None if where is None else str(where),
            _int(batch), _at(at),
        )
        for run, newest, verdict, detail, lost, where, batch, at in found
    ]  # fmt: skip


def forget_figures(conn: Connection, db: str, sink_id: str) -> tuple[Any, ...]:
    """What ``forget`` reports and whether the log knows the sink: decisions, the first
    and last batch, the writer, known, the sinks it knows (the first 20)."""
    count, first, last, writer, known = rows(
        conn,
        f"SELECT (SELECT count(*) FROM `{db}`.decisions WHERE sink_id = %(s)s), "
        f"(SELECT min(batch_id) FROM `{db}`.decisions WHERE sink_id = %(s)s), "
        f"(SELECT max(batch_id) FROM `{db}`.decisions WHERE sink_id = %(s)s), "
        f"(SELECT writer FROM `{db}`.sinks WHERE sink_id = %(s)s), "
        f"EXISTS (SELECT 1 FROM `{db}`.sinks WHERE sink_id = %(s)s) "
        f"OR EXISTS (SELECT 1 FROM `{db}`.runs WHERE sink_id = %(s)s)",
        {"s": sink_id},
    )[0]
    others = [
        str(r[0]) for r in rows(conn, f"SELECT sink_id FROM `{db}`.sinks ORDER BY 1 LIMIT 20")
    ]
    return int(count), _int(first), _int(last), writer, bool(known) or int(count) > 0, others
