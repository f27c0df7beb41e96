"""A TIME window's first call after an idle gap: the seconds that left are evicted in a
bounded number of commands (one read and one write of a run, two when the ring
wraps), whatever the gap, and the totals stay exact. The "no call holds Redis for
1 ms" check reads SLOWLOG on the real server, retried: a busy machine may slow one
attempt, a per-second eviction loop (the old way: 30-120 ms at a 3,599 s gap) fails
every attempt."""

from __future__ import annotations

import struct

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.state_record import encode_fields
from tests.helpers.records import age_time_window, read_record

WINDOW = 3600
SLOW_US = 1000  # 1 ms
ATTEMPTS = 4


def command_text(entry: dict[str, object]) -> str:
    command = entry["command"]
    return command.decode() if isinstance(command, bytes) else str(command)


def breaker(url: str, name: str) -> CircuitBreaker:
    return CircuitBreaker(name, redis=url, redis_timeout=5, sliding_window_type="TIME_BASED",
                          sliding_window_size=WINDOW, key_ttl=2 * WINDOW, subscribe=False)


@pytest.mark.parametrize("gap", [1, 10, 1000, 1800, 2500, 3599, 3600, 100_000])
def test_first_call_after_a_gap_evicts_exactly_and_quickly(redis_url: str,
                                                          redis_client: redis.Redis,
                                                          gap: int) -> None:
    b = breaker(redis_url, f"gap-{gap}")
    try:
        b.call(lambda: None)
        slow_calls = []
        for _ in range(ATTEMPTS):
            age_time_window(redis_client, b.keys, gap)
            old = redis_client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
            redis_client.config_set("slowlog-log-slower-than", SLOW_US)
            redis_client.slowlog_reset()
            try:
                b.call(lambda: None)
                slow_calls = [e for e in redis_client.slowlog_get(128)
                              if command_text(e).lower().startswith(("fcall", "evalsha",
                                                                      "eval"))]
            finally:
                redis_client.config_set("slowlog-log-slower-than", old)
            # the totals: the seconds still in the window (10 calls, 50 ms each) + this call
            kept = max(0, WINDOW - gap)
            record = read_record(redis_client, b.keys)
            assert (record["calls"], record["total_ms"]) in {
                (10 * kept + 1, 50 * kept + ms) for ms in range(0, 1000)}, record
            if not slow_calls:
                break
        assert not slow_calls, [(e["duration"], command_text(e)[:60]) for e in slow_calls]
    finally:
        b.close()


@pytest.mark.parametrize("gap", [5, 700, 1800, 3000])
def test_sparse_windows_and_stale_slots_evict_exactly(redis_url: str, redis_client: redis.Redis,
                                                      gap: int) -> None:
    """A window busy one second in seven (runs of zero slots skipped in blocks), then a
    second gap while the slots the first one left behind still hold their old seconds
    (eviction writes nothing: they must count for nothing)."""
    b = breaker(redis_url, f"sparse-{gap}")
    try:
        b.call(lambda: None)
        last = age_time_window(redis_client, b.keys, gap, every=7)
        b.call(lambda: None)
        now_sec = read_record(redis_client, b.keys)["wsec"]
        busy_left = sum(1 for t in range(now_sec - WINDOW + 1, last + 1) if t % 7 == 0)
        record = read_record(redis_client, b.keys)
        assert record["calls"] == 10 * busy_left + 1, (record, busy_left)
        # a second gap, shifting the whole record back (the stale slots with it)
        data = redis_client.get(b.keys.state)
        assert isinstance(data, bytes)
        second_gap = 1200
        shifted = bytearray(data)
        for i in range(WINDOW):
            at = 320 + 20 * i
            t = struct.unpack_from(">I", shifted, at)[0]
            if t:
                struct.pack_into(">I", shifted, at, t - second_gap)
        # moving every second back by `second_gap` moves slot positions too: rebuild the
        # ring at the positions of the shifted seconds
        ring = bytearray(20 * WINDOW)
        for i in range(WINDOW):
            at = 320 + 20 * i
            t = struct.unpack_from(">I", shifted, at)[0]
            if t:
                j = t % WINDOW
                ring[20 * j:20 * j + 20] = shifted[at:at + 20]
        header = encode_fields(bytes(shifted[:320]), wsec=now_sec - second_gap)
        redis_client.set(b.keys.state, header[:320] + bytes(ring), keepttl=True)
        b.call(lambda: None)
        counted = 0
        ring_now = redis_client.get(b.keys.state)
        assert isinstance(ring_now, bytes)
        top = read_record(redis_client, b.keys)["wsec"]
        for i in range(WINDOW):
            t, n = struct.unpack_from(">II", ring_now, 320 + 20 * i)
            if top - WINDOW < t <= top:
                counted += n
        assert read_record(redis_client, b.keys)["calls"] == counted
    finally:
        b.close()
