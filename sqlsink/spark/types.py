"""Spark SQL types → SQLAlchemy column types, for createTable."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from pyspark.sql import types as T
from sqlalchemy.dialects import postgresql as pg

from sqlsink.errors import ConfigError


def column_type(data_type: T.DataType, column: str) -> Any:
    """The PostgreSQL column type a Spark type is created as (see README's type table)."""
    simple: dict[type[T.DataType], Any] = {
        T.BooleanType: sa.Boolean,
        T.ByteType: sa.SmallInteger,
        T.ShortType: sa.SmallInteger,
        T.IntegerType: sa.Integer,
        T.LongType: sa.BigInteger,
        T.FloatType: sa.REAL,
        T.DoubleType: pg.DOUBLE_PRECISION,
        T.StringType: sa.Text,
        T.BinaryType: pg.BYTEA,
        T.DateType: sa.Date,
        T.TimestampNTZType: lambda: pg.TIMESTAMP(timezone=False),
        T.TimestampType: lambda: pg.TIMESTAMP(timezone=True),
    }
    for spark_type, factory in simple.items():
        if isinstance(data_type, spark_type):
            return factory()
    if isinstance(data_type, T.DecimalType):
        return sa.Numeric(data_type.precision, data_type.scale)
    if isinstance(data_type, T.ArrayType):
        return pg.ARRAY(column_type(data_type.elementType, column))
    if isinstance(data_type, (T.StructType, T.MapType)):
        return pg.JSONB()
    raise ConfigError(
        f"column {column!r}: no PostgreSQL type for Spark type {data_type.simpleString()}; "
        "cast it in Spark (e.g. to string) or create the table yourself"
    )


def table_columns(schema: T.StructType) -> list[sa.Column[Any]]:
    return [
        sa.Column(f.name, column_type(f.dataType, f.name), nullable=f.nullable)
        for f in schema.fields
    ]
