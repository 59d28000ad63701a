"""Structs, maps and lists into json/jsonb, through Python's json module."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pyarrow as pa

from sqlsink.postgres.encoding.buffers import is_list_type
from sqlsink.postgres.encoding.fields import Encode, Fields, per_value
from sqlsink.postgres.encoding.oids import JSONB


def _jsonable(value: Any, arrow: pa.DataType) -> Any:
    """A to_pylist() value as json.dumps should see it, guided by its Arrow type."""
    if value is None:
        return None
    if pa.types.is_struct(arrow):
        return {
            arrow.field(i).name: _jsonable(value.get(arrow.field(i).name), arrow.field(i).type)
            for i in range(arrow.num_fields)
        }
    if pa.types.is_map(arrow):
        return {
            k if isinstance(k, str) else str(_jsonable(k, arrow.key_type)): _jsonable(
                v, arrow.item_type
            )
            for k, v in value
        }
    if is_list_type(arrow):
        return [_jsonable(v, arrow.value_type) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def json_encoder(arrow: pa.DataType, oid: int) -> Encode:
    head = b"\x01" if oid == JSONB else b""

    def one(value: Any) -> bytes:
        text = json.dumps(
            _jsonable(value, arrow), separators=(",", ":"), default=str, ensure_ascii=False
        )
        return head + text.encode("utf-8")

    def documents(arr: pa.Array) -> Fields:
        return per_value(arr, one)

    return documents
