"""A feature the database lacks is refused at planning, before anything is written
(issue 28 item 3): the Spark adapters' planning asks the database's capabilities
(``core.database.require``) before it opens its loading interface. A fake database
here: no server, no Spark session (planning takes the DataFrame's schema only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pyspark.sql import types as T

from sqlsink.core.database import Capability
from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions
from sqlsink.spark import plan as spark_plan

URL = "postgresql://app@db.invalid/shop"
SCHEMA = T.StructType([T.StructField("id", T.LongType())])


@dataclass
class Lacking:
    """A database with every capability but ``lacks``; its loading is never opened."""

    lacks: Capability
    name: str = "Lackbase"
    opened: list[str] = field(default_factory=list)

    @property
    def capabilities(self) -> frozenset[Capability]:
        return frozenset(Capability) - {self.lacks}

    def loading(self) -> Any:
        self.opened.append("loading")
        raise AssertionError("planning opened the loading interface before refusing")


@pytest.mark.parametrize(
    ("lacks", "given", "wanted_by"),
    [
        (Capability.CONSISTENT_VIEW, {"consistentView": "shop_view"}, "consistentView"),
        (Capability.UPSERT, {"mode": "upsert", "keyColumns": "id"}, "mode=upsert"),
        (Capability.SCHEMA_EVOLUTION, {"schemaEvolution": "addColumns"}, "schemaEvolution"),
        (Capability.BULK_LOAD, {}, "the sink's load"),
    ],
)
def test_planning_refuses_what_the_database_cannot_do(
    monkeypatch: pytest.MonkeyPatch, lacks: Capability, given: dict[str, str], wanted_by: str
) -> None:
    database = Lacking(lacks)
    monkeypatch.setattr(spark_plan, "database_of", lambda options: database)
    options = SinkOptions.parse({"url": URL, "table": "orders", **given})
    with pytest.raises(ConfigError) as caught:
        spark_plan.plan_write(options, SCHEMA, "orders")
    assert str(caught.value) == (
        f"{wanted_by} needs {lacks.value}, which sqlsink's Lackbase backend does not have; "
        f"nothing was written. Use {wanted_by} with a database that has it, or go without it "
        "on this one"
    )
    assert database.opened == []  # refused before any session, so before anything written


def test_postgresql_has_every_capability_planning_asks_for() -> None:
    from sqlsink.backends import open_database

    database = open_database(URL)
    for given in (
        {"mode": "upsert", "keyColumns": "id", "schemaEvolution": "widen"},
        {"consistentView": "v"},
    ):
        options = SinkOptions.parse({"url": URL, "table": "t", **given})
        spark_plan.require_capabilities(database, options)  # nothing refused


def test_the_spark_types_are_made_by_the_database() -> None:
    """createTable's columns: the Spark type's kind, the database's type for it, and
    the refusal of a type it has none for, in the words it had before the seam."""
    from sqlsink.backends import open_database
    from sqlsink.spark.types import column_type

    database = open_database(URL)
    made = column_type(T.ArrayType(T.DecimalType(10, 2)), "prices", database)
    from sqlalchemy.dialects import postgresql

    assert made.compile(dialect=postgresql.dialect()) == "NUMERIC(10, 2)[]"
    with pytest.raises(ConfigError) as caught:
        column_type(T.ArrayType(T.ArrayType(T.IntegerType())), "grid", database)
    assert str(caught.value) == (
        "column 'grid': no PostgreSQL type for Spark type array<array<int>>; cast it in "
        "Spark (e.g. to string) or create the table yourself"
    )
    with pytest.raises(ConfigError, match="for Spark type interval day to second;"):
        column_type(T.ArrayType(T.DayTimeIntervalType()), "waits", database)
