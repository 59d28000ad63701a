"""The database a URL names, by its scheme (issue 28 item 3, issue 31): PostgreSQL's forms
and MariaDB's/MySQL's pass and open their backend; anything else is refused in the sink's
words with the accepted forms, before any connection. A MariaDB URL's parts are read
without a server, and its password is never shown. What MariaDB's backend lacks is
refused at planning with the reason (no server needed: refused before any session)."""

from __future__ import annotations

import logging

import pytest
from pyspark.sql import types as T

from sqlsink.backends import open_database
from sqlsink.conninfo import params_of, redact, scheme_problem, secrets_of, shown
from sqlsink.core.admin import DriverFault
from sqlsink.core.database import Capability
from sqlsink.errors import ConfigError
from sqlsink.mariadb import loading as maria_loading
from sqlsink.options import SinkOptions
from sqlsink.postgres.connection import connect
from sqlsink.spark import plan as spark_plan


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@h:5432/db",
        "postgres://h/db",
        "POSTGRESQL://h/db",
        "jdbc:postgresql://h:5432/db?sslmode=require",
        "host=h dbname=db user=u",
        "",
    ],
)
def test_postgresql_urls_pass(url: str) -> None:
    assert scheme_problem(url) is None
    assert open_database(url or "host=h").name == "PostgreSQL"


@pytest.mark.parametrize(
    "url",
    [
        "mysql://u:secret@h:3306/db",
        "jdbc:mysql://h/db",
        "mariadb://u:secret@h/db",
        "jdbc:mariadb://h/db",
        "MariaDB://h:3307/db",
    ],
)
def test_mariadb_and_mysql_urls_open_the_mariadb_backend(url: str) -> None:
    assert scheme_problem(url) is None
    database = open_database(url)
    assert database.name == "MariaDB"
    assert database.capabilities == frozenset(
        {
            Capability.BULK_LOAD,
            Capability.UPSERT,
            Capability.ADMIN_COMMANDS,
            Capability.SERVER_CHECKS,
        }
    )


def test_a_mariadb_urls_parts() -> None:
    got = params_of("jdbc:mariadb://app:p%40ss%3Aw@db.example:3307/shop?connectTimeout=5")
    assert got == {
        "user": "app",
        "password": "p@ss:w",
        "host": "db.example",
        "port": 3307,
        "dbname": "shop",
        "connectTimeout": "5",
    }
    jdbc = params_of("jdbc:mysql://db/shop?user=app&password=s3cret")
    assert (jdbc["user"], jdbc["password"], jdbc["port"], jdbc["dbname"]) == (
        "app",
        "s3cret",
        None,
        "shop",
    )
    bare = params_of("mariadb://h")
    assert (bare["user"], bare["password"], bare["dbname"]) == (None, None, None)


@pytest.mark.parametrize(
    "url",
    [
        "mariadb://app:s3cret@h:3306/shop",
        "jdbc:mariadb://app:s3cret@h:3306/shop",
        "jdbc:mysql://h:3306/shop?user=app&password=s3cret",
        "mysql://app:s3cret@h:notaport/shop",  # unreadable: still never shown
    ],
)
def test_a_mariadb_urls_password_is_never_shown(url: str) -> None:
    assert "s3cret" not in shown(url) and "s3cret" not in redact(url)
    assert "***" in shown(url)
    if "notaport" not in url:
        assert "s3cret" in secrets_of(url)


def test_an_unreadable_mariadb_url_is_refused_without_its_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        params_of("mariadb://app:s3cret@h:notaport/shop")
    assert "s3cret" not in str(caught.value) and "percent-encode" in str(caught.value)


def test_an_unqualified_table_is_in_the_urls_database() -> None:
    options = SinkOptions.parse({"url": "mariadb://app@h/shop", "table": "orders"})
    assert (options.table.schema, options.table.name) == ("shop", "orders")
    other = SinkOptions.parse({"url": "mariadb://app@h/shop", "table": "sales.orders"})
    assert (other.table.schema, other.table.name) == ("sales", "orders")
    pg = SinkOptions.parse({"url": "postgresql://app@h/shop", "table": "orders"})
    assert pg.table.schema == "public"


def test_tls_options_are_refused_on_a_mariadb_url() -> None:
    with pytest.raises(ConfigError, match="libpq's"):
        SinkOptions.parse({"url": "mariadb://app@h/shop", "table": "t", "sslmode": "require"})


def test_another_scheme_is_refused_with_the_accepted_forms() -> None:
    problem = scheme_problem("http://u:secret@h/db")
    assert problem is not None
    assert "http:// is not a database sqlsink writes to" in problem
    assert "key=value" in problem and "mariadb://" in problem and "secret" not in problem


def test_the_options_refuse_it_with_the_other_problems_in_one_message() -> None:
    with pytest.raises(ConfigError) as caught:
        SinkOptions.parse({"url": "http://u:secret@h/db", "table": "t", "nosuch": "1"})
    text = str(caught.value)
    assert "unknown option 'nosuch'" in text and "http:// is not a database" in text
    assert "secret" not in text


def test_postgresqls_connection_refuses_a_mariadb_url_before_libpq_reads_it() -> None:
    with pytest.raises(ConfigError, match="names a MariaDB server") as caught:
        connect("mariadb://u:secret@127.0.0.1:9/db", application_name="sqlsink test")
    assert "secret" not in str(caught.value)


SCHEMA = T.StructType([T.StructField("id", T.LongType())])
URL = "mariadb://app:s3cret@db.invalid:3306/shop"


@pytest.mark.parametrize(
    ("given", "wanted_by", "lacks"),
    [
        ({"schemaEvolution": "addColumns"}, "schemaEvolution", Capability.SCHEMA_EVOLUTION),
        ({"consistentView": "shop_view"}, "consistentView", Capability.CONSISTENT_VIEW),
    ],
)
def test_mariadb_planning_refuses_what_it_lacks_before_any_session(
    given: dict[str, str], wanted_by: str, lacks: Capability
) -> None:
    """db.invalid: a connection would fail differently; the refusal comes first."""
    options = SinkOptions.parse({"url": URL, "table": "orders", **given})
    with pytest.raises(ConfigError) as caught:
        spark_plan.plan_write(options, SCHEMA, "orders")
    assert str(caught.value) == (
        f"{wanted_by} needs {lacks.value}, which sqlsink's MariaDB backend does not have; "
        f"nothing was written. Use {wanted_by} with a database that has it, or go without it "
        "on this one"
    )


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"semantic": "at_least_once"}, "semantic=at_least_once is not built on MariaDB"),
        ({"deadLetterTable": "bad_rows"}, "deadLetterTable is not built on MariaDB"),
    ],
)
def test_mariadb_planning_refuses_postgresql_only_options(
    given: dict[str, str], reason: str
) -> None:
    options = SinkOptions.parse({"url": URL, "table": "orders", **given})
    with pytest.raises(ConfigError, match=reason) as caught:
        spark_plan.plan_write(options, SCHEMA, "orders")
    assert "Nothing was written" in str(caught.value) and "s3cret" not in str(caught.value)


def test_the_cli_opens_a_mariadb_url_and_tells_its_drivers_errors() -> None:
    """The operator's commands on MariaDB (tests/mariadb/test_cli.py runs them): a connect
    that fails is said in the sink's words (a TransientError naming the server and why,
    never "lost the connection": atk-mdb3), quoting no secret; PyMySQL's own errors of
    the session (here a plain connect's) are told apart by driver_error."""
    from sqlsink.errors import TransientError
    from sqlsink.mariadb.connection import connect

    database = open_database(URL)
    assert Capability.ADMIN_COMMANDS in database.capabilities
    with pytest.raises(TransientError) as caught:
        database.open_admin(URL, "status", None)
    text = str(caught.value)
    assert text.startswith("cannot connect to MariaDB at db.invalid:3306"), text
    assert "host name does not resolve" in text and "s3cret" not in text, text
    with pytest.raises(Exception) as raw:
        connect(URL)
    failed = database.driver_error(raw.value)
    assert failed is not None and failed.fault is DriverFault.CONNECTION, raw.value
    assert "s3cret" not in failed.diag and database.driver_error(ValueError("x")) is None


@pytest.mark.parametrize(
    ("version", "refused", "warned"),
    [
        ("10.11.6-MariaDB-0+deb12u1-log", False, False),
        ("11.4.2-MariaDB", False, True),  # untested
        ("10.4.32-MariaDB", True, False),  # MDEV-742
        ("8.0.29", True, False),
        ("5.7.44-log", True, False),
        ("8.0.30", False, True),
        ("8.4.3", False, True),
    ],
)
def test_the_servers_version_mysql_before_8030_refused_newer_untested(
    version: str, refused: bool, warned: bool
) -> None:
    refusal, warning = maria_loading.server_verdict(version)
    assert (refusal is not None, warning is not None) == (refused, warned)
    if refusal is not None:
        assert ("older than 8.0.30" in refusal and "binary log" in refusal) or (
            "older than 10.5" in refusal and "MDEV-742" in refusal
        )
    if warning is not None:
        assert "untested" in warning


def test_mysql_untested_is_a_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="sqlsink"):
        # the server's answer to SELECT VERSION() (no MySQL server can be installed here)
        maria_loading.judge_version("8.0.36-unit-test")
        maria_loading.judge_version("8.0.36-unit-test")
    said = [r for r in caplog.records if "untested" in r.getMessage()]
    assert len(said) == 1 and "MySQL 8.0.36-unit-test" in said[0].getMessage()


def test_mariadb_planning_refuses_replace_before_any_session() -> None:
    from sqlsink.mariadb.loading import LOADING

    options = SinkOptions.parse({"url": URL, "table": "orders", "mode": "replace"})
    with pytest.raises(ConfigError, match="replace") as caught:
        LOADING.plan(
            options,
            key="orders",
            sink_id="s",
            field_names=["id"],
            create_columns=None,
            arrow_schema=lambda: None,
            column_type=None,
            before_changes=None,
        )
    assert "DDL ends a transaction" in str(caught.value)


def test_the_option_password_reaches_the_executors_url_and_is_scrubbed() -> None:
    from sqlsink.mariadb.loading import LOADING, session_url

    options = SinkOptions.parse(
        {"url": "mariadb://app@h:3306/shop", "table": "orders", "password": "p@ss w&rd"}
    )
    assert params_of(session_url(options))["password"] == "p@ss w&rd"
    text = f"failed: {session_url(options)} said p@ss w&rd"
    scrubbed = LOADING.scrub(text, options)
    assert "p@ss" not in scrubbed and "w&rd" not in scrubbed
