"""The breaker's v2 state record (a binary string, see docs/KEY_SCHEMA.md) as Python values.

lua/breaker.lua is the only writer; readers (readside, CLI, tests) decode with
`decode_record`, which names the fields as the v1 state hash did, so every reader
shares one decoder. The layout itself is declared once, in `record_layout`.
"""

from __future__ import annotations

import struct
from typing import Any

from .record_layout import (  # the one declaration of the layout
    COUNT_SLOT_BYTES,
    FAILED,
    FIELD_NAMES,
    HEADER_FIELDS,
    MAGIC,
    MS_MASK,
    PRESENT,
    SLOW,
    STATES,
    TIME_SLOT_BYTES,
    WINDOW_OFFSET,
)

__all__ = ["FAILED", "FIELDS", "HEADER_FIELDS", "MAGIC", "MS_MASK", "PRESENT", "SLOW", "STATES",
           "WINDOW_OFFSET", "NotAStateRecord", "count_slots", "decode_record", "encode_fields",
           "time_slots"]

#: Header field names in byte order (field k at byte 8k), from `record_layout`.
FIELDS = FIELD_NAMES
_HEADER = struct.Struct(f">{HEADER_FIELDS}q")


class NotAStateRecord(ValueError):
    """The bytes are not a v2 state record (foreign data)."""


def decode_record(data: bytes) -> dict[str, Any]:
    """The header fields by name (state names instead of codes); raises NotAStateRecord."""
    if not isinstance(data, (bytes, bytearray)):
        raise NotAStateRecord("not a byte string (read it with a client without "
                              "decode_responses)")
    padded = bytes(data[:_HEADER.size]).ljust(_HEADER.size, b"\0")
    values = dict(zip(FIELDS, _HEADER.unpack(padded), strict=True))
    if values["magic"] != MAGIC:
        raise NotAStateRecord("is not a distbreaker v2 state record")
    for field in ("state", "initial_state", "after_half_open"):
        code = values[field]
        if not 0 <= code < len(STATES):
            raise NotAStateRecord(f"has an unknown {field} code {code}")
        values[field] = STATES[code]
    return values


def count_slots(data: bytes, size: int) -> list[tuple[bool, bool, int] | None]:
    """A count window's slots in ring order: (failed, slow, ms), None when empty."""
    out: list[tuple[bool, bool, int] | None] = []
    width = COUNT_SLOT_BYTES * size
    raw = bytes(data[WINDOW_OFFSET:WINDOW_OFFSET + width]).ljust(width, b"\0")
    for (value,) in struct.iter_unpack(">I", raw):
        out.append((bool(value & FAILED), bool(value & SLOW), value & MS_MASK)
                   if value & PRESENT else None)
    return out


def time_slots(data: bytes, size: int) -> list[tuple[int, int, int, int, int]]:
    """A time window's slots: (second, calls, failures, slow, ms), all zero when unused."""
    width = TIME_SLOT_BYTES * size
    raw = bytes(data[WINDOW_OFFSET:WINDOW_OFFSET + width]).ljust(width, b"\0")
    return list(struct.iter_unpack(">5I", raw))


def encode_fields(data: bytes, **fields: int) -> bytes:
    """`data` with some header fields replaced (tests and repair tools: never on a
    live breaker, the script is the only writer)."""
    buf = bytearray(bytes(data).ljust(WINDOW_OFFSET, b"\0"))
    for name, value in fields.items():
        struct.pack_into(">q", buf, 8 * FIELDS.index(name), value)
    return bytes(buf)
