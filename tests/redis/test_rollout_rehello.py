"""A worker's repeated hello (every 20 s) when its config is in force: one HSET of its
entry's time after the state record, on the hot path (COUNT window) and the general
path (TIME window) alike; a forgotten entry gets the whole hello again (which may
deploy the config); the rollout's fields live in the meta hash, whose TTL is refreshed
with the record's."""

from __future__ import annotations

import time

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import DEFAULT_PREFIX


def cfgs_key(name: str) -> str:
    """The hash holding the config rollout's fields: the meta hash."""
    return f"{DEFAULT_PREFIX}:v2:{{{name}}}:cb:meta"


def legacy_key(name: str) -> str:
    """The rollout hash of clients before the merge into the meta hash."""
    return f"{DEFAULT_PREFIX}:v2:{{{name}}}:cb:cfgs"


def entry(client: redis.Redis, breaker: CircuitBreaker) -> tuple[str, int]:
    raw = client.hget(cfgs_key(breaker.name), f"w:{breaker._codec.worker}")
    assert raw is not None
    fp, at = raw.decode().split(":")
    return fp, int(at)


@pytest.mark.parametrize("window", ["COUNT_BASED", "TIME_BASED"])
def test_a_repeated_hello_refreshes_the_entry_and_nothing_else(
        name: str, redis_url: str, redis_client: redis.Redis, window: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_type=window,
                             sliding_window_size=10, redis_timeout=5.0)
    breaker.call(lambda: None)                       # the first hello: deploys the config
    fp, first = entry(redis_client, breaker)
    assert fp == str(breaker._codec.fingerprint)
    before = redis_client.hgetall(cfgs_key(name))
    time.sleep(0.01)
    breaker._codec._next_hello = 0.0                 # the next hello is due (every 20 s)
    breaker.call(lambda: None)
    fp, again = entry(redis_client, breaker)
    assert again > first
    after = redis_client.hgetall(cfgs_key(name))
    worker_field = f"w:{breaker._codec.worker}".encode()
    assert {k: v for k, v in after.items() if k != worker_field} == \
        {k: v for k, v in before.items() if k != worker_field}
    assert breaker.metrics().calls == 2


def test_a_forgotten_entry_gets_the_whole_hello_again(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=10,
                             redis_timeout=5.0)
    breaker.call(lambda: None)
    fp = str(breaker._codec.fingerprint)
    deployed = int(redis_client.hget(cfgs_key(name), f"d:{fp}") or 0)
    # the worker was silent past FORGET_MS and another worker's hello forgot it
    redis_client.hdel(cfgs_key(name), f"w:{breaker._codec.worker}")
    time.sleep(0.01)
    breaker._codec._next_hello = 0.0
    breaker.call(lambda: None)                       # the hot path's HSET creates it
    assert entry(redis_client, breaker)[0] == fp
    # no other live worker ran the config: this hello deploys it again
    assert int(redis_client.hget(cfgs_key(name), f"d:{fp}") or 0) > deployed
    assert redis_client.pttl(cfgs_key(name)) > 0


def test_the_rollout_hash_ttl_is_refreshed_with_the_record(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=10, key_ttl=60,
                             redis_timeout=5.0)
    breaker.call(lambda: None)
    redis_client.pexpire(cfgs_key(name), 5_000)
    breaker.reset()                                  # an operator action refreshes every TTL
    assert redis_client.pttl(cfgs_key(name)) > 30_000


@pytest.mark.parametrize("window", ["COUNT_BASED", "TIME_BASED"])
def test_a_foreign_legacy_rollout_key_loses_the_repeated_hello_never_the_call(
        name: str, redis_url: str, redis_client: redis.Redis, window: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_type=window,
                             sliding_window_size=10, redis_timeout=5.0,
                             on_redis_error="fail_closed")
    breaker.call(lambda: None)
    redis_client.set(legacy_key(name), "not a hash", px=60_000)
    breaker._codec._next_hello = 0.0
    assert breaker.call(lambda: "ok") == "ok"       # recorded, no error
    assert breaker.metrics().calls == 2
    assert redis_client.get(legacy_key(name)) == b"not a hash"
    entry(redis_client, breaker)                     # the meta hash has the hello
