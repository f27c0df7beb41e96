"""A TIME window's first call after an idle gap: O(1) whatever the gap (cumulative slots:
two slots read, the run of passed seconds written in one SETRANGE, two when the ring
wraps), and the totals stay exact.

The "no call holds Redis for 1 ms" checks read SLOWLOG on the real server, retried: a
busy machine may slow one attempt, a per-second eviction loop (the old way: 30-120 ms at
a 3,599 s gap) fails every attempt. The property test drives random call and gap
sequences (gaps made by moving the record back in time, the ring rotated with it) and
compares the window with a plain per-second model after every step.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distbreaker import CircuitBreaker
from distbreaker._runtime.scripts import load_script, run_script
from distbreaker._runtime.state_record import (
    TIME_SLOT_BYTES,
    WINDOW_OFFSET,
    decode_record,
    encode_fields,
    flag_bytes,
    time_seconds,
    time_window_bytes,
)
from tests.helpers.records import age_time_window, read_record

WINDOW = 3600
SLOW_US = 1000  # 1 ms
ATTEMPTS = 4
SCRIPT = load_script("breaker")


def command_text(entry: dict[str, object]) -> str:
    command = entry["command"]
    return command.decode() if isinstance(command, bytes) else str(command)


def breaker(url: str, name: str, window: int = WINDOW) -> CircuitBreaker:
    return CircuitBreaker(name, redis=url, redis_timeout=5, sliding_window_type="TIME_BASED",
                          sliding_window_size=window, key_ttl=max(2 * window, 60),
                          minimum_number_of_calls=1_000_000_000, subscribe=False)


def slow_script_calls(client: redis.Redis, action: Any) -> list[dict[str, Any]]:
    """The script calls SLOWLOG logged as taking 1 ms or more while `action` ran."""
    old = client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    client.config_set("slowlog-log-slower-than", SLOW_US)
    client.slowlog_reset()
    try:
        action()
        return [e for e in client.slowlog_get(128)
                if command_text(e).lower().startswith(("fcall", "evalsha", "eval"))]
    finally:
        client.config_set("slowlog-log-slower-than", old)


@pytest.mark.parametrize("gap", [1, 10, 1000, 1800, 2500, 3599, 3600, 100_000])
def test_first_call_after_a_gap_evicts_exactly_and_quickly(redis_url: str,
                                                          redis_client: redis.Redis,
                                                          gap: int) -> None:
    b = breaker(redis_url, f"gap-{gap}")
    try:
        b.call(lambda: None)
        slow_calls: list[dict[str, Any]] = []
        for _ in range(ATTEMPTS):
            last = age_time_window(redis_client, b.keys, gap)
            slow_calls = slow_script_calls(redis_client, lambda: b.call(lambda: None))
            # the totals: the seconds still in the window (10 calls, 50 ms each) + this call
            record = read_record(redis_client, b.keys)
            kept = max(0, WINDOW - (record["wsec"] - last))  # (a second may have ticked)
            assert (record["calls"], record["total_ms"]) in {
                (10 * kept + 1, 50 * kept + ms) for ms in range(0, 1000)}, record
            if not slow_calls:
                break
        assert not slow_calls, [(e["duration"], command_text(e)[:60]) for e in slow_calls]
    finally:
        b.close()


@pytest.mark.parametrize("window", [60, 600, 3600])
def test_no_gap_holds_redis_for_a_millisecond_batched_flushes_included(
        redis_url: str, redis_client: redis.Redis, window: int) -> None:
    """The worst gaps for each window length (half a busy window leaving, all of it but a
    second, all of it), each first call a batched flush of 50 outcomes."""
    b = breaker(redis_url, f"worst-{window}", window)
    script_call = b._codec.batch_call((40, 10, 0, 500))
    try:
        b.call(lambda: None)
        for gap in (window // 2, window - 1, window, 2 * window + 7):
            slow_calls: list[dict[str, Any]] = []
            for _ in range(ATTEMPTS):
                last = age_time_window(redis_client, b.keys, gap)
                slow_calls = slow_script_calls(redis_client, lambda: run_script(
                    redis_client, SCRIPT, script_call.keys, script_call.args))
                record = read_record(redis_client, b.keys)
                kept = max(0, window - (record["wsec"] - last))
                assert (record["calls"], record["failures"], record["total_ms"]) == (
                    10 * kept + 50, 10, 50 * kept + 500), (gap, record)
                if not slow_calls:
                    break
            assert not slow_calls, (gap, [e["duration"] for e in slow_calls])
    finally:
        b.close()


# -- the property test: random calls and gaps against a per-second model ---------------

def flag_at(size: int, second: int) -> tuple[int, int]:
    """Second's flag in a time window's bytes: (byte offset, mask) (docs/KEY_SCHEMA.md)."""
    lap, bit = second // size, size - 1 - second % size
    return TIME_SLOT_BYTES * size + (lap % 2) * flag_bytes(size) + bit // 8, 0x80 >> bit % 8


def shift_back(client: redis.Redis, key: str, gap: int) -> None:
    """Move a record `gap` seconds back in time: its seconds (wsec, the epoch, the TTL
    refresh), its ring (rotated so that every second's slot moves with it) and its
    flags (each active second's moved to its new lap and bit)."""
    data = client.get(key)
    assert isinstance(data, bytes)
    fields = decode_record(data)
    size, wsec = fields["window_size"], fields["wsec"]
    window = data[WINDOW_OFFSET:WINDOW_OFFSET + time_window_bytes(size)]
    ring = window[:TIME_SLOT_BYTES * size]
    cut = TIME_SLOT_BYTES * (gap % size)
    moved = bytearray(ring[cut:] + ring[:cut] + bytes(2 * flag_bytes(size)))
    oldest = (wsec - gap) // size * size - size  # (older flags count for nothing)
    for x in range(wsec // size * size - size, wsec + 1):
        at, mask = flag_at(size, x)
        if window[at] & mask and x - gap >= oldest:
            to, bit = flag_at(size, x - gap)
            moved[to] |= bit
    header = encode_fields(data, wsec=wsec - gap, head=fields["head"] - gap,
                           ttl_at=fields["ttl_at"] - 1000 * gap)
    client.set(key, header[:WINDOW_OFFSET] + bytes(moved), keepttl=True)


STEPS = st.lists(st.one_of(
    st.tuples(st.just("record"), st.integers(0, 5), st.integers(0, 3), st.integers(0, 2),
              st.integers(0, 400)),
    st.tuples(st.just("gap"), st.sampled_from([1, 2, 3, 5, 7, 11, 40, 59, 60, 61, 1000]))),
    min_size=1, max_size=14)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(window=st.sampled_from([1, 2, 3, 7, 60]), steps=STEPS)
def test_window_totals_match_a_per_second_model(redis_url: str, redis_client: redis.Redis,
                                                window: int, steps: list[tuple[Any, ...]]
                                                ) -> None:
    b = breaker(redis_url, f"model-{window}", window)
    try:
        b.reset()
        model: dict[int, list[int]] = {}  # second -> calls, failures, slow, ms
        for step in steps:
            if step[0] == "gap":
                gap = step[1]
                shift_back(redis_client, b.keys.state, gap)
                model = {t - gap: v for t, v in model.items()}
                continue
            _, ok, fails, slows, ms = step
            if ok + fails == 0:
                continue
            slows = min(slows, ok + fails)
            call = b._codec.batch_call((ok, fails, slows, ms))
            run_script(redis_client, SCRIPT, call.keys, call.args)
            data = redis_client.get(b.keys.state)
            assert isinstance(data, bytes)
            wsec = decode_record(data)["wsec"]
            seen = model.setdefault(wsec, [0, 0, 0, 0])
            for i, v in enumerate((ok + fails, fails, slows, ms)):
                seen[i] += v
            live = {t: v for t, v in model.items() if wsec - window < t <= wsec and v[0]}
            expected = [sum(v[i] for v in live.values()) for i in range(4)]
            record = decode_record(data)
            assert [record[f] for f in ("calls", "failures", "slow", "total_ms")] == expected
            assert time_seconds(data, window) == sorted((t, *v) for t, v in live.items())
    finally:
        redis_client.delete(*b.keys.script_keys)
        b.close()


# -- mixed layouts: records an earlier version wrote ------------------------------------

def old_layout_slot(second: int, calls: int, failures: int, slow: int, ms: int) -> bytes:
    return struct.pack(">5I", second, calls, failures, slow, ms)


def test_an_old_layout_record_is_converted_keeping_its_totals(redis_url: str,
                                                              redis_client: redis.Redis
                                                              ) -> None:
    """A record an earlier version wrote (window type 1, per-second tagged slots): its
    window totals are kept (as if made in its last second: they leave late, never early) on a
    ring in the cumulative layout."""
    window = 60
    b = breaker(redis_url, "legacy", window)
    try:
        b.call(lambda: None)
        data = redis_client.get(b.keys.state)
        assert isinstance(data, bytes)
        now = int(redis_client.time()[0])
        last = now - 5
        ring = bytearray(TIME_SLOT_BYTES * window)
        for t in range(last - 20, last + 1):
            ring[TIME_SLOT_BYTES * (t % window):TIME_SLOT_BYTES * (t % window + 1)] = \
                old_layout_slot(t, 2, 1, 0, 30)
        header = encode_fields(data, window_type=1, head=0, wsec=last, calls=42, failures=21,
                               slow=0, total_ms=630)
        redis_client.set(b.keys.state, header[:WINDOW_OFFSET] + bytes(ring), keepttl=True)
        b.record(b.acquire(), None, 0.0)
        record = read_record(redis_client, b.keys)
        assert (record["window_type"], record["head"], record["calls"], record["failures"]) \
            == (2, last, 43, 21)
        after = redis_client.get(b.keys.state)
        assert isinstance(after, bytes)
        assert sum(s[1] for s in time_seconds(after, window)) == 43
        # the kept totals leave one window after that last second, all at once
        shift_back(redis_client, b.keys.state, window - 5)
        b.record(b.acquire(), None, 0.0)
        assert read_record(redis_client, b.keys)["calls"] == 2
    finally:
        b.close()


def test_a_slot_an_old_worker_wrote_is_found_and_the_ring_rebased(redis_url: str,
                                                                 redis_client: redis.Redis
                                                                 ) -> None:
    """An old worker on a new-layout record (mixed fleet, during a deploy) adds its
    outcomes to the header's totals and writes its second's slot in the old layout (an
    epoch second first): the next new-layout call finds it and re-bases the ring; the
    totals stay what both counted."""
    window = 60
    b = breaker(redis_url, "mixed", window)
    try:
        b.call(lambda: None)
        age_time_window(redis_client, b.keys, 3)  # 10 calls in each of the last 60 s
        data = redis_client.get(b.keys.state)
        assert isinstance(data, bytes)
        fields = decode_record(data)
        wsec = fields["wsec"]
        at = WINDOW_OFFSET + TIME_SLOT_BYTES * (wsec % window)
        # what the old code does in second wsec: its slot, and the header's totals + 3
        patched = bytearray(encode_fields(data, calls=fields["calls"] + 3,
                                          failures=fields["failures"] + 3))
        patched[at:at + TIME_SLOT_BYTES] = old_layout_slot(wsec, 3, 3, 0, 0)
        redis_client.set(b.keys.state, bytes(patched), keepttl=True)
        b.record(b.acquire(), None, 0.0)
        record = read_record(redis_client, b.keys)
        # nothing left the window wrongly: 600 + 3 + this call (the rebased totals are
        # kept whole, as if made in wsec)
        assert (record["calls"], record["failures"]) == (604, 3), record
        after = redis_client.get(b.keys.state)
        assert isinstance(after, bytes)
        assert sum(s[1] for s in time_seconds(after, window)) == 604
    finally:
        b.close()
