"""The seed article's scenario, end to end against a real redis-server."""

from __future__ import annotations

import time

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from tests.helpers.dependency import SEED, Dependency, run_requests


def make(name: str, redis_url: str) -> CircuitBreaker:
    return CircuitBreaker(name, redis=redis_url, **SEED)


def test_trip_after_five_failures_then_recover_with_two_probes(name: str, redis_url: str) -> None:
    breaker = make(name, redis_url)
    dep = Dependency(healthy=False)
    outcomes = run_requests(lambda: breaker.call(dep), 8)
    assert outcomes == ["failed"] * 5 + ["rejected"] * 3
    assert dep.calls == 5
    assert breaker.state is State.OPEN
    metrics = breaker.metrics()
    assert metrics.failure_rate == 100.0 and metrics.calls == 5

    time.sleep(1.05)
    dep.healthy = True
    assert breaker.call(dep) == "ok"
    assert breaker.state is State.HALF_OPEN
    assert breaker.call(dep) == "ok"
    assert breaker.state is State.CLOSED
    assert dep.calls == 7


def test_failure_rate_is_minus_one_below_minimum(name: str, redis_url: str) -> None:
    breaker = make(name, redis_url)
    dep = Dependency(healthy=False)
    for _ in range(4):
        with pytest.raises(ConnectionError):
            breaker.call(dep)
    metrics = breaker.metrics()
    assert metrics.calls == 4 and metrics.failed == 4
    assert metrics.failure_rate == -1
    assert breaker.state is State.CLOSED


def test_get_state_matches_the_property(name: str, redis_url: str) -> None:
    breaker = make(name, redis_url)
    assert breaker.get_state() is breaker.state is State.CLOSED
    breaker.trip("test")
    assert breaker.get_state() is State.OPEN
