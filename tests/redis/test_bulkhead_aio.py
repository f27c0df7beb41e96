"""What only the asyncio bulkhead has, against a real redis-server: the async decorator and
context manager, waiting tasks, cancellation. The shared behaviour is in test_bulkhead.py,
run with each flavour."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from distbreaker.bulkhead.aio import Bulkhead
from distbreaker.errors import BulkheadFull
from tests.helpers.waiting import await_until


async def at_once(count: int, fn: Callable[[], Awaitable[Any]]) -> list[Any]:
    return list(await asyncio.gather(*(fn() for _ in range(count)), return_exceptions=True))


def test_decorator_and_async_with(name: str, redis_url: str) -> None:
    async def main() -> None:
        bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=1)

        @bulkhead
        async def double(x: int) -> int:
            return 2 * x

        assert await double(21) == 42
        async with bulkhead as permit:
            assert (await bulkhead.metrics()).in_use == 1
            with pytest.raises(BulkheadFull):
                await double(1)
        assert (await bulkhead.metrics()).in_use == 0 and permit.released
        with pytest.raises(TypeError):
            bulkhead(lambda: None)  # type: ignore[arg-type]
        await bulkhead.aclose()

    asyncio.run(main())


def test_waiters_get_in_as_permits_free_up_and_give_up_after_max_wait(
        name: str, redis_url: str) -> None:
    """Two tasks wait on a full bulkhead; one permit frees up: one waiter gets in (after
    the release, not before), the other keeps waiting and gives up once its
    max_wait_duration has passed (not sooner), counted as rejected."""
    patience = 2.0

    async def main() -> None:
        holder = Bulkhead(name, redis=redis_url, max_concurrent_calls=2)
        waiter = Bulkhead(name, redis=redis_url, max_concurrent_calls=2,
                          max_wait_duration=patience)
        held = [await holder.acquire(), await holder.acquire()]
        order: list[str] = []
        gave_up = asyncio.Event()

        async def wait_for_a_permit() -> str:
            try:
                permit = await waiter.acquire()
            except BulkheadFull:
                order.append("gave up")
                gave_up.set()
                raise
            order.append("got in")
            await gave_up.wait()                # hold it past the other waiter's patience
            await waiter.release(permit)
            return "got in"

        async def both_wait() -> bool:
            return (await holder.metrics()).waiting == 2

        async def release_one_when_both_wait() -> None:
            await await_until(both_wait, what="both tasks wait")
            order.append("released")
            await holder.release(held[0])

        results = await asyncio.gather(wait_for_a_permit(), wait_for_a_permit(),
                                       release_one_when_both_wait(), return_exceptions=True)
        refused = [r for r in results[:2] if isinstance(r, BulkheadFull)]
        assert "got in" in results[:2] and len(refused) == 1 and results[2] is None
        assert order == ["released", "got in", "gave up"]
        # it waited its whole patience (generous upper bound: a loaded machine is slow)
        assert patience <= refused[0].waited < patience + 10
        metrics = await holder.metrics()
        assert (metrics.in_use, metrics.waiting, metrics.rejected) == (1, 0, 1)
        await holder.release(held[1])
        await holder.aclose()
        await waiter.aclose()

    asyncio.run(main())


def test_cancelled_waiter_leaves_no_trace(name: str, redis_url: str) -> None:
    async def main() -> None:
        holder = Bulkhead(name, redis=redis_url, max_concurrent_calls=1)
        waiter = Bulkhead(name, redis=redis_url, max_concurrent_calls=1, max_wait_duration=5)
        permit = await holder.acquire()
        task = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(0.2)
        # Cancel until it ends: on Python < 3.12 a cancellation racing an inner wait_for
        # (redis-py's) can be lost once (CPython gh-86296), which a loaded machine makes
        # likely; the behaviour under test is what a cancel leaves behind.
        while not task.done():
            task.cancel()
            await asyncio.sleep(0.05)
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)               # the shielded cancel runs
        metrics = await holder.metrics()
        assert (metrics.in_use, metrics.waiting) == (1, 0)
        await holder.release(permit)
        await holder.aclose()
        await waiter.aclose()

    asyncio.run(main())


def test_release_cancelled_while_a_renewal_finishes_is_not_swallowed(
        name: str, redis_url: str) -> None:
    """A release waits for a renewal already in flight; a cancellation arriving then
    propagates (it used to be swallowed) and the permit is still given back."""
    async def scenario() -> tuple[bool, int]:
        bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=1)
        permit = await bulkhead.acquire()
        bulkhead._renewals.pop(permit).cancel()

        async def renewal_in_flight() -> None:  # finishes its round trip when cancelled
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                await asyncio.sleep(0.2)
                raise

        bulkhead._renewals[permit] = asyncio.create_task(renewal_in_flight())
        await asyncio.sleep(0)
        releasing = asyncio.create_task(bulkhead.release(permit))
        await asyncio.sleep(0.05)  # the release now waits for the renewal
        releasing.cancel()
        try:
            await releasing
            cancelled = False
        except asyncio.CancelledError:
            cancelled = True
        for _ in range(50):
            if (await bulkhead.metrics()).in_use == 0:
                break
            await asyncio.sleep(0.02)
        return cancelled, (await bulkhead.metrics()).in_use

    cancelled, in_use = asyncio.run(scenario())
    assert cancelled
    assert in_use == 0
