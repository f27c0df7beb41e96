"""Events for every outcome, per process, against a real redis-server, both flavours:
the breaker's call outcomes, rejections, reset and threshold trips (transitions stay
the fleet-wide `Transition`s), the bulkhead's and the retry's events, coroutine
listeners on asyncio, and no event object built when nobody listens."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import distbreaker
import distbreaker.aio
from distbreaker._runtime.events import Event
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from distbreaker.errors import BulkheadFull, CallNotPermitted
from tests.helpers.flavours import Flavour


def fail(exc: BaseException) -> Any:
    raise exc


def kinds(events: list[Any]) -> list[str]:
    return [e.kind if isinstance(e, Event) else "transition" for e in events]


def test_success_error_and_ignored_error_carry_duration_and_error(
        flavour: Flavour, name: str, redis_url: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, ignore_exceptions=(KeyError,))
    seen: list[Event] = []
    breaker.add_listener(seen.append, kinds=["success", "error", "ignored_error"])
    assert breaker.call(lambda: 1) == 1
    boom, ignored = ConnectionError("down"), KeyError("k")
    for exc in (boom, ignored):
        with pytest.raises(type(exc)):
            breaker.call(fail, exc)
    assert kinds(seen) == ["success", "error", "ignored_error"]
    assert all(e.component == "breaker" and e.name == name for e in seen)
    assert all(e.duration is not None and e.duration >= 0 for e in seen)
    assert seen[0].error is None and seen[1].error is boom and seen[2].error is ignored


def test_a_result_recorded_as_failure_is_an_error_event(flavour: Flavour, name: str,
                                                       redis_url: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, record_result=lambda r: r == "bad")
    seen: list[Event] = []
    breaker.add_listener(seen.append, kinds="error")
    assert breaker.call(lambda: "bad") == "bad"
    assert kinds(seen) == ["error"]
    assert isinstance(seen[0].error, distbreaker.ResultRecordedAsFailure)


def test_slow_calls(flavour: Flavour, name: str, redis_url: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, slow_call_duration=0.01)
    seen: list[Event] = []
    breaker.add_listener(seen.append, kinds="*")
    breaker.call(lambda: None)
    breaker.call(lambda: time.sleep(0.03))
    assert kinds(seen) == ["success", "success", "slow"]
    assert seen[2].duration is not None and seen[2].duration >= 0.01


def test_not_permitted_has_the_reason_and_reset_is_an_event(flavour: Flavour, name: str,
                                                           redis_url: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url)
    seen: list[Event] = []
    breaker.add_listener(seen.append, kinds=("not_permitted", "reset"))
    breaker.trip("maintenance")
    for _ in range(2):  # the first asks Redis, the second is rejected by the local view
        with pytest.raises(CallNotPermitted):
            breaker.call(lambda: None)
    breaker.reset("back")
    assert kinds(seen) == ["not_permitted", "not_permitted", "reset"]
    assert [e.reason for e in seen] == ["maintenance", "maintenance", "back"]
    assert seen[0].state is State.OPEN and isinstance(seen[0].error, CallNotPermitted)
    assert seen[2].state is State.CLOSED


def test_failure_rate_exceeded_comes_before_the_transition(flavour: Flavour, name: str,
                                                          redis_url: str) -> None:
    # Resilience4j: window 4, minimum 4, threshold 50: the 4th call (2 of 4 failed)
    # publishes ERROR, FAILURE_RATE_EXCEEDED (50 %), then the CLOSED -> OPEN transition.
    breaker = flavour.breaker(name, redis=redis_url, sliding_window_size=4,
                              minimum_number_of_calls=4)
    seen: list[Any] = []
    breaker.add_listener(seen.append, kinds="*")
    breaker.call(lambda: None)
    breaker.call(lambda: None)
    with pytest.raises(ConnectionError):
        breaker.call(fail, ConnectionError())
    with pytest.raises(ConnectionError):
        breaker.call(fail, ConnectionError())
    assert kinds(seen) == ["success", "success", "error", "error",
                           "failure_rate_exceeded", "transition"]
    assert seen[4].rate == 50.0
    assert isinstance(seen[5], Transition) and seen[5].to_state is State.OPEN


def test_slow_call_rate_exceeded(flavour: Flavour, name: str, redis_url: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, sliding_window_size=2,
                              minimum_number_of_calls=2, slow_call_duration=0.01,
                              slow_call_rate_threshold=50)
    seen: list[Any] = []
    breaker.add_listener(seen.append, kinds=("slow_call_rate_exceeded", "transition"))
    breaker.call(lambda: None)
    breaker.call(lambda: time.sleep(0.03))
    assert kinds(seen) == ["slow_call_rate_exceeded", "transition"]
    assert seen[0].rate == 50.0 and seen[1].to_state is State.OPEN


def test_add_listener_without_kinds_still_gets_transitions_only(
        flavour: Flavour, name: str, redis_url: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url)
    seen: list[Any] = []
    breaker.add_listener(seen.append)
    breaker.call(lambda: None)
    breaker.trip()
    assert len(seen) == 1 and isinstance(seen[0], Transition)
    breaker.remove_listener(seen.append)
    breaker.reset()
    assert len(seen) == 1
    with pytest.raises(ValueError, match="kinds must be among"):
        breaker.add_listener(seen.append, kinds="sucess")


def test_no_event_is_built_when_nobody_listens(flavour: Flavour, name: str, redis_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an event was built with no listener")

    for module in ("distbreaker.breaker.core", "distbreaker.bulkhead.core",
                   "distbreaker.retry.core"):
        monkeypatch.setattr(f"{module}.Event", forbidden)
    breaker = flavour.breaker(name, redis=redis_url, slow_call_duration=0.001,
                              sliding_window_size=2, minimum_number_of_calls=2)
    breaker.call(lambda: time.sleep(0.005))
    with pytest.raises(ConnectionError):
        breaker.call(fail, ConnectionError())
    with pytest.raises(CallNotPermitted):
        breaker.call(lambda: None)
    breaker.reset()
    bulkhead = flavour.bulkhead(name + "-b", redis=redis_url, max_concurrent_calls=1)
    bulkhead.release(bulkhead.acquire())
    policy = flavour.policy(name + "-p", redis=redis_url, retry={"max_attempts": 2},
                            sleep=flavour.no_sleep)
    with pytest.raises(ConnectionError):
        policy.call(fail, ConnectionError())


def test_bulkhead_permitted_rejected_finished(flavour: Flavour, name: str,
                                             redis_url: str) -> None:
    bulkhead = flavour.bulkhead(name, redis=redis_url, max_concurrent_calls=1)
    seen: list[Event] = []
    bulkhead.add_listener(seen.append)
    held = bulkhead.acquire()
    with pytest.raises(BulkheadFull):
        bulkhead.acquire()
    bulkhead.release(held)
    bulkhead.release(held)  # idempotent: one finished event
    assert kinds(seen) == ["permitted", "rejected", "finished"]
    assert all(e.component == "bulkhead" and e.name == name for e in seen)
    assert isinstance(seen[1].error, BulkheadFull) and "1 of 1" in seen[1].reason
    assert seen[2].duration is not None and seen[2].duration >= 0


def test_retry_and_exhausted_from_a_policy(flavour: Flavour, name: str,
                                          redis_url: str) -> None:
    policy = flavour.policy(name, redis=redis_url, sleep=flavour.no_sleep,
                            retry={"max_attempts": 3, "retry_on": (ConnectionError,)})
    seen: list[Event] = []
    policy.retry.add_listener(seen.append)
    error = ConnectionError("down")
    with pytest.raises(ConnectionError):
        policy.call(fail, error)
    assert kinds(seen) == ["retry", "retry", "exhausted"]
    assert [e.attempt for e in seen] == [1, 2, 3]
    assert all(e.error is error and e.name == name for e in seen)
    assert seen[2].reason == "max attempts"
    seen.clear()
    with pytest.raises(ValueError):  # not transient: a plain failure, not an exhaustion
        policy.call(fail, ValueError())
    assert seen == []


def test_a_plain_retry_emits_too() -> None:
    retry = distbreaker.Retry(max_attempts=2, sleep=lambda s: None)
    seen: list[Event] = []
    retry.add_listener(seen.append, kinds="exhausted")
    with pytest.raises(ConnectionError):
        retry.call(fail, ConnectionError())
    assert kinds(seen) == ["exhausted"] and seen[0].component == "retry"

    async def scenario() -> list[Event]:
        aio_retry = distbreaker.aio.Retry(max_attempts=2, sleep=_no_sleep)
        got: list[Event] = []
        aio_retry.add_listener(got.append)

        async def down() -> None:
            raise ConnectionError()

        with pytest.raises(ConnectionError):
            await aio_retry.call(down)
        return got

    assert kinds(asyncio.run(scenario())) == ["retry", "exhausted"]


async def _no_sleep(seconds: float) -> None:
    return None


def test_coroutine_listeners_run_as_tasks_on_the_loop(name: str, redis_url: str) -> None:
    async def scenario() -> list[str]:
        breaker = distbreaker.aio.CircuitBreaker(name, redis=redis_url)
        got: list[str] = []
        me = asyncio.current_task()

        async def listener(event: Event) -> None:
            assert asyncio.current_task() is not me  # a task of its own, not awaited
            await asyncio.sleep(0)
            got.append(event.kind)

        breaker.add_listener(listener, kinds=("success", "reset"))

        async def ok() -> int:
            return 1

        assert await breaker.call(ok) == 1
        await breaker.reset()
        await asyncio.sleep(0.01)
        await breaker.aclose()
        return got

    assert asyncio.run(scenario()) == ["success", "reset"]


def test_a_coroutine_listener_without_a_loop_is_logged(name: str, redis_url: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    breaker = distbreaker.CircuitBreaker(name, redis=redis_url)

    async def listener(event: Event) -> None:
        raise AssertionError("never run")

    breaker.add_listener(listener, kinds="success")
    with caplog.at_level(logging.ERROR, logger="distbreaker"):
        assert breaker.call(lambda: 5) == 5
    assert "no event loop runs here" in caplog.text
    breaker.close()


def test_a_failing_listener_never_breaks_the_call(flavour: Flavour, name: str,
                                                 redis_url: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url)

    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    breaker.add_listener(broken, kinds="*")
    assert breaker.call(lambda: 3) == 3
