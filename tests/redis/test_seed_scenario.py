"""The seed article's scenario, end to end against a real redis-server."""

from __future__ import annotations

import time

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted


class Dependency:
    def __init__(self) -> None:
        self.healthy = False
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if not self.healthy:
            raise ConnectionError("gateway down")
        return "ok"


def make(name: str, redis_url: str) -> CircuitBreaker:
    return CircuitBreaker(name, redis=redis_url, sliding_window_type="COUNT_BASED",
                          sliding_window_size=10, minimum_number_of_calls=5,
                          failure_rate_threshold=50, wait_duration_in_open_state=1.0,
                          permitted_calls_in_half_open=2)


def test_trip_after_five_failures_then_recover_with_two_probes(name: str, redis_url: str) -> None:
    breaker = make(name, redis_url)
    dep = Dependency()
    outcomes = []
    for _ in range(8):
        try:
            breaker.call(dep)
        except CallNotPermitted:
            outcomes.append("rejected")
        except ConnectionError:
            outcomes.append("failed")
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
    dep = Dependency()
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
