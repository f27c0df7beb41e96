"""The shadows' usual record (lua/lib/breaker_shadow.lua): a library (FCALL) feeds them
from its mirror with one BITFIELD per shadow, checked in that same command. Whatever
else writes the shadows in between (an EVAL client such as PHP's, an operator adding
or clearing one), what they count is exactly what the general path, which reads
everything, counts for the same outcomes."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker, operate
from distbreaker import readside as view
from distbreaker._runtime.keys import DEFAULT_PREFIX, BreakerKeys
from distbreaker._runtime.scripts import FUNCTIONS
from distbreaker.breaker.shadow import shadow_key, shadow_ring_key

LIVE = {"sliding_window_size": 10, "minimum_number_of_calls": 10,
        "failure_rate_threshold": 100, "redis_timeout": 5.0, "subscribe": False}
#: Count windows of other sizes and thresholds: none trips on the outcomes below
#: except `tight`, which trips and stays OPEN (its wait: a minute).
CANDIDATES = {"wide": {"sliding_window_size": 7, "minimum_number_of_calls": 7,
                       "failure_rate_threshold": 90},
              "tight": {"sliding_window_size": 5, "minimum_number_of_calls": 4,
                        "failure_rate_threshold": 40},
              "slow": {"sliding_window_size": 5, "minimum_number_of_calls": 5,
                       "failure_rate_threshold": 100}}
#: A record's outcome, by step: mostly successes, bursts of failures.
PATTERN = [True] * 9 + [False] + [True] * 5 + [False, False, True] * 3


def boom() -> None:
    raise ConnectionError("down")


def record(breaker: CircuitBreaker, good: bool) -> None:
    if good:
        breaker.call(lambda: "fine")
    else:
        with pytest.raises(ConnectionError):
            breaker.call(boom)


def eval_client(url: str) -> redis.Redis:
    """A client of the scripts' EVAL form (as the PHP client's): no mirror survives."""
    client = redis.Redis.from_url(url)
    FUNCTIONS.give_up(client, "unknown command (test: the EVAL form)")
    return client


def figures(client: redis.Redis, name: str) -> dict[str, tuple[Any, ...]]:
    return {s["name"]: (s["state"], s["calls"], s["failures"], s["slow"], s["seen"],
                        s["seen_failures"], s["trips"], s["rejected"], s["avoided"])
            for s in view.read_shadows(client, DEFAULT_PREFIX, name)}


def test_the_mirror_counts_what_the_general_path_counts(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    fast = CircuitBreaker(name, redis=redis_client, **LIVE)
    other = CircuitBreaker(name, redis=eval_client(redis_url), **LIVE)
    ref = CircuitBreaker(f"{name}-ref", redis=eval_client(redis_url), **LIVE)
    for b in (fast, ref):
        b.reset()
        for shadow, changes in CANDIDATES.items():
            operate.set_shadow(redis_client, DEFAULT_PREFIX, b.name, shadow, changes, "t", "t")
    # the same outcomes: the reference all through EVAL; the other breaker mostly
    # from the library's mirror, an EVAL worker's record now and then
    writers = itertools.cycle([fast] * 24 + [other])
    for step, good in enumerate(PATTERN * 3):
        record(next(writers), good)
        record(ref, good)
        if step % 11 == 10:  # the two agree at every point, not only at the end
            assert figures(redis_client, name) == figures(redis_client, ref.name)
    got = figures(redis_client, name)
    assert got == figures(redis_client, ref.name)
    assert got["tight"][6] >= 1  # (it tripped: the general path ran in between)
    assert got["wide"][4] == len(PATTERN) * 3


def test_a_shadow_added_or_cleared_elsewhere_is_seen_by_the_next_record(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    fast = CircuitBreaker(name, redis=redis_client, **LIVE)
    fast.reset()
    operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "wide", CANDIDATES["wide"], "t", "t")
    for _ in range(5):
        record(fast, True)  # mirrored by now
    # a second shadow, set through the EVAL form (as a PHP operator would)
    operate.set_shadow(eval_client(redis_url), DEFAULT_PREFIX, name, "slow",
                       CANDIDATES["slow"], "t", "t")
    for _ in range(20):  # (a stale mirror is copied again after a few records)
        record(fast, True)
    seen = {s: f[4] for s, f in figures(redis_client, name).items()}
    assert seen == {"wide": 25, "slow": 20}
    # the second cleared elsewhere: the first shadow's write (which its check passed)
    # is undone with the second's, and the mirror's write does not bring the ring back
    operate.clear_shadow(eval_client(redis_url), DEFAULT_PREFIX, name, "slow", "t", "t")
    record(fast, False)
    state = BreakerKeys.build(name).state
    assert not redis_client.exists(shadow_ring_key(state, 2))
    assert {s: f[1:6] for s, f in figures(redis_client, name).items()} == {
        "wide": (7, 1, 0, 26, 1)}


def test_the_record_that_refreshes_the_ttls_counts_and_refreshes_them(
        redis_client: redis.Redis, name: str) -> None:
    fast = CircuitBreaker(name, redis=redis_client, **LIVE)
    fast.reset()
    short = {"key_ttl": 2.0, "half_open_lease": 1.0, "wait_duration_in_open_state": 1.0}
    operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "short", short, "t", "t")
    for _ in range(3):
        record(fast, True)
    time.sleep(1.2)  # past half its key TTL: the next record refreshes the TTLs
    record(fast, True)
    state = BreakerKeys.build(name).state
    assert redis_client.pttl(shadow_key(state)) > 1000
    assert redis_client.pttl(shadow_ring_key(state, 1)) > 1000
    assert figures(redis_client, name)["short"][4] == 4  # (that record counted too)
