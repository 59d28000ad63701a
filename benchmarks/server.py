"""The PostgreSQL side: the embedded server (or --url), the target table, its checks."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from cpu import watch_postgres
from psycopg.conninfo import conninfo_to_dict
from workload import TABLE_DDL

TABLE = "bench_rows"
# fsync stays on: the cost of a durable commit is part of what is measured.
SERVER_SETTINGS: dict[str, str | int] = {
    "max_prepared_transactions": 64,
    "max_connections": 100,
    "shared_buffers": "'512MB'",
    "max_wal_size": "'8GB'",  # no checkpoint forced by WAL volume in the middle of a run
    "checkpoint_timeout": "'30min'",
}


@contextlib.contextmanager
def postgres(
    url: str | None, base_dir: Path, overrides: dict[str, str | int] | None = None
) -> Iterator[str]:
    """Yield the URL of the server to use: ``url``, or a fresh embedded one (its settings
    SERVER_SETTINGS with ``overrides`` over them)."""
    if url is not None:
        yield url
        return
    from sqlsink.embedded import EmbeddedPostgres

    # the published figures were measured on PostgreSQL 16: keep runs comparable unless
    # SQLSINK_PG_VERSION asks for another (the embedded server would pick the newest)
    os.environ.setdefault("SQLSINK_PG_VERSION", "16")
    server = EmbeddedPostgres(base_dir, settings={**SERVER_SETTINGS, **(overrides or {})})
    server.start()
    watch_postgres(int((server.data_dir / "postmaster.pid").read_text().split()[0]))
    try:
        yield server.url()
    finally:
        server.destroy()


def recreate_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(TABLE_DDL.format(table=TABLE))


def reset_table(url: str) -> None:
    """Empty the table and checkpoint, so that no run pays for the previous one's writes."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")  # needs superuser or pg_checkpoint (--url)


def count_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
    return int(row[0]) if row else 0


def check_rows(url: str, expected: int, what: str) -> None:
    """A run that did not load every row exactly once is an error, not a number."""
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {TABLE}").fetchone()
    total, distinct = (int(row[0]), int(row[1])) if row else (0, 0)
    if total != expected or distinct != expected:
        raise RuntimeError(f"{what}: expected {expected} rows, found {total} ({distinct} ids)")


def wait_for_rows(conn: psycopg.Connection[Any], at_least: int, timeout_s: float) -> float:
    """Poll every 5 ms until the table holds ``at_least`` rows; the perf_counter then."""
    deadline = time.perf_counter() + timeout_s
    while True:
        row = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
        now = time.perf_counter()
        if row and int(row[0]) >= at_least:
            return now
        if now > deadline:
            raise TimeoutError(f"{at_least} rows not visible after {timeout_s} s")
        time.sleep(0.005)


def server_facts(url: str) -> dict[str, Any]:
    names = (
        "server_version",
        "max_prepared_transactions",
        "shared_buffers",
        "synchronous_commit",
        "fsync",
    )
    with psycopg.connect(url) as conn:
        facts = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in names}  # type: ignore[index]
    return facts


def jdbc_target(url: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties for a libpq URL."""
    params = conninfo_to_dict(url.removeprefix("jdbc:"))
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "postgres"
    props = {"user": str(params.get("user") or "postgres")}
    if params.get("password"):
        props["password"] = str(params["password"])
    return f"jdbc:postgresql://{host}:{port}/{dbname}", props
