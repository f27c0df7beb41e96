"""The asyncio Policy passes the same behavioural tests as the sync one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from distbreaker.aio import Policy
from distbreaker.breaker.classify import HttpStatusError
from distbreaker.breaker.state import State
from distbreaker.errors import BulkheadFull
from tests.helpers.dependency import AsyncDependency, outcome_async
from tests.redis.test_policy import NO_SLEEP, Response


async def no_sleep(seconds: float) -> None:
    return None


def test_default_policy_stops_at_the_breaker(name: str, redis_url: str) -> None:
    async def scenario() -> tuple[list[str], int, State]:
        dep = AsyncDependency(ConnectionError("down"))
        policy = Policy(name, redis=redis_url,
                        breaker={"sliding_window_size": 6, "minimum_number_of_calls": 6,
                                 "wait_duration_in_open_state": 60},
                        retry={"max_attempts": 3, **NO_SLEEP}, sleep=no_sleep)
        outcomes = [await outcome_async(lambda: policy.call(dep)) for _ in range(6)]
        return outcomes, dep.calls, await policy.breaker.get_state()

    outcomes, calls, state = asyncio.run(scenario())
    assert calls == 6
    assert outcomes == ["failed", "failed"] + ["rejected"] * 4
    assert state is State.OPEN


def test_bulkhead_trap_keeps_the_breaker_closed(name: str, redis_url: str) -> None:
    async def scenario() -> tuple[list[Any], AsyncDependency, Any]:
        dep = AsyncDependency("ok", delay=0.3)
        policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 3},
                        breaker={"sliding_window_size": 10, "minimum_number_of_calls": 5},
                        retry={"max_attempts": 3})
        results = await asyncio.gather(*(policy.call(dep) for _ in range(10)),
                                       return_exceptions=True)
        return results, dep, await policy.breaker.metrics()

    results, dep, metrics = asyncio.run(scenario())
    assert sum(r == "ok" for r in results) == 3
    assert sum(isinstance(r, BulkheadFull) for r in results) == 7
    assert dep.calls == 3 and dep.peak == 3
    assert metrics.state is State.CLOSED and metrics.failed == 0


def test_http_classification_budget_and_fallback(name: str, redis_url: str) -> None:
    async def scenario() -> dict[str, Any]:
        found: dict[str, Any] = {}
        budgeted = Policy(name, redis=redis_url,
                          breaker={"failure_rate_threshold": 100,
                                   "minimum_number_of_calls": 10**6},
                          retry={"max_attempts": 3, **NO_SLEEP},
                          budget={"percent_can_retry": 0.2, "min_retries_per_sec": 0},
                          sleep=no_sleep)
        storm = AsyncDependency(Response(503))
        for _ in range(50):
            with pytest.raises(HttpStatusError):
                await budgeted.call(storm)
        found["storm_calls"] = storm.calls

        hard = Policy(name + "-429", redis=redis_url)
        stop = AsyncDependency(Response(429))
        with pytest.raises(HttpStatusError):
            await hard.call(stop)
        found["429_state"] = await hard.breaker.get_state()

        client = Policy(name + "-400", redis=redis_url, retry={"max_attempts": 3},
                        fallback=lambda error: "queued")
        bad = AsyncDependency(HttpStatusError(400))
        with pytest.raises(HttpStatusError):
            await client.call(bad)
        found["400_calls"] = bad.calls
        found["400_counted"] = (await client.breaker.metrics()).calls

        async def fallback(error: BaseException) -> str:
            return f"queued after {type(error).__name__}"

        down = Policy(name + "-fb", redis=redis_url, fallback=fallback)
        found["fallback"] = await down.call(AsyncDependency(ConnectionError("x")))
        return found

    found = asyncio.run(scenario())
    assert found["storm_calls"] == 60
    assert found["429_state"] is State.OPEN
    assert found["400_calls"] == 1 and found["400_counted"] == 0
    assert found["fallback"] == "queued after ConnectionError"


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
        outcomes = []
        for _ in range(20):  # the permit comes back at once, not after the lease
            try:
                outcomes.append(await policy.call(AsyncDependency("ok")))
                break
            except BulkheadFull:
                outcomes.append("full")
                await asyncio.sleep(0.05)
        metrics = await policy.breaker.metrics()
        return outcomes, (await policy.bulkhead.metrics()).in_use, metrics.calls

    outcomes, in_use, calls = asyncio.run(scenario())
    assert outcomes[-1] == "ok" and len(outcomes) <= 3
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
