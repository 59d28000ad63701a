"""The CLI's side of the seam (issue 28 item 3), without a server: the driver's errors as
the backend translates them (``Database.driver_error``), the texts the commands make of
them unchanged, and ``sqlsink check`` refused, before it connects, for a database without
``Capability.SERVER_CHECKS``."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import psycopg
import pytest

from sqlsink import cli
from sqlsink.backends import open_database
from sqlsink.cli import check, metrics
from sqlsink.cli.output import Output
from sqlsink.core.admin import AdminSession, DriverError, DriverFault
from sqlsink.core.database import Capability
from sqlsink.postgres.entry import POSTGRESQL

URL = "postgresql://nowhere.invalid/shop"


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (psycopg.errors.InsufficientPrivilege("permission denied for table x"), "PRIVILEGE"),
        (psycopg.errors.UndefinedTable("no relation sqlsink.runs"), "UNDEFINED_TABLE"),
        (psycopg.errors.QueryCanceled("canceling statement due to timeout"), "QUERY_CANCELED"),
        (psycopg.OperationalError("server closed the connection"), "CONNECTION"),
        (psycopg.errors.UniqueViolation("duplicate key"), "OTHER"),
    ],
)
def test_the_backend_names_the_kind_of_a_drivers_error(error: Exception, fault: str) -> None:
    assert open_database(URL).driver_error(error) == DriverError(DriverFault[fault], str(error))


def test_an_error_not_the_drivers_is_not_translated() -> None:
    assert POSTGRESQL.driver_error(ValueError("a bug")) is None
    assert POSTGRESQL.driver_error(KeyboardInterrupt()) is None


def test_metrics_says_what_it_said_of_the_drivers_errors() -> None:
    out = Output(False, URL, io.StringIO(), io.StringIO())
    exporter = metrics.Exporter(URL, None, 5.0, out)
    canceled = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    assert exporter._explain(canceled) == (
        "a query ran longer than --query-timeout (5s): canceling statement due to statement "
        "timeout; the next scrape tries again"
    )
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert exporter._explain(lost) == (
        "lost the connection to PostgreSQL: server closed the connection unexpectedly; "
        "the next scrape reconnects"
    )
    other = psycopg.errors.UndefinedTable("no such table")
    assert exporter._explain(other) == "PostgreSQL error: no such table"


@dataclass(frozen=True)
class WithoutChecks:
    """A database whose backend cannot judge its server's settings."""

    name: str = "OtherDB"
    capabilities: frozenset[Capability] = frozenset(Capability) - {Capability.SERVER_CHECKS}

    def open_admin(self, url: str, command: str, password_command: str | None) -> AdminSession:
        raise AssertionError("sqlsink check connected to a database it cannot check")

    def driver_error(self, exc: BaseException) -> DriverError | None:
        return None

    @property
    def schema_fix(self) -> str:
        return "install it"


def test_check_is_refused_before_connecting_where_the_backend_has_no_server_checks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(check, "open_database", lambda url: WithoutChecks())
    code = cli.main(["check", "--url", URL, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2
    assert doc["error"]["message"] == (
        "sqlsink check needs judging the server's settings (sqlsink check), which sqlsink's "
        "OtherDB backend does not have; nothing was written. Use sqlsink check with a "
        "database that has it, or go without it on this one"
    )
    assert doc["findings"] == []
