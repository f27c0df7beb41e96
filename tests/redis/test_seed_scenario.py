"""The seed article's scenario, end to end against a real redis-server, with the sync
and the asyncio breaker."""

from __future__ import annotations

import time

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from tests.helpers.dependency import SEED, Dependency, run_requests
from tests.helpers.flavours import Flavour


def test_trip_after_five_failures_then_recover_with_two_probes(
        name: str, redis_url: str, flavour: Flavour) -> None:
    breaker = flavour.breaker(name, redis=redis_url, **SEED)
    events: list[Transition] = []
    breaker.add_listener(events.append)
    dep = Dependency(healthy=False)
    outcomes = run_requests(lambda: breaker.call(dep), 8)
    assert outcomes == ["failed"] * 5 + ["rejected"] * 3
    assert dep.calls == 5
    assert breaker.state is State.OPEN
    metrics = breaker.metrics()
    assert metrics.failure_rate == 100.0 and metrics.calls == 5
    assert metrics.not_permitted == 3

    time.sleep(1.05)
    dep.healthy = True
    assert breaker.call(dep) == "ok"
    assert breaker.state is State.HALF_OPEN
    assert breaker.call(dep) == "ok"
    assert breaker.state is State.CLOSED
    assert dep.calls == 7
    # one listener call per transition, each made by the script in Redis
    assert [(e.from_state, e.to_state, e.source) for e in events] == [
        (State.CLOSED, State.OPEN, "redis"), (State.OPEN, State.HALF_OPEN, "redis"),
        (State.HALF_OPEN, State.CLOSED, "redis")]


def test_failure_rate_is_minus_one_below_minimum(name: str, redis_url: str,
                                                 flavour: Flavour) -> None:
    breaker = flavour.breaker(name, redis=redis_url, **SEED)
    dep = Dependency(healthy=False)
    for _ in range(4):
        with pytest.raises(ConnectionError):
            breaker.call(dep)
    metrics = breaker.metrics()
    assert metrics.calls == 4 and metrics.failed == 4
    assert metrics.failure_rate == -1
    assert breaker.state is State.CLOSED


def test_get_state_matches_the_property(name: str, redis_url: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **SEED)
    assert breaker.get_state() is breaker.state is State.CLOSED
    breaker.trip("test")
    assert breaker.get_state() is State.OPEN
