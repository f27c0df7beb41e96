"""`distbreaker.aio.Policy(timeout=...)` against a real redis-server: the attempt is
cancelled, recorded as a failure (and slow), raised as a TimeoutError, retried when
retries are on; the sync Policy has no timeout of its own."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import distbreaker
from distbreaker.aio import Policy
from distbreaker.policy.core import AttemptTimeout


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_late_attempt_is_cancelled_recorded_as_a_failure_and_slow(name: str,
                                                                   redis_url: str) -> None:
    async def scenario() -> None:
        # (a 1 s timeout, slow from 0.5 s: the quick call below stays quick when loaded)
        policy = Policy(name, redis=redis_url, timeout=1.0, bulkhead={"max_concurrent_calls": 1},
                        breaker={"slow_call_duration": 0.5, "minimum_number_of_calls": 10})
        cancelled = asyncio.Event()

        async def hangs() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        with pytest.raises(TimeoutError) as raised:
            await policy.call(hangs)
        assert isinstance(raised.value, AttemptTimeout)
        assert (raised.value.timeout, raised.value.attempt) == (1.0, 1)
        assert cancelled.is_set()
        metrics = await policy.breaker.metrics()
        assert (metrics.calls, metrics.failed, metrics.slow) == (1, 1, 1)
        assert (await policy.bulkhead.metrics()).in_use == 0  # the permit came back

        async def quick() -> str:
            return "ok"

        assert await policy.call(quick) == "ok"
        metrics = await policy.breaker.metrics()
        assert (metrics.calls, metrics.failed, metrics.slow) == (2, 1, 1)

    run(scenario())


def test_a_timeout_is_a_failure_whatever_the_exception_rules(name: str,
                                                            redis_url: str) -> None:
    async def scenario() -> None:
        policy = Policy(name, redis=redis_url, timeout=timedelta(milliseconds=20),
                        breaker={"record_exceptions": (ConnectionError,),
                                 "minimum_number_of_calls": 10})
        with pytest.raises(AttemptTimeout):
            await policy.call(asyncio.sleep, 5)
        metrics = await policy.breaker.metrics()
        assert (metrics.calls, metrics.failed) == (1, 1)

    run(scenario())


def test_a_timed_out_attempt_is_retried(name: str, redis_url: str) -> None:
    async def scenario() -> None:
        calls: list[int] = []

        async def slow_then_fast() -> int:
            calls.append(1)
            if len(calls) == 1:
                await asyncio.sleep(5)
            return len(calls)

        async def no_sleep(seconds: float) -> None:
            return None

        policy = Policy(name, redis=redis_url, timeout=1.0, retry={"max_attempts": 3},
                        sleep=no_sleep, breaker={"minimum_number_of_calls": 10})
        retries: list[Any] = []
        policy.retry.add_listener(retries.append, kinds="retry")
        assert await policy.call(slow_then_fast) == 2
        assert [(e.attempt, type(e.error)) for e in retries] == [(1, AttemptTimeout)]
        metrics = await policy.breaker.metrics()
        assert (metrics.calls, metrics.failed) == (2, 1)

    run(scenario())


def test_the_calls_own_timeout_error_is_not_ours(name: str, redis_url: str) -> None:
    async def scenario() -> None:
        policy = Policy(name, redis=redis_url, timeout=5)

        async def raises() -> None:
            raise TimeoutError("the dependency's own")

        with pytest.raises(TimeoutError) as raised:
            await policy.call(raises)
        assert not isinstance(raised.value, AttemptTimeout)

    run(scenario())


@pytest.mark.parametrize("bad", [0, -1, "soon"])
def test_timeout_must_be_positive_seconds(bad: Any, redis_url: str) -> None:
    with pytest.raises(ValueError, match="timeout"):
        Policy("x", redis=redis_url, timeout=bad)


def test_the_sync_policy_has_no_timeout_of_its_own(redis_url: str) -> None:
    with pytest.raises(TypeError, match="timeout"):
        distbreaker.Policy("x", redis=redis_url, timeout=1)  # type: ignore[call-arg]
