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
           "encode_time_window", "flag_bytes", "time_seconds", "time_slots",
           "time_window_bytes"]

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
_MODS = (COUNT_MOD, COUNT_MOD, COUNT_MOD, MS_MOD)


def flag_bytes(size: int) -> int:
    """The bytes of one of a time window's two bitmaps of active seconds."""
    return (size + 7) // 8


def time_window_bytes(size: int) -> int:
    """A time window's bytes: its slots, then its two bitmaps."""
    return TIME_SLOT_BYTES * size + 2 * flag_bytes(size)


def _flag_index(size: int, second: int) -> int:
    """Second's flag: (byte offset from the window's start, bit mask)."""
    lap = second // size
    bit = size - 1 - second % size
    return TIME_SLOT_BYTES * size + (lap % 2) * flag_bytes(size) + bit // 8, 0x80 >> bit % 8


def _running(slot: tuple[int, ...]) -> tuple[int, int, int, int]:
    hi, calls, fails, slow, lo = slot
    return calls, fails, slow, (hi << 32) + lo


def _minus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    c, f, s, ms = ((x - y) % m for x, y, m in zip(a, b, _MODS, strict=True))
    return c, f, s, ms


def time_seconds(data: bytes, size: int) -> list[tuple[int, int, int, int, int]]:
    """The seconds of a time window (its last `size` seconds up to the header's `wsec`)
    that saw calls, oldest first: (epoch second, calls, failures, slow, ms).

    Decodes both layouts: cumulative slots (window type 2; `head` the epoch second:
    slot x % size holds the running totals at the end of active second x, flagged in the
    bitmap of its lap's parity; slot wsec % size still holds those of wsec - size, and
    the header's window totals complete the last second) and an earlier version's tagged
    per-second slots (window type 1: epoch second, calls, failures, slow, ms)."""
    padded = bytes(data[:_HEADER.size]).ljust(_HEADER.size, b"\0")
    header = dict(zip(FIELDS, _HEADER.unpack(padded), strict=True))
    wsec, epoch, slots = header["wsec"], header["head"], time_slots(data, size)
    if header["window_type"] == 1 or not epoch:
        return sorted(s for s in slots if s[0] and s[1])  # (the caller drops stale ones)
    if not wsec:
        return []
    window = bytes(data[WINDOW_OFFSET:WINDOW_OFFSET + time_window_bytes(size)]).ljust(
        time_window_bytes(size), b"\0")
    base = _running(slots[wsec % size]) if wsec - size >= epoch else (0, 0, 0, 0)
    prev = base
    out = []
    for x in range(max(wsec - size + 1, epoch), wsec):
        at, mask = _flag_index(size, x)
        if window[at] & mask:
            now = _running(slots[x % size])
            calls, fails, slow, ms = _minus(now, prev)
            if calls:  # (a restart's second is flagged when the next one starts)
                out.append((x, calls, fails, slow, ms))
            prev = now
    totals = (header["calls"], header["failures"], header["slow"], header["total_ms"])
    last = tuple((b + t) % m for b, t, m in zip(base, totals, _MODS, strict=True))
    calls, fails, slow, ms = _minus(last, prev)
    if calls:
        out.append((wsec, calls, fails, slow, ms))
    return out


def encode_time_window(size: int, wsec: int,
                       seconds: dict[int, tuple[int, int, int, int]]
                       ) -> tuple[bytes, tuple[int, int, int, int]]:
    """The window bytes (slots and bitmaps) of a cumulative time window whose second
    `wsec` was the last one seen, whose seconds saw (calls, failures, slow, ms) as
    `seconds` says (none before wsec - size + 1 counts: the epoch, the header's `head`,
    must be wsec - size), and its window totals (the header's calls, failures, slow,
    total_ms): the inverse of `time_seconds`, for tests and benchmarks."""
    window = bytearray(time_window_bytes(size))
    running = (0, 0, 0, 0)
    for x in range(wsec - size + 1, wsec):
        counts = seconds.get(x, (0, 0, 0, 0))
        if counts[0]:
            c, f, s, ms = ((r + v) % m for r, v, m in zip(running, counts, _MODS, strict=True))
            running = (c, f, s, ms)
            struct.pack_into(">5I", window, TIME_SLOT_BYTES * (x % size), ms >> 32, c, f, s,
                             ms & 0xFFFFFFFF)
            at, mask = _flag_index(size, x)
            window[at] |= mask
    totals = [0, 0, 0, 0]
    for x in range(wsec - size + 1, wsec + 1):
        totals = [t + v for t, v in zip(totals, seconds.get(x, (0, 0, 0, 0)), strict=True)]
    return bytes(window), (totals[0], totals[1], totals[2], totals[3])


def encode_fields(data: bytes, **fields: int) -> bytes:
    """`data` with some header fields replaced (tests and repair tools: never on a
    live breaker, the script is the only writer)."""
    buf = bytearray(bytes(data).ljust(WINDOW_OFFSET, b"\0"))
    for name, value in fields.items():
        struct.pack_into(">q", buf, 8 * FIELDS.index(name), value)
    return bytes(buf)
