"""Retry drawing on a real RetryBudget: exhausted in Redis, local while Redis is down,
and the asyncio Retry with the asyncio budget. Waits advance a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from distbreaker import HttpStatusError
from distbreaker.breaker.state import State
from distbreaker.budget.aio import RetryBudget as AsyncRetryBudget
from distbreaker.budget.sync import RetryBudget
from distbreaker.demo.embedded import free_port
from distbreaker.errors import CallNotPermitted
from distbreaker.retry.aio import Retry as AsyncRetry
from distbreaker.retry.sync import Retry
from tests.helpers.fake_time import FakeTime, Flaky, check_exhausted


def test_exhausted_real_budget_makes_the_original_error_final(redis_url: str, name: str) -> None:
    fake = FakeTime()
    budget = RetryBudget(name, redis=redis_url, percent_can_retry=0, min_retries_per_sec=0.1,
                         ttl=10)                                  # floor: exactly 1 retry
    retry = Retry(sleep=fake.sleep, clock=fake.clock, max_attempts=5, budget=budget)
    first = Flaky(forever=ConnectionError("down"))
    with pytest.raises(ConnectionError, match="down") as caught:
        retry.call(first)
    assert first.calls == 2                                       # 1 retry, then exhausted
    check_exhausted(caught.value, name)
    second = Flaky(forever=ConnectionError("down"))
    with pytest.raises(ConnectionError):
        retry.call(second)
    assert second.calls == 1 and len(fake.sleeps) == 1
    assert budget.balance() == 0


def test_retry_with_redis_down_uses_the_local_budget(name: str) -> None:
    fake = FakeTime()
    budget = RetryBudget(name, redis=f"redis://127.0.0.1:{free_port()}/0", percent_can_retry=0,
                         min_retries_per_sec=0.3, ttl=10)          # local floor: 3 retries
    dep = Flaky(forever=ConnectionError("down"))
    retry = Retry(sleep=fake.sleep, clock=fake.clock, max_attempts=10, budget=budget)
    with pytest.raises(ConnectionError) as caught:
        retry.call(dep)                                           # no Redis error escapes
    assert dep.calls == 4 and budget.last_source == "local"
    check_exhausted(caught.value, name)


def test_async_retry_mirrors_sync(redis_url: str, name: str) -> None:
    fake = FakeTime()

    async def main() -> None:
        budget = AsyncRetryBudget(name, redis=redis_url, percent_can_retry=0,
                                  min_retries_per_sec=0.2, ttl=10)   # floor 2
        retry = AsyncRetry(max_attempts=5, budget=budget, sleep=fake.asleep, clock=fake.clock,
                           jitter="none", base=0.1)
        calls: list[str] = []

        @retry
        async def fetch(kind: str) -> str:
            calls.append(kind)
            if kind == "cnp":
                raise CallNotPermitted("dep", State.OPEN, 1.0)
            if kind == "400":
                raise HttpStatusError(400)
            if kind == "ra" and calls.count("ra") == 1:
                raise HttpStatusError(503, {"Retry-After": "2"})
            if kind == "down":
                raise ConnectionError("down")
            return kind

        with pytest.raises(CallNotPermitted):
            await fetch("cnp")
        with pytest.raises(HttpStatusError):
            await fetch("400")
        assert await fetch("ra") == "ra"                            # 1 retry, after 2 s
        with pytest.raises(ConnectionError) as caught:
            await fetch("down")                                     # 1 retry left, then final
        check_exhausted(caught.value, name)
        assert calls == ["cnp", "400", "ra", "ra", "down", "down"]
        assert fake.sleeps == [2.0, 0.1]
        assert await budget.balance() == 0

    asyncio.run(main())
