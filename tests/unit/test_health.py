"""RedisHealth, the backoff that decides when a call may try an unreachable Redis again
(driven with explicit times: nothing sleeps)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError

from distbreaker._runtime.health import RedisHealth, shared_health


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
    for step in range(30):  # each failed trial doubles the backoff
        assert health.usable(now=float(step))
        health.failed(RedisConnectionError("down"), now=float(step))
    assert 0.5 <= health.retry_in(now=29.0) <= 1.0  # capped at max_backoff


def test_the_backoff_grows_per_failed_trial_not_per_failed_call() -> None:
    """16 calls in flight when Redis froze are one failed attempt: the backoff is the
    first one, so the process is back on Redis soon after it answers (issue 24)."""
    health = RedisHealth(max_backoff=5.0)
    for _ in range(16):
        health.failed(RedisConnectionError("frozen"), now=0.0)
    assert health.retry_in(now=0.0) <= 0.05
    assert health.usable(now=0.05)  # the trial
    for _ in range(16):  # the trial's failure (and stragglers): one more step
        health.failed(RedisConnectionError("frozen"), now=0.1)
    assert health.retry_in(now=0.1) <= 0.1
    assert health.usable(now=0.2)
    health.succeeded()
    assert not health.down


def test_components_of_one_redis_share_one_health() -> None:
    one = shared_health("redis://h:1/0", 5.0)
    assert shared_health("redis://h:1/0", 1.0) is one
    assert shared_health("redis://h:2/0", 5.0) is not one
    client = object()
    assert shared_health(client, 5.0) is shared_health(client, 5.0)
    assert shared_health(client, 5.0) is not one
    one.failed(RedisConnectionError("down"), now=0.0)
    assert shared_health("redis://h:1/0", 5.0).down
