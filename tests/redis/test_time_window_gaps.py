"""A TIME window's first call after an idle gap: the seconds that left are evicted in a
bounded number of commands (one read and one write of a run, two when the ring
wraps), whatever the gap, and the totals stay exact. The "no call holds Redis for
1 ms" check reads SLOWLOG on the real server, retried: a busy machine may slow one
attempt, a per-second eviction loop (the old way: 30-120 ms at a 3,599 s gap) fails
every attempt."""

from __future__ import annotations

import pytest
import redis

from distbreaker import CircuitBreaker
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
