"""A URL of a database the sink does not write to is refused by its scheme, in the sink's
words and before any connection: MariaDB and MySQL by name (their backend is not built),
anything else with the forms that are accepted; PostgreSQL's forms pass."""

from __future__ import annotations

import pytest

from sqlsink.conninfo import scheme_problem
from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions
from sqlsink.postgres.connection import connect


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


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("mysql://u:secret@h:3306/db", "MySQL"),
        ("jdbc:mysql://h/db", "MySQL"),
        ("mariadb://u:secret@h/db", "MariaDB"),
        ("jdbc:mariadb://h/db", "MariaDB"),
    ],
)
def test_mariadb_and_mysql_are_refused_by_name(url: str, named: str) -> None:
    problem = scheme_problem(url)
    assert problem is not None
    assert f"names a {named} server" in problem
    assert "PostgreSQL only" in problem and "postgresql://" in problem
    assert "secret" not in problem


def test_another_scheme_is_refused_with_the_accepted_forms() -> None:
    problem = scheme_problem("http://u:secret@h/db")
    assert problem is not None
    assert "http:// is not a database sqlsink writes to" in problem
    assert "key=value" in problem and "secret" not in problem


def test_the_options_refuse_it_with_the_other_problems_in_one_message() -> None:
    with pytest.raises(ConfigError) as caught:
        SinkOptions.parse({"url": "mysql://u:secret@h/db", "table": "t", "nosuch": "1"})
    text = str(caught.value)
    assert "unknown option 'nosuch'" in text and "names a MySQL server" in text
    assert "secret" not in text


def test_a_connection_is_refused_before_libpq_reads_it() -> None:
    with pytest.raises(ConfigError, match="names a MariaDB server"):
        connect("mariadb://u:secret@127.0.0.1:9/db", application_name="sqlsink test")
