"""Spark SQL types: the column each is created as (createTable, schema evolution; the
database makes its type from the Spark type's :class:`~sqlsink.core.loading.ColumnKind`),
and the Arrow type Spark sends it as (for the target's type check before any data)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import types as T

from sqlsink.errors import ConfigError

if TYPE_CHECKING:
    from sqlsink.core.database import Database
    from sqlsink.core.loading import ColumnKind

_KINDS: dict[type[T.DataType], str] = {
    T.BooleanType: "boolean",
    T.ByteType: "int8",
    T.ShortType: "int16",
    T.IntegerType: "int32",
    T.LongType: "int64",
    T.FloatType: "float32",
    T.DoubleType: "float64",
    T.StringType: "string",
    T.BinaryType: "binary",
    T.DateType: "date",
    T.TimestampNTZType: "timestamp",
    T.TimestampType: "timestamptz",
}


def column_kind(data_type: T.DataType, column: str, database: Database) -> ColumnKind:
    """The logical type of a Spark type, for the database to make a column of."""
    from sqlsink.core.loading import ColumnKind

    for spark_type, name in _KINDS.items():
        if isinstance(data_type, spark_type):
            return ColumnKind(name)
    if isinstance(data_type, T.DecimalType):
        return ColumnKind("decimal", data_type.precision, data_type.scale)
    if isinstance(data_type, T.ArrayType):
        inner = data_type.elementType
        # an array of arrays: described one level deep (no database the sink writes to
        # nests arrays; its refusal names the whole type)
        nested = isinstance(inner, T.ArrayType)
        element = ColumnKind("array") if nested else column_kind(inner, column, database)
        return ColumnKind("array", element=element)
    if isinstance(data_type, (T.StructType, T.MapType)):
        return ColumnKind("document")
    raise _no_type(data_type, column, database)


def _no_type(data_type: T.DataType, column: str, database: Database) -> ConfigError:
    return ConfigError(
        f"column {column!r}: no {database.name} type for Spark type "
        f"{data_type.simpleString()}; cast it in Spark (e.g. to string) or create the table "
        "yourself"
    )


def column_type(data_type: T.DataType, column: str, database: Database) -> Any:
    """The database's column type a Spark type is created as (docs/reference/types.md)."""
    made = database.loading().column_type(column_kind(data_type, column, database))
    if made is None:
        raise _no_type(data_type, column, database)
    return made


def table_columns(schema: T.StructType, database: Database) -> list[Any]:
    """The columns of a table created for ``schema`` (createTable)."""
    loading = database.loading()
    return [
        loading.column(f.name, column_type(f.dataType, f.name, database), f.nullable)
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
