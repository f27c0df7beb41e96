"""No key without a TTL (issue 23): the sweep in tests/redis/conftest.py checks every
test; these are the paths it found leaking."""

from __future__ import annotations

import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys


def test_a_workers_first_call_after_an_operator_action_gives_meta_its_ttl(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    """An operator's reset made the record with no stored config; the first worker call
    stores its config in the meta hash, creating it: it had no TTL (the record's
    refresh was not due yet)."""
    breaker = CircuitBreaker(name, redis=redis_url, redis_timeout=5.0)
    breaker.reset()
    breaker.call(lambda: None)
    keys = BreakerKeys.build(name)
    assert redis_client.exists(keys.meta)
    for key in (keys.state, keys.meta):
        assert 0 < redis_client.pttl(key) <= 3_600_000, key
