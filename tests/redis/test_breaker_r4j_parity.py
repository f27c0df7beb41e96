"""Issue 15's disagreements with Resilience4j 2.3's own circuit-breaker tests, with its
numbers, against a real redis-server, with the sync and the asyncio breaker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted
from tests.helpers.flavours import Flavour
from tests.helpers.records import read_record

WAIT = 0.2


@pytest.fixture
def make(name: str, redis_url: str, flavour: Flavour) -> Callable[..., CircuitBreaker]:
    def build(**options: Any) -> CircuitBreaker:
        settings = {"failure_rate_threshold": 50, "slow_call_rate_threshold": 50,
                    "sliding_window_size": 10, "minimum_number_of_calls": 10,
                    "permitted_calls_in_half_open": 4, "wait_duration_in_open_state": WAIT}
        return flavour.breaker(name, redis=redis_url, **{**settings, **options})
    return build


def boom() -> None:
    raise ConnectionError("down")


def calls(breaker: CircuitBreaker, good: int, bad: int) -> None:
    for _ in range(good):
        breaker.call(lambda: "ok")
    for _ in range(bad):
        with pytest.raises(ConnectionError):
            breaker.call(boom)


def test_back_to_open_keeps_the_half_open_failure_figures(
        make: Callable[..., CircuitBreaker]) -> None:
    """shouldTransitionBackToOpenStateWhenFailureRateIsAboveThreshold."""
    breaker = make()
    calls(breaker, 4, 6)  # 60 % of 10 calls: OPEN
    assert breaker.state is State.OPEN
    time.sleep(WAIT + 0.05)
    calls(breaker, 1, 3)  # 3 of 4 probes fail: back to OPEN
    metrics = breaker.metrics()
    assert metrics.state is State.OPEN
    assert (metrics.failure_rate, metrics.calls, metrics.failed) == (75.0, 4, 3)
    assert metrics.calls - metrics.failed == 1  # 1 successful


def test_back_to_open_keeps_the_half_open_slow_call_figures(
        make: Callable[..., CircuitBreaker]) -> None:
    """shouldTransitionBackToOpenStateWhenSlowCallRateIsAboveThreshold."""
    breaker = make(slow_call_duration=0.02)
    breaker.trip("start open")
    time.sleep(WAIT + 0.05)
    breaker.call(lambda: "fast")
    for _ in range(3):
        breaker.call(lambda: time.sleep(0.04))
    metrics = breaker.metrics()
    assert metrics.state is State.OPEN
    assert (metrics.slow_call_rate, metrics.slow, metrics.calls) == (75.0, 3, 4)


def test_an_open_made_by_the_window_does_not_show_old_probe_figures(
        make: Callable[..., CircuitBreaker]) -> None:
    breaker = make()
    calls(breaker, 4, 6)
    time.sleep(WAIT + 0.05)
    calls(breaker, 4, 0)  # the probes close it
    calls(breaker, 0, 10)  # the window opens it again
    metrics = breaker.metrics()
    assert (metrics.state, metrics.calls, metrics.failed, metrics.failure_rate) == (
        State.OPEN, 10, 10, 100.0)


def test_the_not_permitted_count_restarts_in_every_state_and_on_reset(
        make: Callable[..., CircuitBreaker]) -> None:
    """shouldTransitionToHalfOpenAfterWaitDuration: 2 rejected in OPEN, 0 in HALF_OPEN."""
    breaker = make()
    breaker.trip()
    for _ in range(2):
        with pytest.raises(CallNotPermitted):
            breaker.call(lambda: "never")
    assert breaker.metrics().not_permitted == 2
    time.sleep(WAIT + 0.05)
    metrics = breaker.metrics()
    assert (metrics.state, metrics.not_permitted) == (State.HALF_OPEN, 0)
    breaker.transition_to_forced_open()
    with pytest.raises(CallNotPermitted):
        breaker.call(lambda: "never")
    assert breaker.metrics().not_permitted == 1
    breaker.reset()
    assert breaker.metrics().not_permitted == 0


# -- initial state, and where a HALF_OPEN that outlived its max wait goes ------------
def test_a_new_breaker_starts_in_its_initial_state(
        make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(initial_state="FORCED_OPEN")
    with pytest.raises(CallNotPermitted) as rejected:
        breaker.call(lambda: "never")
    assert (rejected.value.state, rejected.value.reason) == (State.FORCED_OPEN, "initial state")
    assert breaker.state is State.FORCED_OPEN
    assert breaker.reset() is State.CLOSED  # reset() goes to CLOSED, as in Resilience4j


def test_metrics_only_initial_state_records_but_never_trips(
        make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(initial_state="metrics_only")
    calls(breaker, 0, 10)
    metrics = breaker.metrics()
    assert (metrics.state, metrics.calls, metrics.failed) == (State.METRICS_ONLY, 10, 10)


def test_max_wait_in_half_open_can_close_the_breaker(
        make: Callable[..., CircuitBreaker]) -> None:
    """Resilience4j 2.x transitionToStateAfterWaitDuration = CLOSED."""
    breaker = make(max_wait_in_half_open=0.2, transition_after_max_wait_in_half_open="CLOSED")
    breaker.trip()
    time.sleep(WAIT + 0.05)
    assert breaker.state is State.HALF_OPEN
    time.sleep(0.25)  # no probe reported within the max wait
    assert breaker.state is State.CLOSED


def test_the_default_wire_string_is_unchanged_and_new_fields_round_trip() -> None:
    from distbreaker.breaker.config import BreakerConfig

    assert BreakerConfig().to_wire() == "1;C;100;100;50;100;60000;10;0;60000;3600000;60000"
    for options, tail in (({"initial_state": "FORCED_OPEN"}, ";F"),
                          ({"transition_after_max_wait_in_half_open": "CLOSED"}, ";C;C"),
                          ({"initial_state": "DISABLED",
                            "transition_after_max_wait_in_half_open": "CLOSED"}, ";D;C")):
        config = BreakerConfig(**options)
        wire = config.to_wire()
        assert wire.endswith("60000" + tail)
        assert BreakerConfig.from_wire(wire).to_wire() == wire
    with pytest.raises(ValueError, match="initial_state"):
        BreakerConfig(initial_state="HALF_OPEN")
    with pytest.raises(ValueError, match="transition_after"):
        BreakerConfig(transition_after_max_wait_in_half_open="FORCED_OPEN")


# -- waitIntervalFunctionInOpenState, as data, decided in the script ------------------
def open_wait_ms(client: Any, breaker: Any) -> int:
    record = read_record(client, breaker.keys)
    return int(record["open_until"]) - int(record["since"])


def test_exponential_open_wait_with_a_cap_reset_by_a_close(
        make: Callable[..., CircuitBreaker], redis_client: Any) -> None:
    """IntervalFunction.ofExponentialBackoff(100 ms, 2.0), capped at 300 ms."""
    breaker = make(wait_duration_in_open_state=0.1, wait_interval_multiplier=2,
                   max_wait_duration_in_open_state=0.3, permitted_calls_in_half_open=1)
    breaker.trip()
    waits = [open_wait_ms(redis_client, breaker)]
    for _ in range(3):  # each failed probe opens it again, for longer
        time.sleep(waits[-1] / 1000 + 0.03)
        calls(breaker, 0, 1)
        assert breaker.state is State.OPEN
        waits.append(open_wait_ms(redis_client, breaker))
    assert waits == [100, 200, 300, 300]
    time.sleep(0.33)
    calls(breaker, 1, 0)  # a successful probe closes it: the count starts again
    assert breaker.state is State.CLOSED
    breaker.trip()
    assert open_wait_ms(redis_client, breaker) == 100


def test_randomized_open_wait_stays_within_its_spread(
        make: Callable[..., CircuitBreaker], redis_client: Any) -> None:
    breaker = make(wait_duration_in_open_state=1, wait_randomization_factor=0.5)
    seen = set()
    for _ in range(8):
        breaker.trip()
        seen.add(open_wait_ms(redis_client, breaker))
        breaker.reset()
    assert all(500 <= w <= 1500 for w in seen) and len(seen) > 1


def test_wait_interval_fields_round_trip_on_the_wire() -> None:
    from distbreaker.breaker.config import BreakerConfig

    config = BreakerConfig(wait_interval_multiplier=1.5, max_wait_duration_in_open_state=600,
                           wait_randomization_factor=0.25)
    assert config.to_wire().endswith(";60000;C;O;1.5;600000;0.25")
    assert BreakerConfig.from_wire(config.to_wire()).to_wire() == config.to_wire()
    with pytest.raises(ValueError, match="max_wait_duration_in_open_state"):
        BreakerConfig(max_wait_duration_in_open_state=1)  # below the open wait
    with pytest.raises(ValueError, match="wait_randomization_factor"):
        BreakerConfig(wait_randomization_factor=2)
