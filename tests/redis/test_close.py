"""close() / aclose(): a component closes the clients it built from a URL (the lease
waiting client included), sends what it batched first, and leaves a given client open."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio

import distbreaker
import distbreaker.aio as aio
from distbreaker.errors import BulkheadFull
from tests.helpers.waiting import wait_until

COMPONENTS = ["CircuitBreaker", "Bulkhead", "RetryBudget", "GaneshaBreaker", "RateLimiter"]


def connections(client: redis.Redis, label: str) -> int:
    """Server-side connections named `label` (the client_name of the URL)."""
    return sum(1 for c in client.client_list() if c.get("name") == label)


def build(module: Any, component: str, name: str, redis_arg: Any) -> Any:
    if component == "Bulkhead":  # one permit, short waits: the waiting client gets used
        return module.Bulkhead(name, redis=redis_arg, max_concurrent_calls=1,
                               max_wait_duration=0.05)
    if component == "GaneshaBreaker":
        return module.GaneshaBreaker(name, redis=redis_arg)
    return getattr(module, component)(name, redis=redis_arg)


def use(component: str, item: Any) -> None:
    """Make Redis calls through every client the sync component opens."""
    if component == "Bulkhead":
        with item:
            with pytest.raises(BulkheadFull):
                item.acquire()          # waits on the notify list: the waiting client
    elif component == "RetryBudget":
        item.deposit()
    else:
        item.call(lambda: "ok")


async def use_async(component: str, item: Any) -> None:
    async def ok() -> str:
        return "ok"

    if component == "Bulkhead":
        async with item:
            with pytest.raises(BulkheadFull):
                await item.acquire()
    elif component == "RetryBudget":
        await item.deposit()
    else:
        await item.call(ok)


@pytest.mark.parametrize("component", COMPONENTS)
def test_sync_close_closes_the_clients_it_built(component: str, name: str, redis_url: str,
                                                redis_client: redis.Redis) -> None:
    label = f"close-{name}"
    item = build(distbreaker, component, name, f"{redis_url}?client_name={label}")
    use(component, item)
    assert connections(redis_client, label) >= 1
    item.close()
    wait_until(lambda: connections(redis_client, label) == 0, what="connections gone")


@pytest.mark.parametrize("component", COMPONENTS)
def test_aclose_closes_the_clients_it_built(component: str, name: str, redis_url: str,
                                            redis_client: redis.Redis) -> None:
    label = f"aclose-{name}"

    async def scenario() -> None:
        item = build(aio, component, name, f"{redis_url}?client_name={label}")
        await use_async(component, item)
        assert connections(redis_client, label) >= 1
        await item.aclose()
        wait_until(lambda: connections(redis_client, label) == 0, what="connections gone")

    asyncio.run(scenario())


@pytest.mark.parametrize("component", COMPONENTS)
def test_close_leaves_a_given_client_open(component: str, name: str, redis_url: str,
                                          redis_client: redis.Redis) -> None:
    label = f"given-{name}"
    given = redis.Redis.from_url(f"{redis_url}?client_name={label}")
    item = build(distbreaker, component, name, given)
    use(component, item)
    item.close()
    assert given.ping() and connections(redis_client, label) >= 1
    given.close()


@pytest.mark.parametrize("component", COMPONENTS)
def test_aclose_leaves_a_given_client_open(component: str, name: str, redis_url: str,
                                           redis_client: redis.Redis) -> None:
    label = f"given-aio-{name}"

    async def scenario() -> None:
        given = redis.asyncio.Redis.from_url(f"{redis_url}?client_name={label}")
        item = build(aio, component, name, given)
        await use_async(component, item)
        await item.aclose()
        assert await given.ping() and connections(redis_client, label) >= 1
        await given.aclose()

    asyncio.run(scenario())


BATCHED = {"record_mode": "batched", "flush_interval": 30.0, "max_batch": 1000}
BUDGET = {"percent_can_retry": 1.0, "min_retries_per_sec": 0, "deposit_batch": 10}


def test_close_sends_batched_outcomes_and_deposits_first(name: str, redis_url: str) -> None:
    breaker = distbreaker.CircuitBreaker(name, redis=redis_url, **BATCHED)
    budget = distbreaker.RetryBudget(name, redis=redis_url, **BUDGET)
    for _ in range(5):
        breaker.call(lambda: "ok")
    for _ in range(3):
        assert budget.deposit() is None                      # batched: nothing sent yet
    breaker.close()
    budget.close()
    assert distbreaker.CircuitBreaker(name, redis=redis_url, **BATCHED).metrics().calls == 5
    assert distbreaker.RetryBudget(name, redis=redis_url, **BUDGET).balance() == 3


def test_aclose_sends_batched_outcomes_and_deposits_first(name: str, redis_url: str) -> None:
    async def ok() -> str:
        return "ok"

    async def scenario() -> tuple[int, int]:
        breaker = aio.CircuitBreaker(name, redis=redis_url, **BATCHED)
        budget = aio.RetryBudget(name, redis=redis_url, **BUDGET)
        for _ in range(5):
            await breaker.call(ok)
        for _ in range(3):
            assert await budget.deposit() is None
        await breaker.aclose()
        await budget.aclose()
        reader = aio.CircuitBreaker(name, redis=redis_url, **BATCHED)
        calls = (await reader.metrics()).calls
        balance = await aio.RetryBudget(name, redis=redis_url, **BUDGET).balance()
        await reader.aclose()
        return calls, balance

    assert asyncio.run(scenario()) == (5, 3)
