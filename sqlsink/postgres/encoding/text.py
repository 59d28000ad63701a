"""Strings and binaries into text, varchar, json/jsonb (as text), bytea, uuid, inet, cidr."""

from __future__ import annotations

import ipaddress
from typing import Any

import numpy as np
import pyarrow as pa

from sqlsink.postgres.encoding.buffers import validity, var_parts
from sqlsink.postgres.encoding.fields import (
    I4,
    U1,
    Body,
    Encode,
    Fields,
    ValueProblem,
    first_bad,
    fixed_bytes,
    iota,
    per_value,
    shown_value,
)
from sqlsink.postgres.encoding.oids import CIDR, INET, JSONB, UUID


def _bytes_encoder(head: bytes = b"") -> Encode:
    """string/binary values as they are (text, varchar, json, bytea...), after a constant head."""

    def var(arr: pa.Array) -> Fields:
        data, starts, lens, valid = var_parts(arr)
        body = Body(data, starts, lens)
        cols: list[tuple[np.dtype[Any], Any]] = [(I4, lens + len(head))]
        cols += [(U1, byte) for byte in head]
        return Fields(cols, valid, body=body)

    return var


def string_encoder(arrow: pa.DataType, oid: int) -> Encode:
    if oid == UUID:
        return _uuid_from_strings
    if oid in (INET, CIDR):
        return _inet_encoder(oid == CIDR)
    return _bytes_encoder(b"\x01" if oid == JSONB else b"")


def binary_encoder(arrow: pa.DataType, oid: int) -> Encode:
    return _bytes_encoder()


def fixed_binary_encoder(arrow: pa.DataType, oid: int) -> Encode:
    width = arrow.byte_width

    def fixed(arr: pa.Array) -> Fields:
        n = len(arr)
        buf = arr.buffers()[1]
        payload = np.frombuffer(buf, np.uint8, count=n * width, offset=arr.offset * width)
        return fixed_bytes(payload.reshape(n, width), validity(arr))

    return fixed


_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_UUID_36 = np.array([i for i in range(36) if i not in (8, 13, 18, 23)], dtype=np.int64)
_UUID_DASHES = np.array([8, 13, 18, 23], dtype=np.int64)


def _uuid_from_strings(arr: pa.Array) -> Fields:
    """Canonical (8-4-4-4-12) or 32-hex-digit strings, any case, vectorised."""
    data, starts, lens, valid = var_parts(arr)
    present = np.ones(len(arr), np.bool_) if valid is None else valid
    bad = present & (lens != 36) & (lens != 32)
    rows = np.flatnonzero(present & ~bad)
    dashed = lens[rows] == 36
    pos = np.where(dashed[:, None], _UUID_36, iota(0, 32))
    nibbles = _HEX[data[starts[rows, None] + pos]]
    wrong = (nibbles == 255).any(axis=1)
    dash_rows = rows[dashed]
    wrong[dashed] |= (data[starts[dash_rows, None] + _UUID_DASHES] != ord("-")).any(axis=1)
    bad[rows[wrong]] = True
    if bad.any():
        i = first_bad(bad)
        value = bytes(data[starts[i] : starts[i] + min(int(lens[i]), 120)])
        raise ValueProblem(
            i, f"{shown_value(value)} is not a UUID (32 hex digits, optionally as 8-4-4-4-12)"
        )
    payload = np.zeros((len(arr), 16), dtype=np.uint8)
    payload[rows] = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    return fixed_bytes(payload, valid)


def _inet_encoder(cidr: bool) -> Encode:
    def one(text: str) -> bytes:
        if cidr:
            net = ipaddress.ip_network(text.strip(), strict=True)
            address, bits = net.network_address, net.prefixlen
        else:
            iface = ipaddress.ip_interface(text.strip())
            address, bits = iface.ip, iface.network.prefixlen
        packed = address.packed
        family = 2 if address.version == 4 else 3  # PGSQL_AF_INET, PGSQL_AF_INET6
        return bytes([family, bits, int(cidr), len(packed)]) + packed

    def inets(arr: pa.Array) -> Fields:
        return per_value(arr, one)

    return inets
