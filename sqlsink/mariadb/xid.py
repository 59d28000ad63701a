"""The XA xid of one partition's branch: the core's gid (core/gid.py) in 64 + 64 bytes.

A gid may be 199 bytes (PostgreSQL's limit); an XA xid is a formatID and two byte
strings, gtrid and bqual, of at most 64 bytes each (tests/mariadb/test_xa_facts.py).
The layout packs every field of the gid, losslessly:

    formatID  0x53514C01     'SQL' and layout 1: marks the sink's branches; any other
                             formatID is foreign and never touched
    gtrid     batch_id  8 bytes big-endian        the batch: XA's global transaction
              sink id   6 bits a character        (at most 48 bytes)
    bqual     partition 4 bytes, attempt 8 bytes, part 2 bytes   the branch
              run id    6 bits a character        (at most 48 bytes)

so gtrid is at most 56 bytes and bqual at most 62. A sink id and a run id hold
letters, digits and '-' (1 to 64 characters); six bits spell each, with 0 as the pad
that ends the string (so a trailing pad is not a character). ``decode`` never raises:
whatever is not exactly an encoding of a valid gid is None (foreign, or a look-alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlsink.core.gid import Gid

FORMAT_ID = 0x53514C01
_ALPHABET = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # codes 1..63
_CODE = {c: i + 1 for i, c in enumerate(_ALPHABET)}
MAX_PART_BYTES = 64


@dataclass(frozen=True)
class Xid:
    format_id: int
    gtrid: bytes
    bqual: bytes

    def sql(self) -> str:
        """As XA statements spell it (hex literals: no quoting of binary data)."""
        return f"X'{self.gtrid.hex()}',X'{self.bqual.hex()}',{self.format_id}"


def _pack(text: str) -> bytes:
    bits = 0
    for c in text:
        bits = (bits << 6) | _CODE[c]
    count = len(text) * 6
    pad = (-count) % 8
    return (bits << pad).to_bytes((count + pad) // 8, "big")


def _unpack(data: bytes) -> str | None:
    if not data:
        return None
    bits, count = int.from_bytes(data, "big"), len(data) * 8
    chars: list[str] = []
    for shift in range(count - 6, -1, -6):
        code = (bits >> shift) & 63
        if code == 0:
            break
        chars.append(_ALPHABET[code - 1])
    text = "".join(chars)
    return text if _pack(text) == data else None  # exactly one spelling


def encode(gid: Gid) -> Xid:
    gtrid = gid.batch_id.to_bytes(8, "big") + _pack(gid.sink_id)
    bqual = (
        gid.partition_id.to_bytes(4, "big")
        + gid.attempt_id.to_bytes(8, "big")
        + gid.part.to_bytes(2, "big")
        + _pack(gid.run_id)
    )
    return Xid(FORMAT_ID, gtrid, bqual)


def encode_text(gid: str) -> Xid | None:
    parsed = Gid.parse(gid)
    return None if parsed is None else encode(parsed)


def decode(format_id: int, gtrid: bytes, bqual: bytes) -> Gid | None:
    """The gid of one of the sink's branches, or None for anything else."""
    if format_id != FORMAT_ID or len(gtrid) <= 8 or len(bqual) <= 14:
        return None
    if len(gtrid) > MAX_PART_BYTES or len(bqual) > MAX_PART_BYTES:
        return None
    sink_id, run_id = _unpack(gtrid[8:]), _unpack(bqual[14:])
    if sink_id is None or run_id is None:
        return None
    try:
        gid = Gid(
            sink_id,
            int.from_bytes(gtrid[:8], "big"),
            int.from_bytes(bqual[:4], "big"),
            run_id,
            int.from_bytes(bqual[4:12], "big"),
            int.from_bytes(bqual[12:14], "big"),
        )
    except Exception:  # out of a field's range: a look-alike, not ours
        return None
    return gid if encode(gid) == Xid(format_id, gtrid, bqual) else None


def from_recover_row(row: tuple[object, ...]) -> Gid | None:
    """A row of ``XA RECOVER``: formatID, gtrid_length, bqual_length, data."""
    try:
        format_id, gtrid_length, _, data = row[:4]
        raw = bytes(data) if isinstance(data, bytes | bytearray) else str(data).encode()
        cut = int(str(gtrid_length))
        return decode(int(str(format_id)), raw[:cut], raw[cut:])
    except (ValueError, TypeError):
        return None
