"""The composed policy for asyncio (see distbreaker.policy for the semantics).

Built from a URL, the components share one ``redis.asyncio`` client, which
binds to the event loop that first uses it: give your own components to a
policy that must serve several loops.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .._runtime.connection import async_client
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed, PendingCall, run_scripts_each_async
from ..breaker.aio import CircuitBreaker
from ..breaker.classify import HttpClassifier, Outcome
from ..budget.aio import RetryBudget
from ..bulkhead.aio import Bulkhead
from ..retry.aio import Retry, run_flow
from .core import Fallback, PolicyCore, Ran, group_ready, settle, unreachable

T = TypeVar("T")
logger = logging.getLogger("distbreaker")


class Policy(PolicyCore):
    """The asyncio twin of `distbreaker.Policy` (awaited `call`, coroutine decorator)."""

    _kinds = (CircuitBreaker, Bulkhead, Retry, RetryBudget)

    def __init__(self, name: str, redis: Any = None, *, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 fallback: Fallback | None = None, fallback_on_client_error: bool = False,
                 http_classifier: HttpClassifier | None = None,
                 prefix: str = DEFAULT_PREFIX,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 redis_timeout: float = 0.25) -> None:
        self._setup(name, async_client(redis, redis_timeout), prefix,
                    (breaker, bulkhead, retry, budget), fallback, fallback_on_client_error,
                    http_classifier)
        self._sleep = sleep
        self._background: set[asyncio.Future[None]] = set()

    async def _flush(self, owed: Sequence[Owed | None]) -> None:
        """Send owed calls, shielded: a cancellation (e.g. a timeout around the call)
        that lands here still releases the bulkhead permit, hands back a half-open
        probe and records the outcome, in the background, then is raised."""
        groups = group_ready(owed)
        if not groups:
            return
        task = asyncio.ensure_future(self._send(groups))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            raise

    async def _send(self, groups: Sequence[tuple[Any, list[PendingCall]]]) -> None:
        """One pipeline per Redis client (one in all when shared)."""
        for client, ready in groups:
            try:
                results = await run_scripts_each_async(client, [call.spec for call in ready])
            except UNAVAILABLE_ERRORS as error:
                unreachable(ready, error)
            else:
                settle(ready, results)

    async def _trip(self, reason: str) -> None:
        try:
            await self.breaker.trip(reason)
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not trip the breaker: %s", self.name, failure)

    async def _attempt(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any,
                       attempt: int) -> T:
        breaker, bulkhead = self.breaker, self.bulkhead
        permit = await breaker.acquire() if breaker is not None else None
        try:
            slot = await bulkhead.acquire() if bulkhead is not None else None
        except BaseException as refused:  # BulkheadFull, or no answer: hand the probe back
            if breaker is not None:
                await breaker.record(permit, refused, 0.0, Outcome.IGNORED)
            raise
        refusal = self.lease_refusal(permit, slot)
        if refusal is not None:  # paused since acquiring: hand both back, do not call
            release = await bulkhead.owed_release(slot) if slot is not None else None
            record = None if breaker is None else breaker.owed_record(
                permit, refusal, 0.0, Outcome.IGNORED)
            await self._flush([release, record])
            raise refusal
        ran = Ran()
        try:
            ran.ended(await fn(*args, **kwargs), None)
        except BaseException as error:
            ran.ended(None, error)
        release = await bulkhead.owed_release(slot) if slot is not None else None
        await self._flush(self.owed_after(ran, attempt, permit, release))
        reason = self.trip_reason(ran)
        if reason is not None:
            await self._trip(reason)
        return ran.unwrap()  # type: ignore[no-any-return]

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await `fn(*args, **kwargs)` under the whole policy."""
        try:
            return await run_flow(self._flow(), functools.partial(self._attempt, fn, args, kwargs),
                                  self.budget, self._sleep)
        except Exception as error:
            if self.uses_fallback(error):
                result = self.fallback(error)  # type: ignore[misc]
                return await result if asyncio.iscoroutine(result) else result
            raise

    def __call__(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("distbreaker.aio.Policy decorates coroutine functions; "
                            "use distbreaker.Policy for plain functions")

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            return await self.call(fn, *args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"
