"""Spark SQL types: the PostgreSQL column each is created as (createTable), and the
Arrow type Spark sends it as (for the target's type check before any data)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import types as T

from sqlsink.errors import ConfigError

if TYPE_CHECKING:
    import sqlalchemy as sa


def column_type(data_type: T.DataType, column: str) -> Any:
    """The PostgreSQL column type a Spark type is created as (see docs/reference/types.md)."""
    import sqlalchemy as sa  # DDL only: createTable (its import costs ~0.1 s a process)
    from sqlalchemy.dialects import postgresql as pg

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
    # an array of arrays has none: PostgreSQL's arrays do not nest (int[][] is int[])
    if isinstance(data_type, T.ArrayType) and not isinstance(data_type.elementType, T.ArrayType):
        return pg.ARRAY(column_type(data_type.elementType, column))
    if isinstance(data_type, (T.StructType, T.MapType)):
        return pg.JSONB()
    raise ConfigError(
        f"column {column!r}: no PostgreSQL type for Spark type {data_type.simpleString()}; "
        "cast it in Spark (e.g. to string) or create the table yourself"
    )


def table_columns(schema: T.StructType) -> list[sa.Column[Any]]:
    import sqlalchemy as sa

    return [
        sa.Column(f.name, column_type(f.dataType, f.name), nullable=f.nullable)
        for f in schema.fields
    ]


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of the batches Spark hands a writer for ``schema``.

    Written here from public types only: PySpark's own converter is internal and its
    signature changed between 4.1 and 4.2 (issue 14). Timestamps are labelled UTC; the
    label does not change what the encoder accepts."""
    return pa.schema([pa.field(f.name, arrow_type(f.dataType, f.name), f.nullable) for f in schema])


_ARROW_SIMPLE: dict[type[T.DataType], pa.DataType] = {
    T.BooleanType: pa.bool_(),
    T.ByteType: pa.int8(),
    T.ShortType: pa.int16(),
    T.IntegerType: pa.int32(),
    T.LongType: pa.int64(),
    T.FloatType: pa.float32(),
    T.DoubleType: pa.float64(),
    T.StringType: pa.string(),
    T.BinaryType: pa.binary(),
    T.DateType: pa.date32(),
    T.TimestampType: pa.timestamp("us", tz="UTC"),
    T.TimestampNTZType: pa.timestamp("us"),
    T.DayTimeIntervalType: pa.duration("us"),
    T.NullType: pa.null(),
}
if hasattr(T, "TimeType"):  # PySpark 4.1 and later
    _ARROW_SIMPLE[T.TimeType] = pa.time64("ns")


def arrow_type(data_type: T.DataType, column: str) -> pa.DataType:
    """The Arrow type of one Spark type (nested types element by element)."""
    for spark_type, arrow in _ARROW_SIMPLE.items():
        if isinstance(data_type, spark_type):
            return arrow
    if isinstance(data_type, T.DecimalType):
        return pa.decimal128(data_type.precision, data_type.scale)
    if isinstance(data_type, T.ArrayType):
        element = arrow_type(data_type.elementType, column)
        return pa.list_(pa.field("element", element, data_type.containsNull))
    if isinstance(data_type, T.MapType):
        key = pa.field("key", arrow_type(data_type.keyType, column), False)
        value = arrow_type(data_type.valueType, column)
        return pa.map_(key, pa.field("value", value, data_type.valueContainsNull))
    if isinstance(data_type, T.StructType):
        return pa.struct(
            [pa.field(f.name, arrow_type(f.dataType, column), f.nullable) for f in data_type]
        )
    if isinstance(data_type, T.UserDefinedType):
        return arrow_type(data_type.sqlType(), column)
    raise ConfigError(
        f"column {column!r}: Spark type {data_type.simpleString()} cannot be written to "
        "PostgreSQL by sqlsink; cast it in Spark (e.g. to string) first"
    )
