"""Server-settings checks, the analysis half: the rules and their logging, without a server.

The same rules against real PostgreSQL are in tests/pg/test_checks.py.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from sqlsink.postgres import checks
from sqlsink.postgres.checks import (
    ERROR,
    OK,
    WARNING,
    Finding,
    ServerSettings,
    Setting,
    analyse,
    describe_source,
    fix_statement,
    format_seconds,
    log_findings,
    quote_ident,
    recommended,
)

CONF = "configuration file"

# -- the rules, without a server ----------------------------------------------------------


def setting(
    name: str, value: str, setting: str, unit: str | None = "ms", source: str = CONF
) -> Setting:
    sourcefile = "/data/postgresql.conf" if source == CONF else None
    return Setting(name, value, setting, unit, source, sourcefile)


def server(*values: Setting, version: int = 160004, in_use: int = 0) -> ServerSettings:
    """A healthy PostgreSQL 16 server, with ``values`` replacing its settings."""
    base = {
        "max_prepared_transactions": setting("max_prepared_transactions", "64", "64", None),
        **{
            name: setting(name, "0", "0", source="default")
            for name in checks.TIMEOUTS
            if name != "transaction_timeout" or version >= 170000
        },
    }
    base.update({s.name: s for s in values})
    return ServerSettings("app", "shop", version, base, prepared_in_use=in_use)


def timeout(name: str, seconds: float, source: str = CONF) -> Setting:
    return setting(name, format_seconds(seconds), str(int(seconds * 1000)), "ms", source)


def judge(
    settings: ServerSettings,
    *,
    trigger: float | None = None,
    partitions: int | None = None,
    slowest: float | None = None,
    **kwargs: Any,
) -> dict[str, Finding]:
    found = analyse(
        settings,
        trigger_interval_s=trigger,
        partitions=partitions,
        slowest_write_s=slowest,
        **kwargs,
    )
    by_name = {f.setting: f for f in found}
    assert len(by_name) == len(found), "one finding per setting"
    return by_name


def test_a_healthy_server_has_only_ok_findings() -> None:
    found = judge(server())
    assert set(found) == {
        "max_prepared_transactions",
        "statement_timeout",
        "idle_in_transaction_session_timeout",
        "lock_timeout",
        "idle_session_timeout",
    }
    assert {f.level for f in found.values()} == {OK}
    assert all(f.fix is None and f.message for f in found.values())
    assert found["statement_timeout"].source == "default"


@pytest.mark.parametrize(
    ("partitions", "in_use", "level", "says"),
    [
        (None, 5, OK, "at most partitions + 2 at once (5 in use now, cluster-wide, of 97 open"),
        (40, 5, OK, "room for the up to 42 connections a batch of 40 partitions holds"),
        (96, 0, WARNING, "a batch of 96 partitions may hold 98 connections at once"),
        (80, 30, WARNING, "only 67 connections are free now"),
    ],
)
def test_connections_against_the_partitions_of_a_batch(
    partitions: int | None, in_use: int, level: str, says: str
) -> None:
    """max_connections 100, 3 reserved for superusers: 97 for the sink's role; a batch
    holds one connection per running task plus the driver's planner and committer."""
    settings = server(
        setting("max_connections", "100", "100", None),
        setting("superuser_reserved_connections", "3", "3", None, source="default"),
    )
    settings = ServerSettings(
        settings.role,
        settings.database,
        settings.server_version_num,
        settings.settings,
        connections_in_use=in_use,
    )
    found = judge(settings, partitions=partitions)["max_connections"]
    assert found.level == level
    assert says in found.message
    if level == WARNING:
        assert found.fix is not None and "max_connections" in found.fix
        assert "maxPartitions" in found.message or "maxPartitions" in found.fix


@pytest.mark.parametrize(
    ("partitions", "slots", "in_use", "level", "needed"),
    [
        (None, 0, 0, ERROR, 64),
        (10, 0, 0, ERROR, 64),
        (100, 0, 0, ERROR, 200),
        (100, 64, 0, ERROR, 200),  # fewer than the partitions: no batch can ever commit
        (40, 64, 0, WARNING, 80),  # fewer than 2 x partitions
        (40, 80, 0, OK, None),
        (None, 1, 0, OK, None),  # unknown partitions: any slot is enough to say
        (40, 80, 50, WARNING, None),  # enough slots, but leftovers hold them
    ],
)
def test_prepared_transaction_slots(
    partitions: int | None, slots: int, in_use: int, level: str, needed: int | None
) -> None:
    mpt = setting("max_prepared_transactions", str(slots), str(slots), None)
    found = judge(server(mpt, in_use=in_use), partitions=partitions)["max_prepared_transactions"]
    assert (found.level, found.value, found.source) == (
        level,
        str(slots),
        "server (postgresql.conf)",
    )
    if slots == 0:
        assert found.message.startswith(
            "prepared transactions are disabled on this server: set max_prepared_transactions "
            f"to at least {needed} and restart"
        )
    if needed is not None:
        assert (
            found.fix
            == f"ALTER SYSTEM SET max_prepared_transactions = {needed}; -- then restart PostgreSQL"
        )
        assert str(needed) in found.message
    if in_use:
        assert "only 30 of 80" in found.message and "sqlsink recover" in (found.fix or "")


def test_prepared_transactions_not_needed_without_exactly_once() -> None:
    mpt = setting("max_prepared_transactions", "0", "0", None, source="default")
    found = judge(server(mpt), exactly_once=False)["max_prepared_transactions"]
    assert found.level == OK and "semantic=exactly_once" in found.message
    found = judge(server(mpt))["max_prepared_transactions"]
    assert found.level == ERROR and found.source == "default"


def test_max_prepared_transactions_on_the_command_line_needs_a_restart_with_it() -> None:
    mpt = setting("max_prepared_transactions", "0", "0", None, source="command line")
    found = judge(server(mpt))["max_prepared_transactions"]
    assert found.source == "server (command line)"
    assert found.fix is not None and "-c max_prepared_transactions=64" in found.fix


@pytest.mark.parametrize(
    ("trigger", "slowest", "factor", "required"),
    [
        (None, None, 3.0, 600.0),  # the conservative floor
        (0.0, None, 3.0, 600.0),  # trigger 0 (as fast as possible) says nothing
        (10.0, None, 3.0, 10.0),
        (None, 12.0, 3.0, 36.0),
        (10.0, 12.0, 3.0, 36.0),
        (60.0, 12.0, 3.0, 60.0),
        (10.0, 12.0, 2.0, 24.0),
        (0.0, 5.0, 3.0, 15.0),
    ],
)
@pytest.mark.parametrize(
    "name", ["statement_timeout", "idle_in_transaction_session_timeout", "transaction_timeout"]
)
def test_transaction_timeouts_against_the_required_time(
    name: str, trigger: float | None, slowest: float | None, factor: float, required: float
) -> None:
    def verdict(seconds: float) -> Finding:
        settings = server(timeout(name, seconds), version=170002)
        found = judge(settings, trigger=trigger, slowest=slowest, safety_factor=factor)
        return found[name]

    below, at = verdict(required - 0.001), verdict(required)
    assert at.level == OK and at.fix is None
    assert below.level == WARNING
    assert f"is shorter than {_compared(trigger, slowest, factor)}" in below.message
    assert below.fix == (
        f"ALTER SYSTEM SET {name} = {recommended(required)}; SELECT pg_reload_conf();"
    )
    assert "ALTER ROLE app SET" in below.message  # the narrower alternative
    assert verdict(0).level == OK


def _compared(trigger: float | None, slowest: float | None, factor: float) -> str:
    if not trigger and slowest is None:
        return "the conservative floor of 10min"
    if not trigger:
        return f"{factor:g} x the slowest partition write"
    if slowest is None:
        return f"the trigger interval ({format_seconds(trigger)})"
    return f"the longer of the trigger interval ({format_seconds(trigger)}) and {factor:g} x"


def test_the_brief_example_a_30s_idle_timeout_and_a_10s_trigger() -> None:
    settings = server(timeout("idle_in_transaction_session_timeout", 30))
    name = "idle_in_transaction_session_timeout"
    assert judge(settings, trigger=10)[name].level == OK
    assert judge(settings, trigger=10, slowest=9)[name].level == OK  # 27s
    slow = judge(settings, trigger=10, slowest=12)[name]  # 36s
    assert slow.level == WARNING
    assert "3 x the slowest partition write (3 x 12s = 36s), i.e. 36s" in slow.message
    assert slow.fix == (
        "ALTER SYSTEM SET idle_in_transaction_session_timeout = '1min'; SELECT pg_reload_conf();"
    )
    assert judge(settings)[name].level == WARNING  # nothing known: below the 10min floor


def test_transaction_timeout_only_from_postgresql_17() -> None:
    tt = timeout("transaction_timeout", 5)
    assert "transaction_timeout" not in judge(server(tt, version=160004))
    found = judge(server(tt, version=170000))["transaction_timeout"]
    assert found.level == WARNING and "PREPARE TRANSACTION" in found.message


@pytest.mark.parametrize(
    ("seconds", "level"), [(0, OK), (1, WARNING), (9.999, WARNING), (10, OK), (120, OK)]
)
def test_lock_timeout_is_replaced_on_the_sinks_sessions_and_bounds_only_create_table(
    seconds: float, level: str
) -> None:
    found = judge(server(timeout("lock_timeout", seconds, source="user")))["lock_timeout"]
    assert found.level == level
    assert (
        "the sink's tasks and commit set their own lock_timeout on every session (option "
        "lockTimeout, default 60s), and every wait for the sink's lock sets its own bound, "
        "so this value is replaced there" in found.message
    )
    assert "it still applies to the planner's session" in found.message
    assert "pg_advisory_lock" not in found.message and "committer" not in found.message
    if seconds == 0:
        assert "that CREATE TABLE waits as long as it takes" in found.message
    if level == WARNING:
        assert found.message.startswith(
            f"lock_timeout = {found.value}, from role app, is shorter than 10s: "
        )
        assert (
            "that CREATE TABLE waits at most this long for locks on the target's schema or "
            "for another session creating the same table; a wait that gives up fails the "
            "query at its start (nothing written)" in found.message
        )
        assert found.fix == "ALTER ROLE app SET lock_timeout = '1min'"
        assert found.source == "role app"
    else:
        assert found.fix is None


def test_idle_session_timeout_against_the_trigger_interval() -> None:
    def verdict(seconds: float, trigger: float | None) -> Finding:
        return judge(server(timeout("idle_session_timeout", seconds)), trigger=trigger)[
            "idle_session_timeout"
        ]

    short = verdict(60, 120)
    assert short.level == WARNING and "the trigger interval (2min)" in short.message
    assert short.fix == "ALTER SYSTEM SET idle_session_timeout = '5min'; SELECT pg_reload_conf();"
    assert verdict(120, 120).level == OK
    assert verdict(60, 30).level == OK
    unknown = verdict(300, None)
    assert unknown.level == WARNING and "floor of 10min" in unknown.message
    assert unknown.fix is not None and "'15min'" in unknown.fix
    assert verdict(600, None).level == OK
    # the slowest write has nothing to do with an idle session
    found = analyse(
        server(timeout("idle_session_timeout", 60)),
        trigger_interval_s=30,
        partitions=None,
        slowest_write_s=1000,
    )
    assert {f.setting: f.level for f in found}["idle_session_timeout"] == OK


SOURCES = [
    # pg_settings.source, the words, the fix for statement_timeout = '15min'
    (
        "default",
        "default",
        "ALTER SYSTEM SET statement_timeout = '15min'; SELECT pg_reload_conf();",
    ),
    (
        CONF,
        "server (postgresql.conf)",
        "ALTER SYSTEM SET statement_timeout = '15min'; SELECT pg_reload_conf();",
    ),
    ("command line", "server (command line)", "ALTER ROLE \"App\" SET statement_timeout = '15min'"),
    ("global", "all roles (ALTER ROLE ALL)", "ALTER ROLE ALL SET statement_timeout = '15min'"),
    ("database", "database my shop", "ALTER DATABASE \"my shop\" SET statement_timeout = '15min'"),
    ("user", "role App", "ALTER ROLE \"App\" SET statement_timeout = '15min'"),
    (
        "database user",
        "role App in database my shop",
        'ALTER ROLE "App" IN DATABASE "my shop" SET statement_timeout = \'15min\'',
    ),
    ("session", "session", "SET statement_timeout = '15min'"),
    ("client", "connection options (PGOPTIONS or options= in the URL)", None),
]


@pytest.mark.parametrize(("source", "words", "fix"), SOURCES)
def test_sources_and_fixes(source: str, words: str, fix: str | None) -> None:
    settings = ServerSettings("App", "my shop", 160004, {})
    s = timeout("statement_timeout", 5, source=source)
    assert describe_source(s, settings) == words
    statement = fix_statement(s, "'15min'", settings)
    if fix is None:
        assert "options=" in statement and "-c statement_timeout=15min" in statement
    else:
        assert statement == fix


def test_configuration_file_without_its_name() -> None:
    s = Setting("statement_timeout", "5s", "5000", "ms", CONF, None)  # not a superuser
    assert describe_source(s, server()) == "server (configuration file)"


@pytest.mark.parametrize(
    ("name", "sql_text"),
    [
        ("app", "app"),
        ("app_2$", "app_2$"),
        ("App", '"App"'),
        ("user", '"user"'),
        ("select", '"select"'),
        ("my-db", '"my-db"'),
        ("1st", '"1st"'),
        ('we"ird', '"we""ird"'),
        ("", '""'),
    ],
)
def test_quote_ident(name: str, sql_text: str) -> None:
    assert quote_ident(name) == sql_text


@pytest.mark.parametrize(
    ("seconds", "literal"),
    [
        (0.5, "'1min'"),
        (60, "'1min'"),
        (61, "'5min'"),
        (600, "'15min'"),
        (3600, "'1h'"),
        (86401, "'25h'"),
    ],
)
def test_recommended_values(seconds: float, literal: str) -> None:
    assert recommended(seconds) == literal
    assert recommended(10**7) == "0"  # beyond what the int-millisecond setting holds: off


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.5, "500ms"),
        (1, "1s"),
        (36, "36s"),
        (90, "90s"),
        (600, "10min"),
        (7200, "2h"),
        (86400, "1d"),
    ],
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


# -- logging once per verdict -------------------------------------------------------------


def _finding(level: str, value: str = "5s", setting: str = "statement_timeout") -> Finding:
    return Finding(level, setting, value, "role app", f"{setting} is {value}", "ALTER ROLE ...")


def test_log_findings_logs_once_then_only_on_change(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlsink")
    state: dict[str, checks.Verdict] = {}
    ok = _finding(OK, "0", "lock_timeout")
    first = [_finding(WARNING), ok, _finding(ERROR, "0", "max_prepared_transactions")]

    def logged(findings: list[Finding], key: str = "q1") -> list[tuple[int, str]]:
        caplog.clear()
        log_findings(findings, key, state=state)
        return [(r.levelno, r.getMessage()) for r in caplog.records]

    records = logged(first)
    assert [level for level, _ in records] == [logging.WARNING, logging.ERROR]
    assert (
        "statement_timeout = 5s (role app)" in records[0][1] and "fix: ALTER ROLE" in records[0][1]
    )
    assert all("q1" in text for _, text in records)
    assert logged(first) == []  # the same verdict: silence
    assert logged(list(reversed(first))) == []  # order does not matter
    assert logged([*first, _finding(OK, "1s", "idle_session_timeout")]) == []  # ok: not a verdict
    assert len(logged(first, key="q2")) == 2  # another query has its own
    changed = logged([_finding(WARNING, "6s"), first[2]])
    assert len(changed) == 2 and "statement_timeout = 6s" in changed[0][1]
    fixed = logged([ok])
    assert [level for level, _ in fixed] == [logging.INFO] and "now fine" in fixed[0][1]
    assert logged([ok]) == []
    assert set(state) == {"q1", "q2"}


def test_log_findings_of_a_healthy_server_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sqlsink")
    state: dict[str, checks.Verdict] = {}
    assert not log_findings([_finding(OK)], "q", state=state)
    assert caplog.records == [] and state == {"q": frozenset()}


def test_log_findings_default_state_and_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sqlsink")
    key = f"default-{uuid.uuid4().hex}"
    assert log_findings([_finding(WARNING)], key)
    assert not log_findings([_finding(WARNING)], key)
    assert [r.name for r in caplog.records] == ["sqlsink"]
    mine = logging.getLogger("tests.checks")
    assert log_findings([_finding(WARNING)], key, logger=mine, state={})
    assert caplog.records[-1].name == "tests.checks"
