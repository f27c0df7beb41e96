"""What only the asyncio breaker has, against a real redis-server: the async decorator and
context manager, tasks, cancellation, several event loops, an asyncio client. The behaviour
both flavours share is in test_breaker.py and test_seed_scenario.py, run with each."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio

from distbreaker import CircuitBreaker as SyncBreaker
from distbreaker.aio import CircuitBreaker
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted
from tests.helpers.dependency import SEED, AsyncDependency, outcome_async

T = TypeVar("T")


def run(fn: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(fn())  # type: ignore[arg-type]


def failing_dependency(delay: float = 0.0) -> AsyncDependency:
    """An async dependency that fails until `healthy`, counting the calls that reach it."""
    return AsyncDependency(delay=delay, healthy=False)


async def outcome(breaker: CircuitBreaker, dep: Callable[[], Awaitable[Any]]) -> str:
    return await outcome_async(lambda: breaker.call(dep))


def test_decorator_and_async_context_manager(name: str, redis_url: str) -> None:
    async def scenario() -> None:
        breaker = CircuitBreaker(name, redis=redis_url, minimum_number_of_calls=4,
                                 sliding_window_size=10)

        @breaker
        async def fetch(value: int, *, fail: bool = False) -> int:
            if fail:
                raise ConnectionError("down")
            return value * 2

        assert fetch.__name__ == "fetch"
        assert await fetch(21) == 42
        with pytest.raises(ConnectionError):
            await fetch(1, fail=True)
        async with breaker as entered:
            assert entered is breaker
        with pytest.raises(ConnectionError):
            async with breaker:
                raise ConnectionError("down")
        metrics = await breaker.metrics()
        assert (metrics.calls, metrics.failed, metrics.failure_rate) == (4, 2, 50.0)

        with pytest.raises(TypeError, match="coroutine functions"):
            breaker(lambda: None)
        with pytest.raises(AttributeError, match="get_state"):
            _ = breaker.state
        await breaker.aclose()

    run(scenario)


def test_async_with_blocks_of_interleaved_tasks_keep_their_own_permit(
        name: str, redis_url: str) -> None:
    """Task A enters first and leaves first: a shared (thread-local) stack would swap
    the two start times and report B as slow (0.55 s); each really took 0.35 s."""
    async def scenario() -> None:
        breaker = CircuitBreaker(name, redis=redis_url, slow_call_duration=0.45)

        async def block(delay_before: float, inside: float) -> None:
            await asyncio.sleep(delay_before)
            async with breaker:
                await asyncio.sleep(inside)

        await asyncio.gather(block(0.0, 0.35), block(0.2, 0.35))
        metrics = await breaker.metrics()
        assert (metrics.calls, metrics.slow) == (2, 0)
        await breaker.aclose()

    run(scenario)


def test_ignored_exceptions_count_nowhere_and_return_the_probe(name: str,
                                                                redis_url: str) -> None:
    async def scenario() -> None:
        breaker = CircuitBreaker(name, redis=redis_url, ignore_exceptions=(KeyError,),
                                 minimum_number_of_calls=2, wait_duration_in_open_state=0.2,
                                 permitted_calls_in_half_open=1)

        @breaker
        async def lookup() -> None:
            raise KeyError("missing")

        for _ in range(5):
            with pytest.raises(KeyError):
                await lookup()
            with pytest.raises(KeyError):
                async with breaker:
                    raise KeyError("missing")
        metrics = await breaker.metrics()
        assert (metrics.state, metrics.calls, metrics.failed) == (State.CLOSED, 0, 0)

        await breaker.trip()
        await asyncio.sleep(0.25)
        with pytest.raises(KeyError):  # the only probe is ignored: it must be handed back
            await lookup()
        metrics = await breaker.metrics()
        assert (metrics.state, metrics.calls, metrics.probes_in_flight) == (State.HALF_OPEN, 0, 0)
        async with breaker:  # so a second probe is admitted, and closes the breaker
            pass
        assert await breaker.get_state() is State.CLOSED
        await breaker.aclose()

    run(scenario)


def test_cancelled_calls_count_nowhere_and_return_the_probe(name: str, redis_url: str) -> None:
    async def scenario() -> None:
        breaker = CircuitBreaker(name, redis=redis_url, minimum_number_of_calls=2,
                                 wait_duration_in_open_state=0.2, permitted_calls_in_half_open=1)
        dep = failing_dependency(delay=10)
        for _ in range(3):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(breaker.call(dep), 0.05)
        metrics = await breaker.metrics()
        assert (metrics.state, metrics.calls, metrics.failed) == (State.CLOSED, 0, 0)

        await breaker.trip()
        await asyncio.sleep(0.25)
        dep.entered.clear()
        probe = asyncio.create_task(breaker.call(dep))
        await dep.entered.wait()
        assert (await breaker.metrics()).probes_in_flight == 1
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        metrics = await breaker.metrics()
        assert (metrics.state, metrics.calls, metrics.probes_in_flight) == (State.HALF_OPEN, 0, 0)
        dep.delay, dep.healthy = 0, True
        assert await breaker.call(dep) == "ok"  # permitted 1: only possible if handed back
        assert await breaker.get_state() is State.CLOSED
        await breaker.aclose()

    run(scenario)


class SlowAcquireReplies:
    """A client whose acquire replies arrive late: Redis has already granted the probe."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self.delay = 0.0

    async def _late(self, reply: Any, args: tuple[Any, ...]) -> Any:
        if "acquire" in args:
            await asyncio.sleep(self.delay)
        return reply

    async def execute_command(self, *args: Any) -> Any:  # FCALL (the Function form)
        return await self._late(await self.client.execute_command(*args), args)

    async def function_load(self, code: str) -> Any:
        return await self.client.function_load(code)

    async def evalsha(self, *args: Any) -> Any:              # the EVAL form
        return await self._late(await self.client.evalsha(*args), args)

    async def eval(self, *args: Any) -> Any:
        return await self.client.eval(*args)


def test_cancelled_while_acquiring_hands_the_granted_probe_back(name: str,
                                                                 redis_url: str) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        slow = SlowAcquireReplies(client)
        breaker = CircuitBreaker(name, redis=slow, wait_duration_in_open_state=0.2,
                                 permitted_calls_in_half_open=1)
        await breaker.trip()
        await asyncio.sleep(0.25)
        dep = failing_dependency()
        dep.healthy = True
        slow.delay = 10
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(breaker.call(dep), 0.1)
        slow.delay = 0
        metrics = await breaker.metrics()
        assert (metrics.state, metrics.probes_in_flight, dep.calls) == (State.HALF_OPEN, 0, 0)
        assert await breaker.call(dep) == "ok"  # permitted 1: only possible if handed back
        assert await breaker.get_state() is State.CLOSED
        await client.aclose()

    run(scenario)


def test_twenty_concurrent_tasks_in_half_open_let_exactly_two_probes_through(
        name: str, redis_url: str) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        breaker = CircuitBreaker(name, redis=client, **{**SEED, "wait_duration_in_open_state":
                                                        0.2})
        observer = CircuitBreaker(name, redis=client, **{**SEED, "wait_duration_in_open_state":
                                                         0.2})
        events: list[Transition] = []
        breaker.add_listener(events.append)
        observer.add_listener(events.append)
        await breaker.trip()
        events.clear()
        await asyncio.sleep(0.25)
        dep = failing_dependency(delay=0.1)
        dep.healthy = True
        outcomes = await asyncio.gather(*(outcome(breaker, dep) for _ in range(20)))
        assert dep.calls == 2
        assert sorted(outcomes) == ["ok"] * 2 + ["rejected"] * 18
        assert await observer.get_state() is State.CLOSED
        assert [(e.from_state, e.to_state) for e in events] == [
            (State.OPEN, State.HALF_OPEN), (State.HALF_OPEN, State.CLOSED)]
        await client.aclose()

    run(scenario)


def test_many_concurrent_calls_are_not_mistaken_for_a_redis_outage(
        name: str, redis_url: str) -> None:
    """More calls in flight than redis.asyncio's default 100 connections queue for one;
    they must not be taken for Redis being unreachable (rejected under fail_closed).
    (redis_timeout is generous so a CPU-starved test machine is not what is measured.)"""
    async def scenario() -> None:
        breaker = CircuitBreaker(name, redis=redis_url, on_redis_error="fail_closed",
                                 redis_timeout=10.0, sliding_window_size=1000,
                                 minimum_number_of_calls=1000)
        dep = failing_dependency(delay=0.01)
        dep.healthy = True
        outcomes = await asyncio.gather(*(outcome(breaker, dep) for _ in range(150)))
        assert outcomes == ["ok"] * 150
        assert breaker._health.last_error is None
        assert (await breaker.metrics()).calls == 150
        await breaker.aclose()

    run(scenario)


def test_shares_state_with_the_sync_breaker_and_operator_actions(
        name: str, redis_url: str) -> None:
    sync = SyncBreaker(name, redis=redis_url)
    sync.trip()

    async def scenario() -> None:
        breaker = CircuitBreaker(name, redis=redis_url)
        dep = failing_dependency()
        assert await breaker.get_state() is State.OPEN
        assert await outcome(breaker, dep) == "rejected"
        assert await breaker.transition_to_forced_open() is State.FORCED_OPEN
        with pytest.raises(CallNotPermitted) as caught:
            await breaker.call(dep)
        assert caught.value.state is State.FORCED_OPEN
        assert await breaker.transition_to_disabled() is State.DISABLED
        assert await outcome(breaker, dep) == "failed"
        assert await breaker.transition_to_metrics_only() is State.METRICS_ONLY
        assert await breaker.transition_to_closed() is State.CLOSED
        assert await breaker.reset() is State.CLOSED
        assert dep.calls == 1
        await breaker.aclose()

    run(scenario)
    assert sync.state is State.CLOSED


def test_one_breaker_serves_several_event_loops(name: str, redis_url: str) -> None:
    """A breaker made at import time (a decorator) outlives each test's asyncio.run.
    (A generous redis_timeout: each new loop connects afresh, and a first connection
    slower than the default 0.25 s would send the call to the local fallback.)"""
    breaker = CircuitBreaker(name, redis=redis_url, redis_timeout=5.0)

    @breaker
    async def ping() -> str:
        return "pong"

    async def scenario() -> tuple[str, int]:
        result = await ping(), (await breaker.metrics()).calls
        await breaker.aclose()
        return result

    assert run(scenario) == ("pong", 1)
    assert run(scenario) == ("pong", 2)


def test_redis_argument_must_be_async() -> None:
    with pytest.raises(TypeError, match="asyncio"):
        CircuitBreaker("x", redis=redis.Redis())


class SchemaErrorOnRecord(SlowAcquireReplies):
    """Acquire replies arrive late; every record meets foreign data (a SchemaError)."""

    @staticmethod
    def _refuse(args: tuple[Any, ...]) -> None:
        if "record" in args:
            raise redis.exceptions.ResponseError(
                "DISTBREAKER_SCHEMA some:key has an unknown state code")

    async def execute_command(self, *args: Any) -> Any:
        self._refuse(args)
        return await super().execute_command(*args)

    async def evalsha(self, *args: Any) -> Any:
        self._refuse(args)
        return await super().evalsha(*args)


def test_a_failing_hand_back_never_replaces_the_cancellation(name: str, redis_url: str) -> None:
    """Cancelled while acquiring or mid-probe, the call hands its probe back; if that
    record fails the cancellation must still propagate (asyncio.wait_for / timeout and
    TaskGroup rely on it), not the record's error."""
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        slow = SchemaErrorOnRecord(client)
        breaker = CircuitBreaker(name, redis=slow, wait_duration_in_open_state=0.05,
                                 permitted_calls_in_half_open=2)
        await breaker.trip()
        await asyncio.sleep(0.06)
        slow.delay = 10
        with pytest.raises(asyncio.TimeoutError):  # cancelled while acquiring
            await asyncio.wait_for(breaker.call(failing_dependency()), 0.1)
        slow.delay = 0
        dep = failing_dependency(delay=10)
        probe = asyncio.create_task(breaker.call(dep))
        await asyncio.wait_for(dep.entered.wait(), 30)
        probe.cancel()                             # cancelled mid-probe
        with pytest.raises(asyncio.CancelledError):
            await probe
        assert dep.calls == 1
        await client.aclose()

    run(scenario)
