"""The committer's PostgreSQL session: the commit log and the prepared transactions."""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from sqlsink.core.gid import Gid
from sqlsink.core.model import Decision, PreparedTransaction
from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection

log = logging.getLogger("sqlsink")


@functools.cache
def warn_markers_kept() -> None:
    """Once per process: every later batch would say the same."""
    log.warning(
        "sqlsink: this role may not DELETE FROM sqlsink.markers, so the markers "
        "of complete batches are kept (harmless, but the table grows): "
        "GRANT DELETE ON sqlsink.markers TO the sink's role"
    )


def lock_key(sink_id: str | None) -> str:
    return f"sqlsink:sink:{sink_id or '*'}"


class PostgresBackend:
    """Implements ``sqlsink.core.backend.TwoPhaseBackend`` on one autocommit connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        row = conn.execute("SELECT current_database()").fetchone()
        self._database = str(row[0]) if row else ""

    @property
    def database(self) -> str:
        return self._database

    @property
    def session_pid(self) -> int | None:
        return None if self.conn.closed else self.conn.info.backend_pid

    @contextmanager
    def sink_lock(self, sink_id: str | None) -> Iterator[None]:
        key = lock_key(sink_id)
        self.conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
        try:
            yield
        finally:
            if not self.conn.closed:
                self.conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))

    def prepared(self, sink_id: str | None) -> list[PreparedTransaction]:
        prefix = Gid.sink_prefix(sink_id) if sink_id else "sqlsink_"
        rows = self.conn.execute(
            "SELECT gid, database, owner, prepared FROM pg_prepared_xacts "
            "WHERE gid LIKE %s ORDER BY gid",
            (prefix.replace("_", r"\_") + "%",),
        ).fetchall()
        return [PreparedTransaction(g, d, o, p) for g, d, o, p in rows]

    def decisions(
        self, sink_id: str | None, batch_ids: Iterable[tuple[str, int]] = ()
    ) -> dict[tuple[str, int], Decision]:
        pairs = sorted(set(batch_ids))
        rows = self.conn.execute(
            "SELECT d.sink_id, d.batch_id, d.gids, d.rows, d.decided_at, "
            "       d.completed_at IS NOT NULL, d.query_id, d.run_id "
            "FROM sqlsink.decisions d "
            "LEFT JOIN unnest(%s::text[], %s::bigint[]) AS w(sink_id, batch_id) "
            "  ON w.sink_id = d.sink_id AND w.batch_id = d.batch_id "
            "WHERE w.sink_id IS NOT NULL "
            "   OR (d.completed_at IS NULL AND (%s::text IS NULL OR d.sink_id = %s::text))",
            ([s for s, _ in pairs], [b for _, b in pairs], sink_id, sink_id),
        ).fetchall()
        return {
            (s, b): Decision(s, b, frozenset(g), r, at, c, q, run)
            for s, b, g, r, at, c, q, run in rows
        }

    def bound_query(self, sink_id: str) -> str | None:
        row = self.conn.execute(
            "SELECT query_id FROM sqlsink.sinks WHERE sink_id = %s", (sink_id,)
        ).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def bind(self, sink_id: str, query_id: str) -> str:
        row = self.conn.execute(
            "INSERT INTO sqlsink.sinks (sink_id, query_id) VALUES (%s, %s) "
            "ON CONFLICT (sink_id) DO UPDATE SET query_id = excluded.query_id, bound_at = now() "
            "RETURNING query_id",
            (sink_id, query_id),
        ).fetchone()
        return str(row[0]) if row else query_id

    def has_batches(self, sink_id: str) -> bool:
        row = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM sqlsink.decisions WHERE sink_id = %s)", (sink_id,)
        ).fetchone()
        return bool(row and row[0])

    def insert_decision(
        self,
        sink_id: str,
        batch_id: int,
        gids: Collection[str],
        rows: int,
        query_id: str | None,
        run_id: str | None,
        *,
        partitions: int | None = None,
        first_write_at: float | None = None,
    ) -> bool:
        with self.conn.transaction():
            # the decision must be durable before anything is committed
            self.conn.execute("SET LOCAL synchronous_commit = on")
            self.conn.execute(
                "INSERT INTO sqlsink.sinks (sink_id, query_id) VALUES (%s, %s) "
                "ON CONFLICT (sink_id) DO NOTHING",
                (sink_id, query_id),
            )
            cur = self.conn.execute(
                "INSERT INTO sqlsink.decisions (sink_id, batch_id, gids, rows, query_id, run_id, "
                "partitions, first_write_at, completed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                "to_timestamp(%s), "
                "CASE WHEN cardinality(%s::text[]) = 0 THEN clock_timestamp() END) "
                "ON CONFLICT (sink_id, batch_id) DO NOTHING",
                (
                    sink_id,
                    batch_id,
                    list(gids),
                    rows,
                    query_id,
                    run_id,
                    partitions,
                    first_write_at,
                    list(gids),
                ),
            )
            return cur.rowcount == 1

    def commit_prepared(self, gid: str) -> bool:
        return self._finish("COMMIT PREPARED {}", gid)

    def rollback_prepared(self, gid: str) -> bool:
        return self._finish("ROLLBACK PREPARED {}", gid)

    def _finish(self, statement: str, gid: str) -> bool:
        try:
            self.conn.execute(sql.SQL(statement).format(sql.Literal(gid)))
        except psycopg.errors.UndefinedObject:
            return False  # not prepared (any more)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"cannot finish prepared transaction {gid}: {exc.diag.message_primary}. "
                "Only the role that prepared it (the sink's role) or a superuser may commit "
                "or roll it back: connect as that role",
                gid=gid,
            ) from None
        return True

    def visible_markers(self, gids: Collection[str]) -> set[str]:
        rows = self.conn.execute(
            "SELECT gid FROM sqlsink.markers WHERE gid = ANY(%s)", (list(gids),)
        ).fetchall()
        return {str(r[0]) for r in rows}

    def record_metrics(self, sink_id: str, batch_id: int, commit_ms: float, orphans: int) -> None:
        self.conn.execute(
            "UPDATE sqlsink.decisions SET commit_ms = %s, orphans = %s "
            "WHERE sink_id = %s AND batch_id = %s",
            (commit_ms, orphans, sink_id, batch_id),
        )

    def mark_complete(self, sink_id: str, batch_ids: Collection[int]) -> None:
        done = self.conn.execute(
            "UPDATE sqlsink.decisions SET completed_at = clock_timestamp() "
            "WHERE sink_id = %s AND batch_id = ANY(%s) AND completed_at IS NULL "
            "RETURNING batch_id",
            (sink_id, list(batch_ids)),
        ).fetchall()
        if not done:
            return
        # markers are read only to verify the gids of incomplete decisions: once a batch
        # is complete its markers go, so the commit log grows by one row per batch only
        try:
            self.conn.execute(
                "DELETE FROM sqlsink.markers WHERE sink_id = %s AND batch_id = ANY(%s)",
                (sink_id, [row[0] for row in done]),
            )
        except psycopg.errors.InsufficientPrivilege:
            warn_markers_kept()
