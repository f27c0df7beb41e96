"""What only the asyncio Policy has, against a real redis-server: a coroutine fallback,
cancellation while recording, the coroutine-only decorator, its round trips. The shared
behaviour is in test_policy.py, run with each flavour."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from distbreaker.aio import Policy
from distbreaker.errors import BulkheadFull
from tests.helpers.dependency import AsyncDependency
from tests.helpers.waiting import await_until


def test_a_coroutine_fallback_is_awaited(name: str, redis_url: str) -> None:
    async def fallback(error: BaseException) -> str:
        return f"queued after {type(error).__name__}"

    async def scenario() -> str:
        down = Policy(name, redis=redis_url, fallback=fallback)
        return await down.call(AsyncDependency(ConnectionError("x")))

    assert asyncio.run(scenario()) == "queued after ConnectionError"


def test_cancelled_while_recording_still_releases_the_permit(name: str,
                                                             redis_url: str) -> None:
    """A cancellation that lands after the call, during the release+record pipeline,
    must not leave the bulkhead permit taken until its lease (30 s) expires."""
    async def scenario() -> tuple[list[Any], int, int]:
        policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 1})
        await policy.call(AsyncDependency("warm-up"))

        async def cancelled_on_return() -> str:
            # The pipeline must open a new connection, so the cancellation lands
            # before release+record are sent (as a timeout around the call may).
            await policy.bulkhead._loop().client.connection_pool.disconnect()
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # delivered at the policy's next await: its release+record
            return "done"

        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(policy.call(cancelled_on_return))
        outcomes: list[Any] = []

        async def let_in() -> bool:
            try:
                outcomes.append(await policy.call(AsyncDependency("ok")))
            except BulkheadFull:
                outcomes.append("full")
            return outcomes[-1] == "ok"

        # the permit comes back soon (its release is still sent), not after the 30 s
        # lease: 10 s is generous for a loaded machine and far from the lease
        await await_until(let_in, timeout=10, interval=0.05, what="the permit is back")
        metrics = await policy.breaker.metrics()
        return outcomes, (await policy.bulkhead.metrics()).in_use, metrics.calls

    outcomes, in_use, calls = asyncio.run(scenario())
    assert outcomes[-1] == "ok"
    assert in_use == 0
    assert calls == 3  # warm-up, the cancelled call (it did run) and the last one


def test_decorating_a_plain_function_is_a_type_error(name: str, redis_url: str) -> None:
    policy = Policy(name, redis=redis_url)
    with pytest.raises(TypeError, match="coroutine"):
        policy(lambda: "sync")


def test_full_policy_costs_two_round_trips_per_attempt_in_closed(name: str,
                                                                 redis_url: str) -> None:
    async def scenario() -> int:
        policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 5},
                        retry={"max_attempts": 2},
                        budget={"percent_can_retry": 0.2, "min_retries_per_sec": 1})
        await policy.call(AsyncDependency("warm-up"))  # learns CLOSED, loads scripts
        pool = policy.breaker._client.connection_pool
        assert policy.bulkhead._loop().client.connection_pool is pool
        original, sent = pool.get_connection, []

        async def counting(*args: Any, **kwargs: Any) -> Any:
            sent.append(1)
            return await original(*args, **kwargs)

        pool.get_connection = counting
        for _ in range(20):
            assert await policy.call(AsyncDependency("ok")) == "ok"
        return len(sent)

    # one acquire + one pipeline (release, record, deposit) per call
    assert asyncio.run(scenario()) == 40
