"""RedisHealth, the backoff that decides when a call may try an unreachable Redis again
(driven with explicit times: nothing sleeps)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError

from distbreaker._runtime.health import RedisHealth


def test_health_lets_one_trial_through_per_backoff_period() -> None:
    health = RedisHealth(max_backoff=1.0)
    assert health.usable(now=0.0)
    health.failed(RedisConnectionError("down"), now=0.0)
    assert not health.usable(now=0.02)  # first backoff: 25-50 ms
    assert health.usable(now=0.05)  # the trial
    assert not health.usable(now=0.05) and not health.usable(now=0.9)  # trial in flight
    health.failed(RedisConnectionError("still down"), now=0.3)
    assert not health.usable(now=0.34) and health.usable(now=0.41)  # 50-100 ms
    health.succeeded()
    assert health.usable(now=0.41) and health.usable(now=0.41) and not health.down
    for step in range(30):
        health.failed(RedisConnectionError("down"), now=float(step))
    assert 0.5 <= health.retry_in(now=29.0) <= 1.0  # capped at max_backoff
