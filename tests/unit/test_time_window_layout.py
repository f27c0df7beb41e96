"""The cumulative time window's bytes decoded and encoded in Python (the readers' side of
docs/KEY_SCHEMA.md "Window"): `encode_time_window` and `time_seconds` are inverses, and
an earlier version's per-second layout (window type 1) still decodes."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from distbreaker._runtime.state_record import (
    MAGIC,
    WINDOW_OFFSET,
    encode_fields,
    encode_time_window,
    time_seconds,
    time_window_bytes,
)

WSEC = 1_790_000_123


def record(size: int, seconds: dict[int, tuple[int, int, int, int]]) -> bytes:
    window, (calls, failures, slow, total_ms) = encode_time_window(size, WSEC, seconds)
    header = encode_fields(b"", magic=MAGIC, window_type=2, window_size=size, wsec=WSEC,
                           head=WSEC - size, calls=calls, failures=failures, slow=slow,
                           total_ms=total_ms)
    return header[:WINDOW_OFFSET] + window


COUNTS = st.tuples(st.integers(1, 2**31), st.integers(0, 5), st.integers(0, 5),
                   st.integers(0, 2**45))


@given(size=st.sampled_from([1, 2, 7, 8, 9, 60, 3600]),
       seconds=st.dictionaries(st.integers(-4000, 0), COUNTS, max_size=30))
def test_encoded_seconds_decode_back(size: int,
                                     seconds: dict[int, tuple[int, int, int, int]]) -> None:
    by_second = {WSEC + k: v for k, v in seconds.items()}
    data = record(size, by_second)
    assert len(data) == WINDOW_OFFSET + time_window_bytes(size)
    live = sorted((t, *v) for t, v in by_second.items() if WSEC - size < t <= WSEC)
    assert time_seconds(data, size) == live


def test_a_window_bigger_than_the_modulus_wraps_yet_decodes() -> None:
    """Running totals wrap (calls at 2^32, ms at 2^52): differences stay exact."""
    seconds = {WSEC - 2: (2**32 - 5, 1, 0, 2**52 - 7), WSEC - 1: (9, 0, 0, 11), WSEC: (3, 0, 0, 1)}
    assert time_seconds(record(60, seconds), 60) == sorted((t, *v) for t, v in seconds.items())


def test_an_earlier_versions_per_second_layout_still_decodes() -> None:
    slots = struct.pack(">5I", WSEC - 1, 4, 1, 0, 40) + struct.pack(">5I", WSEC, 2, 0, 1, 8)
    header = encode_fields(b"", magic=MAGIC, window_type=1, window_size=2, wsec=WSEC)
    data = header[:WINDOW_OFFSET] + (slots if (WSEC - 1) % 2 == 0 else slots[20:] + slots[:20])
    assert time_seconds(data, 2) == [(WSEC - 1, 4, 1, 0, 40), (WSEC, 2, 0, 1, 8)]
