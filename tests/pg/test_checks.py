"""Server-settings checks against real PostgreSQL (the rules without a server are in
tests/unit/test_check_rules.py).

Every level a value can come from is set for real (server-wide in a server of the
test's own, per database in a database of the module's own, per role, per role in a
database) and the finding must name the value, its source and the statement that
fixes it there; then the test runs that very statement and checks that it fixed it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sqlsink.embedded import EmbeddedPostgres
from sqlsink.errors import ConfigError
from sqlsink.postgres import checks
from sqlsink.postgres.checks import (
    ERROR,
    OK,
    WARNING,
    Finding,
    check_at_start,
    check_server,
    describe_source,
    read_settings,
    require_prepared_transactions,
)
from tests.fix_pg import PgServer
from tests.unit.test_check_rules import judge

Conn = psycopg.Connection[tuple[Any, ...]]


# -- the rules, on the settings of a real server ------------------------------------------


def test_connections_are_read_from_the_server(pg_conn: Conn) -> None:
    settings = read_settings(pg_conn)
    assert settings.connections_in_use >= 1  # this session at least
    most = int(settings.settings["max_connections"].setting)
    found = judge(settings, partitions=most)["max_connections"]
    assert found.level == WARNING
    assert f"a batch of {most} partitions may hold {most + 2} connections" in found.message


# -- against PostgreSQL -------------------------------------------------------------------


def _connect(
    server: PgServer, *, user: str | None = None, dbname: str | None = None, **kw: Any
) -> Conn:
    params = {k: v for k, v in {"user": user, "dbname": dbname}.items() if v is not None}
    return psycopg.connect(
        psycopg.conninfo.make_conninfo(server.admin_url, **params), autocommit=True, **kw
    )


def _admin(server: PgServer, statement: str | sql.Composed, dbname: str | None = None) -> None:
    with _connect(server, dbname=dbname) as conn:
        conn.execute(statement)


def _run_fix(server: PgServer, fix: str | None) -> None:
    """Run a finding's fix as a superuser, one statement at a time (as psql would)."""
    assert fix is not None
    for statement in fix.split(";"):
        statement = statement.split("--")[0].strip()
        if statement:
            _admin(server, statement)


def _check(
    server: PgServer, *, user: str | None = None, dbname: str | None = None, **kw: Any
) -> dict[str, Finding]:
    with _connect(server, user=user, dbname=dbname) as conn:
        return {f.setting: f for f in check_server(conn, **kw)}


@pytest.fixture(scope="module")
def database(pg_server: PgServer) -> Iterator[str]:
    """A database of the module's own: per-database settings must reach no other test."""
    name = f"checks_{uuid.uuid4().hex[:8]}"
    _admin(pg_server, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    _admin(pg_server, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db(pg_server: PgServer, database: str) -> Iterator[str]:
    yield database
    _admin(pg_server, sql.SQL("ALTER DATABASE {} RESET ALL").format(sql.Identifier(database)))


@pytest.fixture
def role(pg_server: PgServer) -> Iterator[str]:
    """A login role whose name needs quoting; DROP ROLE drops its settings too."""
    name = f"Sink Role {uuid.uuid4().hex[:6]}"
    _admin(pg_server, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield name
    _admin(pg_server, sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_healthy_server(pg_server: PgServer, pg_conn: Conn) -> None:
    findings = check_server(pg_conn, trigger_interval_s=10, partitions=8, slowest_write_s=2)
    assert [f for f in findings if f.level != OK] == []
    names = {f.setting for f in findings}
    version = read_settings(pg_conn).server_version_num
    assert ("transaction_timeout" in names) == (version >= 170000)
    assert {"max_prepared_transactions", "statement_timeout", "lock_timeout"} <= names
    require_prepared_transactions(pg_conn)
    require_prepared_transactions(pg_conn, partitions=8)
    slots = int(next(f.value for f in findings if f.setting == "max_prepared_transactions"))
    with pytest.raises(ConfigError, match=f"fewer than the {slots + 1} partitions"):
        require_prepared_transactions(pg_conn, partitions=slots + 1)


def test_per_database(pg_server: PgServer, db: str) -> None:
    _admin(pg_server, f"ALTER DATABASE {db} SET statement_timeout = '2s'")
    found = _check(pg_server, dbname=db)["statement_timeout"]
    assert (found.level, found.value, found.source) == (WARNING, "2s", f"database {db}")
    assert "conservative floor of 10min" in found.message and "COPY" in found.message
    assert found.fix == f"ALTER DATABASE {db} SET statement_timeout = '15min'"
    _run_fix(pg_server, found.fix)
    fixed = _check(pg_server, dbname=db)["statement_timeout"]
    assert (fixed.level, fixed.value, fixed.source) == (OK, "15min", f"database {db}")
    # a generous trigger interval makes the same value too short again
    again = _check(pg_server, dbname=db, trigger_interval_s=3600)["statement_timeout"]
    assert again.level == WARNING and "the trigger interval (1h)" in again.message


def test_per_role(pg_server: PgServer, role: str, db: str) -> None:
    name = "idle_in_transaction_session_timeout"
    _admin(
        pg_server, sql.SQL("ALTER ROLE {} SET " + name + " = '30s'").format(sql.Identifier(role))
    )
    with _connect(pg_server, user=role, dbname=db) as conn:
        settings = read_settings(conn)
        assert (settings.role, settings.database) == (role, db)
        assert settings.stored == {(name, "user"): "30s"}
        # a role without pg_read_all_settings does not see the file's name
        mpt = settings.settings["max_prepared_transactions"]
        assert describe_source(mpt, settings) in ("server (configuration file)", "default")
        found = {f.setting: f for f in check_server(conn, trigger_interval_s=10)}[name]
        slow = {
            f.setting: f for f in check_server(conn, trigger_interval_s=10, slowest_write_s=12)
        }[name]
    assert (found.level, found.value, found.source) == (OK, "30s", f"role {role}")
    assert (slow.level, slow.value, slow.source) == (WARNING, "30s", f"role {role}")
    assert "(3 x 12s = 36s)" in slow.message
    assert slow.fix == f"ALTER ROLE \"{role}\" SET {name} = '1min'"
    _run_fix(pg_server, slow.fix)
    fixed = _check(pg_server, user=role, dbname=db, trigger_interval_s=10, slowest_write_s=12)[name]
    assert (fixed.level, fixed.value) == (OK, "1min")


def test_per_role_in_database(pg_server: PgServer, role: str, db: str) -> None:
    name = "idle_session_timeout"
    ident = sql.Identifier(role)
    # three levels; the role-in-database one wins, and the fix must target it
    _admin(pg_server, sql.SQL("ALTER ROLE {} SET " + name + " = '2h'").format(ident))
    _admin(pg_server, f"ALTER DATABASE {db} SET {name} = '3h'")
    _admin(
        pg_server,
        sql.SQL("ALTER ROLE {} IN DATABASE " + db + " SET " + name + " = '1min'").format(ident),
    )
    # and one for another database, which must not count
    _admin(
        pg_server,
        sql.SQL("ALTER ROLE {} IN DATABASE postgres SET statement_timeout = '1s'").format(ident),
    )
    with _connect(pg_server, user=role, dbname=db) as conn:
        settings = read_settings(conn)
        found = {f.setting: f for f in check_server(conn, trigger_interval_s=300)}
    assert settings.stored == {
        (name, "user"): "2h",
        (name, "database"): "3h",
        (name, "database user"): "1min",
    }
    idle = found[name]
    assert (idle.level, idle.value, idle.source) == (
        WARNING,
        "1min",
        f"role {role} in database {db}",
    )
    assert "the trigger interval (5min)" in idle.message
    assert idle.fix == f"ALTER ROLE \"{role}\" IN DATABASE {db} SET {name} = '5min'"
    assert found["statement_timeout"].level == OK and found["statement_timeout"].value == "0"
    _run_fix(pg_server, idle.fix)
    fixed = _check(pg_server, user=role, dbname=db, trigger_interval_s=300)[name]
    assert (fixed.level, fixed.value, fixed.source) == (OK, "5min", f"role {role} in database {db}")


def test_lock_timeout_per_role(pg_server: PgServer, role: str, db: str) -> None:
    ident = sql.Identifier(role)
    _admin(pg_server, sql.SQL("ALTER ROLE {} SET lock_timeout = '1s'").format(ident))
    short = _check(pg_server, user=role, dbname=db)["lock_timeout"]
    assert (short.level, short.value, short.source) == (WARNING, "1s", f"role {role}")
    assert short.fix == f"ALTER ROLE \"{role}\" SET lock_timeout = '1min'"
    _admin(pg_server, sql.SQL("ALTER ROLE {} SET lock_timeout = '30s'").format(ident))
    fine = _check(pg_server, user=role, dbname=db)["lock_timeout"]
    assert (fine.level, fine.value) == (OK, "30s") and "option lockTimeout" in fine.message
    assert "createTable" in short.message and "pg_advisory_lock" not in short.message


def test_connection_options(pg_server: PgServer, db: str) -> None:
    with _connect(pg_server, dbname=db, options="-c statement_timeout=1s") as conn:
        found = {f.setting: f for f in check_server(conn)}["statement_timeout"]
    assert (found.level, found.value) == (WARNING, "1s")
    assert found.source == "connection options (PGOPTIONS or options= in the URL)"
    assert found.fix is not None and "-c statement_timeout=15min" in found.fix


SERVER_WIDE: dict[str, str | int] = {
    "max_prepared_transactions": 0,
    "idle_in_transaction_session_timeout": "'5s'",
    "lock_timeout": "'2s'",
    "idle_session_timeout": "'1min'",
    "fsync": "off",
}


def test_server_wide(caplog: pytest.LogCaptureFixture) -> None:
    pg = EmbeddedPostgres(settings=SERVER_WIDE).start()
    server = PgServer(pg.url(), pg.url(), pg)
    try:
        found = _check(server, trigger_interval_s=30)
        conf = "server (postgresql.conf)"
        mpt = found["max_prepared_transactions"]
        assert (mpt.level, mpt.value, mpt.source) == (ERROR, "0", conf)
        assert mpt.message.startswith(
            "prepared transactions are disabled on this server: set max_prepared_transactions "
            "to at least 64 and restart"
        )
        assert (
            mpt.fix == "ALTER SYSTEM SET max_prepared_transactions = 64; -- then restart PostgreSQL"
        )
        idle_tx = found["idle_in_transaction_session_timeout"]
        assert (idle_tx.level, idle_tx.value, idle_tx.source) == (WARNING, "5s", conf)
        assert "the trigger interval (30s)" in idle_tx.message
        assert idle_tx.fix == (
            "ALTER SYSTEM SET idle_in_transaction_session_timeout = '1min'; "
            "SELECT pg_reload_conf();"
        )
        assert "for the sink's role only: ALTER ROLE postgres SET" in idle_tx.message
        assert (found["lock_timeout"].level, found["lock_timeout"].value) == (WARNING, "2s")
        idle = found["idle_session_timeout"]
        assert (idle.level, idle.value, idle.source) == (OK, "1min", conf)  # >= 30s trigger
        assert found["statement_timeout"].level == OK

        with _connect(server) as conn:
            with pytest.raises(
                ConfigError, match="prepared transactions are disabled on this server"
            ) as exc:
                require_prepared_transactions(conn, partitions=100)
            assert "at least 200" in str(exc.value) and "ALTER SYSTEM SET" in str(exc.value)
            caplog.set_level(logging.INFO, logger="sqlsink")
            state: dict[str, checks.Verdict] = {}
            with pytest.raises(ConfigError, match="max_prepared_transactions"):
                check_at_start(conn, key="q", trigger_interval_s=30, state=state)
            assert {r.levelno for r in caplog.records} == {logging.ERROR, logging.WARNING}
            warnings = check_at_start(
                conn, key="q", exactly_once=False, trigger_interval_s=30, state=state
            )
            assert {f.setting for f in warnings if f.level == WARNING} == {
                "idle_in_transaction_session_timeout",
                "lock_timeout",
            }

        for f in found.values():
            if f.fix:
                _run_fix(server, f.fix)
        pg.restart()  # max_prepared_transactions takes a restart
        after = _check(server, trigger_interval_s=30)
        assert {f.setting: f.level for f in after.values() if f.level != OK} == {}
        assert after["max_prepared_transactions"].source == "server (postgresql.auto.conf)"
        assert after["lock_timeout"].value == "1min"
        with _connect(server) as conn:
            require_prepared_transactions(conn, partitions=32)
    finally:
        pg.destroy()


# -- the re-check after a commit ----------------------------------------------------------


def test_the_recheck_after_a_commit_reads_the_server_only_when_a_measure_grew(
    pg_server: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    """statement_timeout = 1s on the session. A batch whose slowest write was 0.2 s (3 x
    = 0.6 s) is fine; one with fewer partitions and a shorter write reads nothing (given a
    closed connection, it does not fail) until the interval since the last read is over;
    one whose write took 0.5 s (1.5 s needed) is
    warned about, after its commit; the next check before a batch judges with that 0.5 s,
    so it agrees and says nothing more."""
    key = f"recheck-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.INFO, logger="sqlsink")

    def recheck(
        conn: Conn, partitions: int, slowest: float, interval_s: float = 30.0
    ) -> list[Finding] | None:
        return checks.check_after_commit(
            conn,
            key=key,
            partitions=partitions,
            slowest_write_s=slowest,
            partition_cap=None,
            exactly_once=True,
            interval_s=interval_s,
        )

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if key in r.getMessage()]

    with _connect(pg_server, options="-c statement_timeout=1s") as conn:
        first = recheck(conn, 2, 0.2)
        assert first is not None
        assert {f.setting: f.level for f in first}["statement_timeout"] == OK
        assert (checks.measured(key).partitions, checks.measured(key).slowest_write_s) == (2, 0.2)
        closed = _connect(pg_server)
        closed.close()
        assert recheck(closed, 1, 0.1) is None
        assert (checks.measured(key).partitions, checks.measured(key).slowest_write_s) == (2, 0.2)
        assert said() == []
        # the interval over, it reads again (free slots and connections change)
        assert recheck(conn, 1, 0.1, interval_s=0.0) is not None
        assert said() == []

        assert recheck(conn, 2, 0.5) is not None
        (warning,) = said()
        assert warning.startswith(f"sqlsink {key}: statement_timeout = 1s (")
        assert "3 x the slowest partition write (3 x 500ms = 1.5s)" in warning
        again = check_at_start(conn, key=key)
        assert {f.setting: f.level for f in again}["statement_timeout"] == WARNING
        assert said() == [warning]


def test_a_short_role_lock_timeout_does_not_bound_a_wait_for_the_sink_lock(
    pg_server: PgServer, role: str, db: str
) -> None:
    """Every sink session sets its own lock_timeout (``PostgresBackend``), and a wait
    for the sink lock its own bound (``locks.acquire_sink_lock``): a role's 1 s does not
    end a wait for the sink lock held 2 s by another session."""
    import threading
    import time

    from sqlsink.postgres import locks
    from sqlsink.postgres.backend import PostgresBackend

    ident = sql.Identifier(role)
    _admin(pg_server, sql.SQL("ALTER ROLE {} SET lock_timeout = '1s'").format(ident))
    sink = f"lt-{uuid.uuid4().hex[:8]}"
    with (
        _connect(pg_server, dbname=db) as holder,
        _connect(pg_server, user=role, dbname=db) as conn,
    ):
        assert conn.execute("SHOW lock_timeout").fetchone() == ("1s",)
        assert locks.try_sink_lock(holder, sink)
        release = threading.Timer(2.0, lambda: locks.unlock_sink(holder, sink))
        backend = PostgresBackend(conn, 60.0)  # option lockTimeout's default
        started = time.monotonic()
        release.start()
        try:
            with backend.sink_lock(sink):
                waited = time.monotonic() - started
                held = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND pid = pg_backend_pid() AND granted"
                ).fetchone()
        finally:
            release.join()
    assert 1.8 < waited < 10 and held == (1,)
    # and the old warning's claim is gone: the role's 1 s is no longer said to end it
    found = _check(pg_server, user=role, dbname=db)["lock_timeout"]
    assert "pg_advisory_lock" not in found.message


def test_a_short_database_lock_timeout_bounds_the_planners_create_table(
    pg_server: PgServer, db: str
) -> None:
    """The planner's session (``plan_write``: createTable) sets no lock_timeout of its
    own: the server's value (here the database's 1 s) ends its CREATE TABLE's wait for
    another session creating the same table."""
    import time

    import sqlalchemy as sa

    from sqlsink.postgres import appnames
    from sqlsink.postgres.sessions import session
    from sqlsink.postgres.target import create_table
    from sqlsink.tablename import TableName

    ident = sql.Identifier(db)
    _admin(pg_server, sql.SQL("ALTER DATABASE {} SET lock_timeout = '1s'").format(ident))
    name = f"lt_{uuid.uuid4().hex[:8]}"
    url = psycopg.conninfo.make_conninfo(pg_server.admin_url, dbname=db)
    with _connect(pg_server, dbname=db) as other:
        other.execute("BEGIN")
        other.execute(sql.SQL("CREATE TABLE public.{} (id int)").format(sql.Identifier(name)))
        started = time.monotonic()
        with (
            pytest.raises(psycopg.errors.LockNotAvailable, match="lock timeout"),
            session(url, None, application_name=appnames.PLANNER) as conn,
        ):
            assert conn.execute("SHOW lock_timeout").fetchone() == ("1s",)
            create_table(conn, TableName("public", name), [sa.Column("id", sa.Integer)])
        waited = time.monotonic() - started
        other.execute("ROLLBACK")
    assert 0.9 < waited < 5
    found = _check(pg_server, dbname=db)["lock_timeout"]
    assert found.level == WARNING and "createTable" in found.message
