"""The rate limiter's pure core and config: argument building, reply decoding and the
decisions on each reply (no Redis)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from distbreaker import Event
from distbreaker.errors import RequestNotPermitted
from distbreaker.ratelimiter.config import RateLimiterConfig
from distbreaker.ratelimiter.core import Grant, RateLimiterCore, decode_grant, decode_metrics


def core(**overrides: object) -> RateLimiterCore:
    return RateLimiterCore("llm", None, "distbreaker", dict(overrides))


def test_the_config_takes_resilience4j_fields_and_checks_them() -> None:
    cfg = RateLimiterConfig(limit_for_period=100, limit_refresh_period=timedelta(minutes=1))
    assert (cfg.period_ms, cfg.effective_burst, cfg.effective_key_ttl) == (60_000, 100, 3600)
    assert RateLimiterConfig(timeout_duration=3000).effective_key_ttl == 6001
    assert RateLimiterConfig(limit_for_period=10, expected_workers=4).fallback_limit == 2
    for bad in ({"limit_for_period": 0}, {"burst": 0}, {"limit_refresh_period": 0},
                {"limit_for_period": 10**9, "limit_refresh_period": 3600},
                {"on_redis_error": "maybe"}, {"key_ttl": 1}):
        with pytest.raises(ValueError, match=next(iter(bad))):  # the error names the field
            RateLimiterConfig(**bad)  # type: ignore[arg-type]


def test_acquire_arguments_and_keyed_instances() -> None:
    limiter = core(limit_for_period=7, limit_refresh_period=2, burst=3, timeout_duration=1.5)
    pending = limiter.acquire_pending(2, None, key="t1")
    assert list(pending.args) == ["acquire", "7", "2000", "3", "3600000", "2", "1500"]
    assert list(pending.keys) == ["distbreaker:v2:{llm:t1}:rl"]
    assert list(limiter.acquire_pending(1, 0.0).keys) == ["distbreaker:v2:{llm}:rl"]
    with pytest.raises(ValueError):
        limiter.acquire_pending(0, None)
    with pytest.raises(ValueError):
        limiter.bucket_key("")


def test_each_reply_becomes_a_wait_or_a_refusal() -> None:
    limiter = core()
    seen: list[Event] = []
    limiter.add_listener(seen.append)
    granted = limiter.decide(decode_grant([1, 250, 1_000, 50]), 1, limiter.clock())
    assert (granted.wait, granted.run_at_ms, granted.source) == (0.25, 1_250, "redis")
    with pytest.raises(RequestNotPermitted) as late:
        limiter.decide(decode_grant([0, 9_000, 1_000, 50]), 3, limiter.clock())
    assert late.value.retry_after == 9.0 and late.value.permits == 3
    with pytest.raises(RequestNotPermitted) as heavy:
        limiter.decide(decode_grant([0, -1, 1_000, 50]), 80, limiter.clock())
    assert "burst" in heavy.value.reason and heavy.value.retry_after == 0
    with pytest.raises(RequestNotPermitted) as closed:
        limiter.decide(Grant(False, -1.0, 50, "closed"), 1, limiter.clock())
    assert "fail_closed" in closed.value.reason
    assert [e.kind for e in seen] == ["permitted", "rejected", "rejected", "rejected"]
    assert limiter.rejected_here == 3


def test_metrics_replies_and_a_pickled_refusal() -> None:
    import pickle

    m = decode_metrics([-3, 10, 60_000, 10, 7, 9, 2, 4, 123, 1])
    assert (m.available_permissions, m.limit_refresh_period, m.overridden) == (-3, 60.0, True)
    refusal = pickle.loads(pickle.dumps(RequestNotPermitted("x", 2, 1.5, True, "why")))
    assert (refusal.name, refusal.permits, refusal.retry_after, refusal.local,
            refusal.reason) == ("x", 2, 1.5, True, "why")
