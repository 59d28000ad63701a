"""``sqlsink check``'s judgement of a MariaDB server (sqlsink/mariadb/checks.py), on the
tests' private server: its own settings first (the baseline test runs first in this
file: SET GLOBAL leaves a variable's origin 'SQL' even when set back), then settings
changed with SET GLOBAL and set back, then users without what the sink needs. The
facts the rules rest on are measured here too: a pause of Spark's iterator longer than
net_read_timeout ends a partition's load, max_statement_time ends it, and the sink's
sessions take wait_timeout, not interactive_timeout. MySQL's paths (no MySQL server
here) are judged on the version and the grants MySQL prints."""

from __future__ import annotations

import re
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from sqlsink.core.admin import CheckContext, Finding
from sqlsink.core.model import TaskIdentity
from sqlsink.errors import WriteError
from sqlsink.mariadb import xid
from sqlsink.mariadb.checks import (
    Server,
    Variable,
    check_version,
    fix,
    parse_grants,
    run_checks,
    trigger_creators,
)
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.mariadb.partition import LoadTarget, write_partition
from sqlsink.mariadb.schema import ensure_schema, migrations
from tests.fix_mariadb import TARGET_DB, MariaServer
from tests.mariadb.protocol import global_settings

NEWEST = migrations()[-1][0]
SINK = "'sink'@'%'"


def _by_setting(findings: list[Finding]) -> dict[str, Finding]:
    out = {f.setting: f for f in findings}
    assert len(out) == len(findings), [f.setting for f in findings]
    return out


def _judged(f: Finding) -> tuple[str, str, str, str | None]:
    return (f.level, f.value, f.source, f.fix)


def _check(server: MariaServer, ctx: CheckContext, url: str | None = None) -> dict[str, Finding]:
    conn = connect(url or server.url())
    try:
        return _by_setting(run_checks(conn, ctx))
    finally:
        conn.close()


def test_the_tests_server_as_the_sink_user(mariadb_server: MariaServer) -> None:
    conn = connect(mariadb_server.url())
    ensure_schema(conn)
    conn.close()
    found = _check(mariadb_server, CheckContext(trigger_interval_s=30, partitions=8))
    assert list(found) == [
        "server version",
        "local_infile",
        "log_bin",
        "innodb_flush_log_at_trx_commit",
        "sync_binlog",
        "binlog_format",
        "net_read_timeout",
        "max_statement_time",
        "innodb_lock_wait_timeout",
        "wait_timeout",
        "read_only",
        "max_connections",
        "XA RECOVER",
        "sqlsink schema",
        "sqlsink privileges",
        "target privileges",
    ]
    version = found["server version"]
    assert (version.level, version.source, version.fix) == ("ok", "server", None)
    assert version.value.startswith("10.11.")
    assert version.message == "MariaDB 10.11: the version sqlsink's tests run on"
    f = found["local_infile"]
    assert _judged(f) == ("ok", "ON", "server (command line)", None)
    f = found["log_bin"]
    assert _judged(f) == (
        "warning",
        "ON",
        "server (option log-bin)",
        "keep it if replicas, point-in-time recovery or change data capture need it; "
        "otherwise remove log-bin from the server's configuration and restart mariadbd",
    )
    assert "(MDEV-21469, MDEV-31921)" in f.message
    assert "lose a prepared or a decided XA branch" in f.message
    assert "into a data-loss error naming the batch and partition, never a silent gap" in f.message
    f = found["binlog_format"]
    assert _judged(f) == ("ok", "ROW", "server (command line)", None)
    f = found["read_only"]
    assert _judged(f) == ("ok", "OFF", "default", None)
    f = found["net_read_timeout"]
    assert _judged(f) == ("ok", "30", "default", None)
    assert "a longer pause between two Arrow batches" in f.message
    f = found["max_statement_time"]
    assert _judged(f) == ("ok", "0", "default", None)
    assert f.message == "off: it cannot end a partition's load"
    f = found["innodb_lock_wait_timeout"]
    assert _judged(f) == ("ok", "50", "default", None)
    assert (
        "(about the trigger interval, 30 s): other sessions writing those rows, or altering a "
        "table a prepared branch wrote (a migration of the commit log's markers too), wait up "
        "to 50 s, then fail with error 1205"
    ) in f.message
    f = found["wait_timeout"]
    assert _judged(f) == ("ok", "28800", "default", None)
    assert "so the trigger interval (30 s) does not bound it" in f.message
    f = found["max_connections"]
    assert _judged(f) == ("ok", "200", "server (command line)", None)
    assert f.message.startswith(
        "room for the up to 10 connections a batch of 8 partitions holds at once ("
    )
    f = found["XA RECOVER"]
    assert _judged(f) == ("ok", "allowed", "user sink@%", None)
    assert re.fullmatch(
        r"MariaDB lists every prepared branch to any user, and lets any user finish one; "
        r"\d+ prepared branch\(es\) on the server now, \d+ of them sqlsink's",
        f.message,
    )
    f = found["sqlsink schema"]
    assert _judged(f) == ("ok", f"version {NEWEST}", "", None)
    f = found["sqlsink privileges"]
    assert _judged(f) == ("ok", "granted", "user sink@%", None)
    f = found["target privileges"]
    assert _judged(f) == ("ok", "INSERT, CREATE", "user sink@%", None)
    assert f.message == (
        f"may append to the tables of database {TARGET_DB}, and create them (createTable)"
    )


def test_settings_set_global_are_judged_with_their_fix(mariadb_server: MariaServer) -> None:
    with global_settings(
        mariadb_server,
        local_infile=0,
        net_read_timeout=5,
        max_statement_time=20,
        innodb_lock_wait_timeout=3,
        wait_timeout=15,
        max_connections=12,
    ):
        found = _check(mariadb_server, CheckContext(trigger_interval_s=120, partitions=16))
    sql = "server (SET GLOBAL)"
    f = found["local_infile"]
    assert _judged(f) == (
        "error",
        "OFF",
        sql,
        "SET GLOBAL local_infile = ON; and local_infile = ON under [mariadbd] in the "
        "server's configuration",
    )
    assert "the sink refuses to start" in f.message
    f = found["net_read_timeout"]
    assert _judged(f) == (
        "warning",
        "5",
        sql,
        "SET GLOBAL net_read_timeout = 30; and net_read_timeout = 30 under [mariadbd] in the "
        "server's configuration",
    )
    assert f.message.startswith(
        "net_read_timeout = 5 s is shorter than the servers' default of 30 s: "
    )
    f = found["max_statement_time"]
    assert _judged(f) == (
        "warning",
        "20",
        sql,
        "SET GLOBAL max_statement_time = 300; and max_statement_time = 300 under [mariadbd] "
        "in the server's configuration",
    )
    assert f.message.startswith(
        "max_statement_time = 20 s is shorter than the trigger interval (120 s): it ends any "
        "statement that runs longer: a partition's LOAD DATA"
    )
    f = found["innodb_lock_wait_timeout"]
    assert _judged(f) == (
        "warning",
        "3",
        sql,
        "SET GLOBAL innodb_lock_wait_timeout = 10; and innodb_lock_wait_timeout = 10 under "
        "[mariadbd] in the server's configuration",
    )
    assert f.message.startswith("innodb_lock_wait_timeout = 3 s is shorter than 10 s: ")
    f = found["wait_timeout"]
    assert _judged(f) == (
        "warning",
        "15",
        sql,
        "SET GLOBAL wait_timeout = 60; and wait_timeout = 60 under [mariadbd] in the "
        "server's configuration",
    )
    assert "so the trigger interval (120 s) does not bound it" in f.message
    f = found["max_connections"]
    assert (f.level, f.value, f.source) == ("warning", "12", sql)
    assert f.message.startswith(
        "a batch of 16 partitions may hold 18 connections at once (one per loading partition, "
        "the driver's heartbeat and commit) but max_connections = 12: "
    )
    assert "cap it with the option maxPartitions=10, or raise max_connections" in f.message
    assert f.fix is not None and f.fix.startswith("SET GLOBAL max_connections = ")
    assert f.fix.endswith(
        "and max_connections = "
        + f.fix.split(" = ")[1].split(";")[0]
        + " under [mariadbd] in the server's configuration (or cap a batch's partitions with "
        "the option maxPartitions)"
    )


_WRITE = "REPLACE INTO sqlsink.task_sessions VALUES (0, 's', 0, 0, now())"


def _refused(server: MariaServer) -> int:
    """The server's error for a write of a sink session (READ COMMITTED, as every one)."""
    conn = connect(server.url())
    try:
        with pytest.raises(Exception) as caught:
            execute(conn, _WRITE)
    finally:
        conn.close()
    return int(caught.value.args[0])


def test_a_read_only_server_refuses_the_sink(mariadb_server: MariaServer) -> None:
    with global_settings(mariadb_server, read_only=1):
        found = _check(mariadb_server, CheckContext())
        assert _refused(mariadb_server) == 1290
    f = found["read_only"]
    assert _judged(f) == (
        "error",
        "ON",
        "server (SET GLOBAL)",
        "point the URL at the primary server; or SET GLOBAL read_only = OFF; and read_only = "
        "OFF under [mariadbd] in the server's configuration",
    )
    assert f.message == (
        "the server is read-only (a replica?): it refuses every write of sink@%, the sink's "
        "loads and its commit log's (error 1290)"
    )


def test_statement_logging_refuses_the_sink(mariadb_server: MariaServer) -> None:
    with global_settings(mariadb_server, binlog_format="STATEMENT"):
        found = _check(mariadb_server, CheckContext())
        assert _refused(mariadb_server) == 1665
    f = found["binlog_format"]
    assert _judged(f) == (
        "error",
        "STATEMENT",
        "server (SET GLOBAL)",
        "SET GLOBAL binlog_format = ROW; and binlog_format = ROW under [mariadbd] in the "
        "server's configuration",
    )
    assert f.message.endswith(
        "with binlog_format = STATEMENT the server refuses every write of the sink (error "
        "1665), its loads and its commit log's"
    )


def test_the_trigger_interval_unknown_uses_the_floor(mariadb_server: MariaServer) -> None:
    with global_settings(mariadb_server, max_statement_time=100):
        found = _check(mariadb_server, CheckContext())
    f = found["max_statement_time"]
    assert (f.level, f.value) == ("warning", "100")
    assert f.message.startswith(
        "max_statement_time = 100 s is shorter than the floor of 600 s (the trigger interval "
        "is not known): "
    )
    assert f.fix is not None and f.fix.startswith("SET GLOBAL max_statement_time = 600;")
    f = found["max_connections"]
    assert f.level == "ok"
    assert "give --partitions to compare" in f.message


# -- users without what the sink needs --------------------------------------------------------


@pytest.fixture(scope="module")
def limited(mariadb_server: MariaServer) -> Iterator[dict[str, str]]:
    """Three users: 'check_one' may INSERT into one table only and has nothing on the
    commit log, with a statement-time limit of its own; 'check_read' may only read the
    target database; 'check_role' gets the commit log through its default role."""
    tag = uuid.uuid4().hex[:6]
    users = {"one": f"check_one_{tag}", "read": f"check_read_{tag}", "role": f"check_role_{tag}"}
    role = f"sqlsink_role_{tag}"
    table = f"only_{tag}"
    root = mariadb_server.connect(root=True)
    for statement in (
        f"CREATE TABLE `{TARGET_DB}`.`{table}` (id int) ENGINE=InnoDB",
        *(f"CREATE USER '{u}'@'%' IDENTIFIED BY 'pw'" for u in users.values()),
        f"GRANT INSERT ON `{TARGET_DB}`.`{table}` TO '{users['one']}'@'%'",
        f"GRANT USAGE ON *.* TO '{users['one']}'@'%' WITH MAX_STATEMENT_TIME 30 "
        "MAX_USER_CONNECTIONS 5",
        f"GRANT SELECT ON `{TARGET_DB}`.* TO '{users['read']}'@'%'",
        f"CREATE ROLE {role}",
        f"GRANT ALL PRIVILEGES ON `sqlsink`.* TO {role}",
        f"GRANT INSERT, CREATE ON `{TARGET_DB}`.* TO '{users['role']}'@'%'",
        f"GRANT {role} TO '{users['role']}'@'%'",
        f"SET DEFAULT ROLE {role} FOR '{users['role']}'@'%'",
    ):
        execute(root, statement)
    yield {**users, "table": table}
    for u in users.values():
        execute(root, f"DROP USER '{u}'@'%'")
    execute(root, f"DROP ROLE {role}")
    execute(root, f"DROP TABLE `{TARGET_DB}`.`{table}`")
    root.close()


def _url(server: MariaServer, user: str) -> str:
    return f"mariadb://{urllib.parse.quote(user)}:pw@{server.host}:{server.port}/{TARGET_DB}"


def test_a_user_without_the_commit_log_gets_errors_naming_the_grant(
    mariadb_server: MariaServer, limited: dict[str, str]
) -> None:
    user = limited["one"]
    found = _check(
        mariadb_server,
        CheckContext(trigger_interval_s=60, partitions=8),
        _url(mariadb_server, user),
    )
    account = f"'{user}'@'%'"
    f = found["sqlsink privileges"]
    assert _judged(f) == (
        "error",
        "missing SELECT, INSERT, UPDATE, DELETE",
        f"user {user}@%",
        f"GRANT ALL PRIVILEGES ON `sqlsink`.* TO {account}",
    )
    assert f.message == (
        f"{user}@% lacks SELECT, INSERT, UPDATE, DELETE on database sqlsink: the sink must "
        "read and write the commit log (REPLACE needs INSERT and DELETE)"
    )
    f = found["target privileges"]
    assert _judged(f) == (
        "warning",
        "INSERT on 1 table(s)",
        f"user {user}@%",
        f"GRANT INSERT ON `{TARGET_DB}`.* TO {account}",
    )
    assert f.message.startswith(f"{user}@% may INSERT into `{limited['table']}` of database ")
    f = found["max_statement_time"]
    assert _judged(f) == (
        "warning",
        "30",
        "the user's limit (GRANT ... WITH)",
        f"GRANT USAGE ON *.* TO {account} WITH MAX_STATEMENT_TIME 60",
    )
    assert f.message.startswith(
        "max_statement_time = 30 s is shorter than the trigger interval (60 s): it ends any "
        "statement that runs longer"
    )
    f = found["sqlsink schema"]
    assert (f.level, f.value, f.fix) == ("error", "not readable", None)
    assert f.message.startswith(f"{user}@% may not read the commit log (database sqlsink)")
    f = found["max_user_connections"]
    assert _judged(f) == (
        "warning",
        "5",
        "the user's limit (GRANT ... WITH)",
        f"GRANT USAGE ON *.* TO {account} WITH MAX_USER_CONNECTIONS 10 (or cap a batch's "
        "partitions with the option maxPartitions)",
    )
    assert f.message.startswith(
        "a batch of 8 partitions may hold 10 connections at once (one per loading partition, "
        "the driver's heartbeat and commit) but max_user_connections = 5: "
    )
    f = found["XA RECOVER"]
    assert _judged(f) == ("ok", "allowed", f"user {user}@%", None)  # measured: any user


def test_a_user_without_insert_gets_an_error(
    mariadb_server: MariaServer, limited: dict[str, str]
) -> None:
    user = limited["read"]
    found = _check(mariadb_server, CheckContext(), _url(mariadb_server, user))
    f = found["target privileges"]
    assert _judged(f) == (
        "error",
        "missing INSERT",
        f"user {user}@%",
        f"GRANT INSERT ON `{TARGET_DB}`.* TO '{user}'@'%'",
    )
    assert f.message == (
        f"{user}@% lacks INSERT on database {TARGET_DB}: the sink appends with LOAD DATA, "
        "which needs it"
    )


def test_privileges_through_a_default_role_count(
    mariadb_server: MariaServer, limited: dict[str, str]
) -> None:
    user = limited["role"]
    found = _check(mariadb_server, CheckContext(), _url(mariadb_server, user))
    assert _judged(found["sqlsink privileges"]) == ("ok", "granted", f"user {user}@%", None)
    assert _judged(found["target privileges"]) == ("ok", "INSERT, CREATE", f"user {user}@%", None)


# -- the facts the rules rest on -----------------------------------------------------------


def _task() -> TaskIdentity:
    return TaskIdentity(
        f"chk{uuid.uuid4().hex[:8]}", 0, 0, f"run{uuid.uuid4().hex[:8]}", 1, 0, None
    )


def _paused(pause_s: float) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch([pa.array(range(100), pa.int64())], names=["id"])
    time.sleep(pause_s)
    yield pa.record_batch([pa.array(range(100), pa.int64())], names=["id"])


def _prepared_of(server: MariaServer, sink_id: str) -> list[Any]:
    root = server.connect(root=True)
    try:
        found = [xid.from_recover_row(r) for r in rows(root, "XA RECOVER")]
    finally:
        root.close()
    return [g for g in found if g is not None and g.sink_id == sink_id]


@pytest.fixture(scope="module")
def paused_table(mariadb_server: MariaServer) -> Iterator[str]:
    table = f"paused_{uuid.uuid4().hex[:6]}"
    conn = connect(mariadb_server.url())
    ensure_schema(conn)
    execute(conn, f"CREATE TABLE `{table}` (id bigint) ENGINE=InnoDB")
    yield f"{TARGET_DB}.{table}"
    execute(conn, f"DROP TABLE `{table}`")
    conn.close()


def test_a_pause_longer_than_net_read_timeout_ends_the_load(
    mariadb_server: MariaServer, paused_table: str
) -> None:
    task = _task()
    target = LoadTarget(mariadb_server.url(), paused_table)
    # the server ends the connection; what the sink makes of it is the partition's
    # error to word (today PyMySQL's own, an AttributeError of its closed socket)
    with global_settings(mariadb_server, net_read_timeout=1), pytest.raises(Exception) as caught:
        write_partition(target, task, _paused(2))
    assert not isinstance(caught.value, AssertionError)
    assert _prepared_of(mariadb_server, task.sink_id) == []
    conn = connect(mariadb_server.url())
    assert rows(conn, f"SELECT count(*) FROM {paused_table}")[0][0] == 0
    conn.close()
    # the same pause under the default is loaded
    task = _task()
    outcome = write_partition(target, task, _paused(2))
    assert outcome.gid is not None
    assert [str(g) for g in _prepared_of(mariadb_server, task.sink_id)] == [outcome.gid]
    root = mariadb_server.connect(root=True)
    execute(root, f"XA ROLLBACK {xid.encode_text(outcome.gid).sql()}")  # type: ignore[union-attr]
    root.close()


def test_max_statement_time_ends_the_load(mariadb_server: MariaServer, paused_table: str) -> None:
    task = _task()
    target = LoadTarget(mariadb_server.url(), paused_table)
    with global_settings(mariadb_server, max_statement_time=1), pytest.raises(WriteError) as caught:
        write_partition(target, task, _paused(2))
    assert "max_statement_time exceeded" in str(caught.value)
    assert _prepared_of(mariadb_server, task.sink_id) == []


def test_alter_table_behind_a_prepared_branch_waits_innodb_lock_wait_timeout(
    mariadb_server: MariaServer, paused_table: str
) -> None:
    task = _task()
    outcome = write_partition(LoadTarget(mariadb_server.url(), paused_table), task, _paused(0))
    branch = xid.encode_text(str(outcome.gid))
    assert branch is not None
    root = mariadb_server.connect(root=True)
    try:
        execute(root, "SET SESSION lock_wait_timeout = 30, innodb_lock_wait_timeout = 1")
        began = time.monotonic()
        with pytest.raises(Exception) as caught:
            execute(root, f"ALTER TABLE {paused_table} ADD COLUMN extra int")
        assert caught.value.args[0] == 1205  # innodb_lock_wait_timeout's, not the MDL wait's
        assert time.monotonic() - began < 10
    finally:
        execute(root, f"XA ROLLBACK {branch.sql()}")
        root.close()


def test_the_sink_sessions_take_wait_timeout_not_interactive_timeout(
    mariadb_server: MariaServer,
) -> None:
    with global_settings(mariadb_server, wait_timeout=123, interactive_timeout=7):
        conn = connect(mariadb_server.url())
        assert rows(conn, "SELECT @@SESSION.wait_timeout")[0][0] == 123
        conn.close()


# -- MySQL, judged on what it prints --------------------------------------------------------


def _server(version: str) -> Server:
    return Server(
        version,
        "mariadb" in version.lower(),
        tuple(int(n) for n in version.split("-")[0].split(".")),
        "sink@%",
        TARGET_DB,
        {},
    )


def test_versions() -> None:
    ctx = CheckContext()
    (f,) = check_version(_server("8.0.29"), ctx)
    assert (f.level, f.value, f.fix) == ("error", "8.0.29", "upgrade to MySQL 8.0.30 or later")
    assert "refuses MySQL older than 8.0.30, whose XA is not crash-safe with the binary log" in (
        f.message
    )
    (f,) = check_version(_server("8.0.36"), ctx)
    assert (f.level, f.value, f.fix) == ("warning", "8.0.36", None)
    assert "on MySQL 8.0.30+ it runs the same statements but is untested" in f.message
    (f,) = check_version(_server("10.6.18-MariaDB"), ctx)
    assert (f.level, f.fix) == ("warning", None)
    assert f.message.startswith("untested: sqlsink's XA backend is tested on MariaDB 10.11 only")
    (f,) = check_version(_server("10.4.34-MariaDB"), ctx)
    assert (f.level, f.fix) == ("error", "upgrade to MariaDB 10.11")
    assert "(MDEV-742)" in f.message


def test_grants_as_mysql_and_mariadb_print_them() -> None:
    grants = parse_grants(
        [
            "GRANT USAGE ON *.* TO `u`@`%`",
            "GRANT XA_RECOVER_ADMIN ON *.* TO `u`@`%`",
            "GRANT SELECT, INSERT, UPDATE (a, b), DELETE ON `sqlsink`.* TO `u`@`%`",
            "GRANT ALL PRIVILEGES ON `shop\\_%`.* TO `u`@`%` WITH GRANT OPTION",
            "GRANT INSERT ON `other`.`t``x` TO `u`@`%`",
            "GRANT `r` TO `u`@`%`",
            "GRANT EXECUTE ON PROCEDURE `db`.`p` TO `u`@`%`",
        ]
    )
    assert grants.global_ == frozenset({"USAGE", "XA_RECOVER_ADMIN"})
    assert {"SELECT", "INSERT", "UPDATE", "DELETE"} <= grants.on_database("sqlsink")
    assert "CREATE" not in grants.on_database("sqlsink")
    assert "TRIGGER" in grants.on_database("shop_eu")
    assert "INSERT" not in grants.on_database("shopx")  # '\\_' is a literal underscore
    assert grants.on_some_table("other", "INSERT") == ["t`x"]


def test_fixes_where_the_value_comes_from() -> None:
    server = _server("10.11.6-MariaDB")
    conf = Variable(
        "wait_timeout", "20", "server (50-server.cnf)", "CONFIG", "/etc/mysql/50-server.cnf"
    )
    assert fix(server, conf, "60") == (
        "SET GLOBAL wait_timeout = 60; and wait_timeout = 60 in /etc/mysql/50-server.cnf"
    )
    line = Variable("local_infile", "OFF", "server (command line)", "COMMAND-LINE")
    assert fix(server, line, "ON") == (
        "SET GLOBAL local_infile = ON; and change --local-infile on mariadbd's command line "
        "(it outranks the configuration files)"
    )
    assert fix(_server("8.0.36"), line, "ON") == "SET PERSIST local_infile = ON"


def test_creating_the_guard_triggers_with_the_binary_log_on() -> None:
    variables = {
        "log_bin": Variable("log_bin", "ON", "server (option log-bin)", "COMPILE-TIME"),
        "log_bin_trust_function_creators": Variable(
            "log_bin_trust_function_creators", "OFF", "default", "COMPILE-TIME"
        ),
    }
    server = Server("10.11.6-MariaDB", True, (10, 11, 6), "sink@%", TARGET_DB, variables)
    (f,) = trigger_creators(
        server, parse_grants(["GRANT ALL PRIVILEGES ON `sqlsink`.* TO `sink`@`%`"])
    )
    assert (f.level, f.setting, f.value, f.source) == (
        "error",
        "log_bin_trust_function_creators",
        "OFF",
        "default",
    )
    assert f.fix == (
        "SET GLOBAL log_bin_trust_function_creators = ON; and log_bin_trust_function_creators "
        "= ON under [mariadbd] in the server's configuration; or connect once as an "
        "administrator so that the commit log is created"
    )
    assert trigger_creators(server, parse_grants(["GRANT SUPER ON *.* TO `sink`@`%`"])) == []


def test_durability_each_commit_on_disk(mariadb_server: MariaServer) -> None:
    """innodb_flush_log_at_trx_commit and (with the binary log on) sync_binlog: 1, or a
    host's crash can take back decided commits (invariant 1's durability); a warning
    naming what is lost and how the sink reports it, with the fix."""
    with global_settings(mariadb_server, innodb_flush_log_at_trx_commit=1, sync_binlog=1):
        found = _check(mariadb_server, CheckContext())
    assert found["innodb_flush_log_at_trx_commit"].level == "ok"
    assert found["sync_binlog"].level == "ok"
    with global_settings(mariadb_server, innodb_flush_log_at_trx_commit=2, sync_binlog=0):
        found = _check(mariadb_server, CheckContext())
    f = found["innodb_flush_log_at_trx_commit"]
    assert _judged(f) == (
        "warning",
        "2",
        "server (SET GLOBAL)",
        "SET GLOBAL innodb_flush_log_at_trx_commit = 1; and innodb_flush_log_at_trx_commit = "
        "1 under [mariadbd] in the server's configuration",
    )
    assert "once a second" in f.message and "data loss (never a silent gap)" in f.message
    f = found["sync_binlog"]
    assert f.level == "warning" and f.value == "0"
    assert "rolled back although its commit returned" in f.message
    assert f.fix is not None and f.fix.startswith("SET GLOBAL sync_binlog = 1;")
