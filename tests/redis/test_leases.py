"""A holder paused between acquiring and calling (SIGSTOP, a GC pause) does not call
with an expired lease: the breaker probe is handed back (ignored) and CallNotPermitted
raised; the bulkhead permit is released and BulkheadFull (with a reason) raised."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import distbreaker
import distbreaker.aio as aio
from distbreaker.breaker.state import State
from distbreaker.errors import BulkheadFull, CallNotPermitted

LEASE = 0.2
PAUSE = LEASE + 0.1
HALF_OPEN = {"wait_duration_in_open_state": 0.05, "half_open_lease": LEASE,
             "permitted_calls_in_half_open": 1, "minimum_number_of_calls": 1}
REASON = "probe lease expired before the call"


def paused_after_acquire(component: Any) -> None:
    """Make `component.acquire` return only after its lease has run out (a frozen holder)."""
    acquire = component.acquire
    if asyncio.iscoroutinefunction(acquire):
        async def late(*args: Any) -> Any:
            permit = await acquire(*args)
            time.sleep(PAUSE)          # the whole process frozen, loop included
            return permit
    else:
        def late(*args: Any) -> Any:   # type: ignore[misc]
            permit = acquire(*args)
            time.sleep(PAUSE)
            return permit
    component.acquire = late


def half_open(breaker: Any) -> None:
    breaker.trip("test")
    time.sleep(0.1)


class Called:
    def __init__(self) -> None:
        self.times = 0

    def __call__(self) -> str:
        self.times += 1
        return "ok"

    async def coro(self) -> str:
        return self()


def assert_probe_refused(error: CallNotPermitted) -> None:
    assert error.state == State.HALF_OPEN
    assert error.reason == REASON


def test_sync_breaker_does_not_call_with_an_expired_probe_lease(name: str,
                                                                redis_url: str) -> None:
    breaker = distbreaker.CircuitBreaker(name, redis=redis_url, **HALF_OPEN)
    half_open(breaker)
    fn = Called()
    paused_after_acquire(breaker)
    with pytest.raises(CallNotPermitted) as caught:
        breaker.call(fn)
    assert_probe_refused(caught.value)
    with pytest.raises(CallNotPermitted) as caught:
        with breaker:
            fn()
    assert_probe_refused(caught.value)
    assert fn.times == 0
    metrics = breaker.metrics()
    assert (metrics.state, metrics.calls, metrics.probes_in_flight) == (State.HALF_OPEN, 0, 0)
    del breaker.acquire                # no pause: the probe is free again and closes it
    assert breaker.call(fn) == "ok" and fn.times == 1
    assert breaker.state is State.CLOSED


def test_a_probe_called_in_time_runs(name: str, redis_url: str) -> None:
    breaker = distbreaker.CircuitBreaker(name, redis=redis_url, **{**HALF_OPEN,
                                                                   "half_open_lease": 5})
    half_open(breaker)
    paused_after_acquire(breaker)      # 0.3 s pause, 5 s lease
    assert breaker.call(Called()) == "ok"
    assert breaker.state is State.CLOSED


def test_asyncio_breaker_does_not_call_with_an_expired_probe_lease(name: str,
                                                                   redis_url: str) -> None:
    async def scenario() -> None:
        breaker = aio.CircuitBreaker(name, redis=redis_url, **HALF_OPEN)
        await breaker.trip("test")
        await asyncio.sleep(0.1)
        fn = Called()
        paused_after_acquire(breaker)
        with pytest.raises(CallNotPermitted) as caught:
            await breaker.call(fn.coro)
        assert_probe_refused(caught.value)
        with pytest.raises(CallNotPermitted) as caught:
            async with breaker:
                fn()
        assert_probe_refused(caught.value)
        assert fn.times == 0
        assert (await breaker.metrics()).probes_in_flight == 0
        del breaker.acquire
        assert await breaker.call(fn.coro) == "ok"
        assert await breaker.get_state() is State.CLOSED
        await breaker.aclose()

    asyncio.run(scenario())


def test_policy_attempt_does_not_call_with_an_expired_probe_lease(name: str,
                                                                  redis_url: str) -> None:
    policy = distbreaker.Policy(name, redis=redis_url, breaker=HALF_OPEN,
                                bulkhead={"max_concurrent_calls": 1})
    half_open(policy.breaker)
    fn = Called()
    paused_after_acquire(policy.breaker)
    with pytest.raises(CallNotPermitted) as caught:
        policy.call(fn)
    assert_probe_refused(caught.value)
    assert fn.times == 0
    assert policy.breaker.metrics().probes_in_flight == 0
    assert policy.bulkhead.metrics().in_use == 0      # the bulkhead permit went back too
    del policy.breaker.acquire
    assert policy.call(fn) == "ok"


def test_asyncio_policy_attempt_does_not_call_with_an_expired_bulkhead_lease(
        name: str, redis_url: str) -> None:
    async def scenario() -> None:
        policy = aio.Policy(name, redis=redis_url,
                            bulkhead={"max_concurrent_calls": 1, "lease": LEASE})
        policy.bulkhead._schedule_renewal = lambda permit: None   # renewals frozen too
        fn = Called()
        paused_after_acquire(policy.bulkhead)
        with pytest.raises(BulkheadFull) as caught:
            await policy.call(fn.coro)
        assert caught.value.reason == "permit lease expired before the call"
        assert fn.times == 0
        assert (await policy.breaker.metrics()).calls == 0  # counted nowhere
        del policy.bulkhead.acquire
        assert await policy.call(fn.coro) == "ok"

    asyncio.run(scenario())


def test_sync_bulkhead_does_not_call_with_an_expired_lease(name: str,
                                                           redis_url: str) -> None:
    bulkhead = distbreaker.Bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=LEASE)
    bulkhead._renewer.add = lambda permit: None         # the renewer frozen with the process
    fn = Called()
    paused_after_acquire(bulkhead)
    with pytest.raises(BulkheadFull) as caught:
        bulkhead.call(fn)
    assert caught.value.reason == "permit lease expired before the call"
    assert "lease expired" in str(caught.value)
    with pytest.raises(BulkheadFull):
        with bulkhead:
            fn()
    assert fn.times == 0
    assert bulkhead.metrics().in_use == 0
    assert bulkhead.local_counts().lost == 0            # no call ran without a permit
    del bulkhead.acquire
    assert bulkhead.call(fn) == "ok"


def test_a_renewed_bulkhead_lease_is_not_expired(name: str, redis_url: str) -> None:
    bulkhead = distbreaker.Bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=LEASE)
    paused_after_acquire(bulkhead)    # not frozen: the renewer keeps the lease alive
    assert bulkhead.call(Called()) == "ok"
    assert bulkhead.local_counts().lost == 0


def test_asyncio_bulkhead_does_not_call_with_an_expired_lease(name: str,
                                                              redis_url: str) -> None:
    async def scenario() -> None:
        bulkhead = aio.Bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=LEASE)
        bulkhead._schedule_renewal = lambda permit: None
        fn = Called()
        paused_after_acquire(bulkhead)
        with pytest.raises(BulkheadFull) as caught:
            await bulkhead.call(fn.coro)
        assert caught.value.reason == "permit lease expired before the call"
        with pytest.raises(BulkheadFull):
            async with bulkhead:
                fn()
        assert fn.times == 0
        assert (await bulkhead.metrics()).in_use == 0
        del bulkhead.acquire
        assert await bulkhead.call(fn.coro) == "ok"
        await bulkhead.aclose()

    asyncio.run(scenario())
