"""``redis="memory://"``: the same Lua on an in-process fakeredis, for users' own tests."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import distbreaker.aio
from distbreaker import (
    Bulkhead,
    BulkheadFull,
    CallNotPermitted,
    CircuitBreaker,
    Policy,
    Registry,
    RetryBudget,
    State,
)
from distbreaker._runtime.connection import memory_client

SMALL = {"sliding_window_size": 2, "minimum_number_of_calls": 2}


@pytest.fixture
def memory(request: pytest.FixtureRequest) -> str:
    """The README's fixture: a fresh in-memory Redis per test."""
    return f"memory://{request.node.nodeid}"


def _fail() -> None:
    raise ConnectionError("down")


def test_breakers_on_one_memory_server_share_the_fleet_state(memory: str) -> None:
    worker_a = CircuitBreaker("payments", redis=memory, **SMALL)
    worker_b = CircuitBreaker("payments", redis=memory, **SMALL)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            worker_a.call(_fail)
    assert worker_b.state is State.OPEN
    with pytest.raises(CallNotPermitted):
        worker_b.call(lambda: "never")
    assert CircuitBreaker("payments", redis=f"{memory}-other").state is State.CLOSED
    keys = sorted(k.decode() for k in memory_client(memory).keys("*"))
    assert keys and all("{payments}" in k for k in keys)  # the real key schema, by the Lua


def test_sync_and_asyncio_clients_share_one_memory_server(memory: str) -> None:
    CircuitBreaker("payments", redis=memory).trip("by the sync breaker")

    async def state() -> State:
        return await distbreaker.aio.CircuitBreaker("payments", redis=memory).get_state()

    assert asyncio.run(state()) is State.OPEN
    assert asyncio.run(state()) is State.OPEN   # another event loop, the same server


def test_bulkhead_waiters_are_woken_by_a_release_in_another_thread(memory: str) -> None:
    bulkhead = Bulkhead("db", redis=memory, max_concurrent_calls=1, max_wait_duration=5)
    held = bulkhead.acquire()
    threading.Timer(0.05, bulkhead.release, (held,)).start()
    started = time.monotonic()
    permit = bulkhead.acquire()
    assert time.monotonic() - started < 4
    with pytest.raises(BulkheadFull):
        Bulkhead("db", redis=memory, max_concurrent_calls=1).acquire()
    bulkhead.release(permit)


def test_asyncio_bulkhead_and_policy(memory: str) -> None:
    async def main() -> tuple[str, int]:
        policy = distbreaker.aio.Policy("api", redis=memory, bulkhead={"max_concurrent_calls": 1},
                                        retry={"max_attempts": 2, "base": 0.001})

        async def ok() -> str:
            return "ok"

        result = await policy.call(ok)
        held = await policy.bulkhead.acquire()
        try:
            with pytest.raises(BulkheadFull):
                await policy.call(ok)
        finally:
            await policy.bulkhead.release(held)
        return result, (await policy.breaker.metrics()).calls

    assert asyncio.run(main()) == ("ok", 1)


def test_policy_budget_and_registry(memory: str) -> None:
    budget = RetryBudget("api", redis=memory, percent_can_retry=0.0, min_retries_per_sec=0.1,
                         ttl=10)
    assert budget.balance() == 1
    attempts = []

    def flaky() -> None:
        attempts.append(1)
        raise ConnectionError("down")

    policy = Policy("api", redis=memory, budget=budget,
                    retry={"max_attempts": 5, "base": 0.001, "cap": 0.001})
    with pytest.raises(ConnectionError):
        policy.call(flaky)
    assert len(attempts) == 2  # one retry: the budget's floor
    registry = Registry.from_dict({"redis": memory, "breakers": {"instances": {"api": {}}}},
                                  environ={})
    assert registry.breaker("api").state is State.CLOSED
    assert registry.health().redis_reachable
