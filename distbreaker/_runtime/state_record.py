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
           "encode_time_window", "time_seconds", "time_slots"]

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
    """A time window's raw slots: five u32 each, all zero when unused (`time_seconds`
    says what they mean)."""
    width = TIME_SLOT_BYTES * size
    raw = bytes(data[WINDOW_OFFSET:WINDOW_OFFSET + width]).ljust(width, b"\0")
    return list(struct.iter_unpack(">5I", raw))


#: A cumulative time slot's moduli: calls, failures and slow calls wrap at 2^32, ms at
#: 2^52 (its high 20 bits in the slot's first u32, which an old-layout slot's epoch
#: second always exceeds).
COUNT_MOD, MS_MOD, MS_HIGH_TOP = 1 << 32, 1 << 52, 1 << 20


def time_seconds(data: bytes, size: int) -> list[tuple[int, int, int, int, int]]:
    """The seconds of a time window (its last `size` seconds up to the header's `wsec`)
    that saw calls, oldest first: (epoch second, calls, failures, slow, ms).

    Decodes both layouts: cumulative slots (`head` 1: slot x % size holds the running
    totals at the end of second x; the slot of `wsec` still holds those of
    wsec - size, and the header's window totals complete it) and an earlier version's
    tagged per-second slots (`head` 0: epoch second, calls, failures, slow, ms)."""
    padded = bytes(data[:_HEADER.size]).ljust(_HEADER.size, b"\0")
    header = dict(zip(FIELDS, _HEADER.unpack(padded), strict=True))
    wsec, slots = header["wsec"], time_slots(data, size)
    if header["head"] != 1:
        return sorted(s for s in slots if s[0] and s[1])  # (the caller drops stale ones)
    if not wsec:
        return []

    def running(slot: tuple[int, int, int, int, int]) -> tuple[int, int, int, int]:
        hi, calls, fails, slow, lo = slot
        return calls, fails, slow, (hi << 32) + lo

    def plus(a: tuple[int, ...], b: tuple[int, ...], sign: int) -> tuple[int, ...]:
        return tuple((x + sign * y) % m for x, y, m in zip(
            a, b, (COUNT_MOD, COUNT_MOD, COUNT_MOD, MS_MOD), strict=True))

    # C(x) for x in wsec - size .. wsec
    first = running(slots[wsec % size])
    cum = [first] + [running(slots[x % size]) for x in range(wsec - size + 1, wsec)]
    cum.append(plus(first, tuple(header[f] for f in ("calls", "failures", "slow",
                                                     "total_ms")), 1))
    out = []
    for i in range(1, size + 1):
        calls, fails, slow, ms = plus(cum[i], cum[i - 1], -1)
        if calls:
            out.append((wsec - size + i, calls, fails, slow, ms))
    return out


def encode_time_window(size: int, wsec: int,
                       seconds: dict[int, tuple[int, int, int, int]]
                       ) -> tuple[bytes, tuple[int, int, int, int]]:
    """The cumulative slots of a time window whose second `wsec` was the last one seen,
    whose seconds saw (calls, failures, slow, ms) as `seconds` says (others none), and
    its window totals (the header's calls, failures, slow, total_ms; `head` must be 1):
    the inverse of `time_seconds`, for tests and benchmarks."""
    mods = (COUNT_MOD, COUNT_MOD, COUNT_MOD, MS_MOD)
    running = [0, 0, 0, 0]
    slots = [b"\0" * TIME_SLOT_BYTES] * size
    for x in range(wsec - size, wsec + 1):
        running = [(r + v) % m for r, v, m in zip(running, seconds.get(x, (0, 0, 0, 0)), mods,
                                                   strict=True)]
        if x < wsec:
            calls, fails, slow, ms = running
            slots[x % size] = struct.pack(">5I", ms >> 32, calls, fails, slow, ms & 0xFFFFFFFF)
    totals = [0, 0, 0, 0]
    for x in range(wsec - size + 1, wsec + 1):
        totals = [t + v for t, v in zip(totals, seconds.get(x, (0, 0, 0, 0)), strict=True)]
    return b"".join(slots), (totals[0], totals[1], totals[2], totals[3])


def encode_fields(data: bytes, **fields: int) -> bytes:
    """`data` with some header fields replaced (tests and repair tools: never on a
    live breaker, the script is the only writer)."""
    buf = bytearray(bytes(data).ljust(WINDOW_OFFSET, b"\0"))
    for name, value in fields.items():
        struct.pack_into(">q", buf, 8 * FIELDS.index(name), value)
    return bytes(buf)
