"""The Spark adapters' interface on MariaDB (sqlsink/mariadb/loading.py) against a real
server: the table matched against the DataFrame with every problem in one message,
createTable through SQLAlchemy's MySQL dialect, the run's end record. No Spark session:
planning takes the DataFrame's schema only."""

from __future__ import annotations

import uuid

import pytest
from pyspark.sql import types as T

from sqlsink.errors import ConfigError
from sqlsink.mariadb.connection import connect, execute, rows
from sqlsink.options import SinkOptions
from sqlsink.spark.plan import plan_write
from tests.fix_mariadb import TARGET_DB, MariaServer

SCHEMA = T.StructType(
    [
        T.StructField("ID", T.LongType(), False),
        T.StructField("name", T.StringType()),
        T.StructField("amount", T.DecimalType(38, 10)),
        T.StructField("at", T.TimestampType()),
    ]
)


def _options(server: MariaServer, table: str, **more: str) -> SinkOptions:
    return SinkOptions.parse({"url": server.url(), "table": table, **more})


def test_a_missing_table_is_refused_before_any_data(mariadb_server: MariaServer) -> None:
    table = f"absent_{uuid.uuid4().hex[:6]}"
    with pytest.raises(ConfigError, match="does not exist") as caught:
        plan_write(_options(mariadb_server, table), SCHEMA, "t")
    assert "createTable=true" in str(caught.value)
    assert "sink-pw" not in str(caught.value)


def test_every_mismatch_in_one_message(mariadb_server: MariaServer) -> None:
    table = f"mismatch_{uuid.uuid4().hex[:6]}"
    conn = connect(mariadb_server.url())
    execute(
        conn,
        f"CREATE TABLE `{table}` (id bigint NOT NULL, name text, required_col int NOT NULL, "
        "at datetime(6)) ENGINE=MyISAM",
    )
    conn.close()
    with pytest.raises(ConfigError) as caught:
        plan_write(_options(mariadb_server, table), SCHEMA, "t")
    text = str(caught.value)
    assert "engine is MyISAM" in text
    assert "DataFrame column 'amount' is not in the table" in text
    assert "table column 'required_col' is NOT NULL without a default" in text
    assert text.endswith("Nothing was written")


def test_create_table_through_the_mysql_dialect_then_matched(mariadb_server: MariaServer) -> None:
    table = f"created_{uuid.uuid4().hex[:6]}"
    options = _options(mariadb_server, table, createTable="true")
    plan = plan_write(options, SCHEMA, "t")
    assert plan.key == ()
    assert getattr(plan, "columns") == ("ID", "name", "amount", "at")  # noqa: B009
    conn = connect(mariadb_server.url())
    found = rows(
        conn,
        "SELECT column_name, column_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (TARGET_DB, table),
    )
    engine = rows(
        conn,
        "SELECT engine FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
        (TARGET_DB, table),
    )
    conn.close()
    assert [(str(c), str(t), str(n)) for c, t, n in found] == [
        ("ID", "bigint(20)", "NO"),
        ("name", "longtext", "YES"),
        ("amount", "decimal(38,10)", "YES"),
        ("at", "datetime(6)", "YES"),
    ]
    assert engine[0][0] == "InnoDB"
    again = plan_write(options, SCHEMA, "t")  # exists now: matched, not created again
    assert getattr(again, "columns") == ("ID", "name", "amount", "at")  # noqa: B009


def test_a_column_matched_whatever_its_case(mariadb_server: MariaServer) -> None:
    table = f"cased_{uuid.uuid4().hex[:6]}"
    conn = connect(mariadb_server.url())
    execute(
        conn,
        f"CREATE TABLE `{table}` (Id bigint NOT NULL, NAME text, amount decimal(38,10), "
        "at datetime(6), extra int NOT NULL DEFAULT 7, "
        "auto bigint NOT NULL AUTO_INCREMENT UNIQUE) ENGINE=InnoDB",
    )
    conn.close()
    plan = plan_write(_options(mariadb_server, table), SCHEMA, "t")
    assert getattr(plan, "columns") == ("Id", "NAME", "amount", "at")  # noqa: B009


def test_a_run_end_of_an_unknown_run_is_not_recorded(mariadb_server: MariaServer) -> None:
    from sqlsink.mariadb.loading import LOADING

    options = _options(mariadb_server, "whatever")
    assert LOADING.record_run_end(options, "no-such-sink", "no-run", "stopped", None) is False
