"""Choosing an encoder per (Arrow type, PostgreSQL type) pair, and the errors when none fits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from sqlsink.errors import ConfigError
from sqlsink.postgres.catalog import TargetColumn
from sqlsink.postgres.encoding.arrays import array_encoder
from sqlsink.postgres.encoding.booleans import bool_encoder
from sqlsink.postgres.encoding.buffers import is_list_type
from sqlsink.postgres.encoding.fields import Encode, Fields, all_null
from sqlsink.postgres.encoding.nested import json_encoder
from sqlsink.postgres.encoding.numeric import decimal_encoder, float_encoder, int_encoder
from sqlsink.postgres.encoding.oids import (
    ARRAY_ELEMENT,
    BOOL,
    BPCHAR,
    BYTEA,
    CIDR,
    DATE,
    FLOAT4,
    FLOAT8,
    INET,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    JSON,
    JSONB,
    NAME,
    NUMERIC,
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    UUID,
    VARCHAR,
)
from sqlsink.postgres.encoding.temporal import (
    date_encoder,
    duration_encoder,
    time_encoder,
    timestamp_encoder,
)
from sqlsink.postgres.encoding.text import binary_encoder, fixed_binary_encoder, string_encoder
from sqlsink.postgres.encoding.writer import BinaryCopyEncoder, Column

# What to cast a Spark column to, per PostgreSQL type: (Spark types, cast(...) example).
_HINTS: dict[int, tuple[str, str]] = {
    INT2: ("an integer type (ByteType, ShortType, IntegerType, LongType)", "smallint"),
    INT4: ("an integer type (ByteType, ShortType, IntegerType, LongType)", "int"),
    INT8: ("an integer type (ByteType, ShortType, IntegerType, LongType)", "bigint"),
    FLOAT4: ("FloatType, DoubleType or an integer type", "float"),
    FLOAT8: ("DoubleType, FloatType or an integer type", "double"),
    NUMERIC: ("DecimalType, an integer type, FloatType or DoubleType", "decimal(38,18)"),
    BOOL: ("BooleanType", "boolean"),
    TEXT: ("StringType", "string"),
    VARCHAR: ("StringType", "string"),
    BPCHAR: ("StringType", "string"),
    NAME: ("StringType", "string"),
    JSON: ("StringType (JSON text), StructType, MapType or ArrayType", "string"),
    JSONB: ("StringType (JSON text), StructType, MapType or ArrayType", "string"),
    UUID: ("StringType (8-4-4-4-12 or 32 hex digits)", "string"),
    INET: ("StringType", "string"),
    CIDR: ("StringType", "string"),
    BYTEA: ("BinaryType", "binary"),
    DATE: ("DateType", "date"),
    TIME: ("TimeType", "time"),
    TIMESTAMP: ("TimestampNTZType or TimestampType", "timestamp_ntz"),
    TIMESTAMPTZ: ("TimestampType or TimestampNTZType", "timestamp"),
    INTERVAL: ("DayTimeIntervalType", "interval day to second"),
}


_Factory = Callable[[pa.DataType, int], Encode]
_TEXTUAL = (TEXT, VARCHAR, BPCHAR, NAME, JSON, JSONB)
_RULES: list[tuple[Callable[[pa.DataType], bool], tuple[int, ...], _Factory]] = [
    (pa.types.is_integer, (INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC), int_encoder),
    (pa.types.is_floating, (FLOAT4, FLOAT8, NUMERIC), float_encoder),
    (pa.types.is_decimal, (NUMERIC,), decimal_encoder),
    (pa.types.is_boolean, (BOOL,), bool_encoder),
    (
        lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        (*_TEXTUAL, UUID, INET, CIDR),
        string_encoder,
    ),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), (BYTEA,), binary_encoder),
    (pa.types.is_fixed_size_binary, (BYTEA,), fixed_binary_encoder),
    (lambda t: pa.types.is_fixed_size_binary(t) and t.byte_width == 16, (UUID,),
     fixed_binary_encoder),
    (lambda t: pa.types.is_date32(t) or pa.types.is_date64(t), (DATE,), date_encoder),
    (pa.types.is_timestamp, (TIMESTAMP, TIMESTAMPTZ), timestamp_encoder),
    (lambda t: pa.types.is_time32(t) or pa.types.is_time64(t), (TIME,), time_encoder),
    (pa.types.is_duration, (INTERVAL,), duration_encoder),
    (
        lambda t: pa.types.is_struct(t) or pa.types.is_map(t) or is_list_type(t),
        (JSON, JSONB),
        json_encoder,
    ),
]  # fmt: skip


def normalized(arrow: pa.DataType) -> tuple[pa.DataType, list[Callable[[pa.Array], pa.Array]]]:
    """Types read through another one: extension types, dictionaries, views, fixed lists.

    Returns the type to encode and the conversions (in order) that give arrays of it.
    """
    steps: list[Callable[[pa.Array], pa.Array]] = []
    while True:
        if isinstance(arrow, pa.BaseExtensionType):
            arrow = arrow.storage_type
            steps.append(lambda a: a.storage)
            continue
        if pa.types.is_dictionary(arrow):
            arrow = arrow.value_type
            steps.append(lambda a: a.dictionary_decode())
            continue
        target: pa.DataType | None = None
        if pa.types.is_string_view(arrow):
            target = pa.large_string()
        elif pa.types.is_binary_view(arrow):
            target = pa.large_binary()
        elif pa.types.is_fixed_size_list(arrow):
            target = pa.list_(arrow.value_field)
        if target is None:
            return arrow, steps
        steps.append(_caster(target))
        arrow = target


def _caster(target: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    def cast(arr: pa.Array) -> pa.Array:
        return arr.cast(target)

    return cast


def _scalar(arrow: pa.DataType, oid: int) -> Encode | None:
    """The encoder of (arrow type, pg oid), or None when the pair is not supported."""
    arrow, steps = normalized(arrow)
    encode: Encode | None = None
    if pa.types.is_null(arrow) and (oid in _HINTS or oid in ARRAY_ELEMENT):
        encode = all_null
    elif oid in ARRAY_ELEMENT and (pa.types.is_list(arrow) or pa.types.is_large_list(arrow)):
        element = _scalar(arrow.value_type, ARRAY_ELEMENT[oid])
        if element is not None:
            encode = array_encoder(element, ARRAY_ELEMENT[oid])
    else:
        for accepts, oids, factory in _RULES:
            if oid in oids and accepts(arrow):
                encode = factory(arrow, oid)
                break
    if encode is None or not steps:
        return encode
    inner = encode

    def converted(arr: pa.Array) -> Fields:
        for step in steps:
            arr = step(arr)
        return inner(arr)

    return converted


def _unsupported(field: pa.Field, column: TargetColumn) -> ConfigError:
    oid = column.type_oid
    hint = _HINTS.get(ARRAY_ELEMENT.get(oid, oid))
    where = (
        f"column {column.name!r}: cannot write Arrow type {field.type} (Spark column "
        f"{field.name!r}) into PostgreSQL type {column.type_name}"
    )
    if hint is None:
        return ConfigError(
            f"{where}: the sink cannot encode PostgreSQL type {column.type_name}. Fix: make the "
            f"column a supported type (e.g. text, jsonb, numeric, timestamptz), or load into a "
            f"staging table with such a column and cast in SQL (e.g. INSERT ... SELECT "
            f"{column.name}::{column.type_name})",
            column=column.name,
            arrow_type=str(field.type),
            pg_type=column.type_name,
        )
    types, example = hint
    nested = ""
    if oid in ARRAY_ELEMENT:
        types, example = f"an ArrayType of {types}", f"array<{example}>"
        if is_list_type(field.type) and is_list_type(field.type.value_type):
            nested = (
                " (nested lists are not written as multi-dimensional arrays: flatten them with "
                "F.flatten, or write them into a json/jsonb column)"
            )
    return ConfigError(
        f"{where}{nested}. Fix: cast the column in Spark to {types}, e.g. "
        f"df.withColumn({field.name!r}, F.col({field.name!r}).cast({example!r})), or change "
        f"the PostgreSQL column's type",
        column=column.name,
        arrow_type=str(field.type),
        pg_type=column.type_name,
    )


def build_encoder(fields: Sequence[pa.Field], columns: Sequence[TargetColumn]) -> BinaryCopyEncoder:
    """An encoder writing fields[i] into columns[i].

    Raises ConfigError for a pair of (Arrow type, PostgreSQL type) the sink cannot encode.
    """
    if len(fields) != len(columns):
        raise ConfigError(
            f"{len(fields)} Arrow fields for {len(columns)} PostgreSQL columns "
            f"({', '.join(c.name for c in columns)})"
        )
    built: list[Column] = []
    for field, column in zip(fields, columns, strict=True):
        encode = _scalar(field.type, column.type_oid)
        if encode is None:
            raise _unsupported(field, column)
        built.append(Column(column.name, column.type_name, field.type, encode))
    return BinaryCopyEncoder(built)
