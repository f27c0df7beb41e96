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
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .._runtime.connection import async_client
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed, PendingCall, run_scripts_each_async
from ..breaker.aio import CircuitBreaker
from ..breaker.classify import HttpClassifier, Outcome, status_of
from ..budget.aio import RetryBudget
from ..bulkhead.aio import Bulkhead
from ..retry.aio import Retry
from ..retry.core import RetryCore
from .core import Fallback, PolicyCore, build_component, build_retry, group_ready, settle

T = TypeVar("T")
logger = logging.getLogger("distbreaker")


class Policy(PolicyCore):
    """The asyncio twin of `distbreaker.Policy` (awaited `call`, coroutine decorator)."""

    def __init__(self, name: str, redis: Any = None, *, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 fallback: Fallback | None = None, fallback_on_client_error: bool = False,
                 http_classifier: HttpClassifier | None = None,
                 prefix: str = DEFAULT_PREFIX,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 redis_timeout: float = 0.25) -> None:
        client = async_client(redis, redis_timeout)
        self.breaker = build_component(breaker, CircuitBreaker, name, client, prefix)
        self.bulkhead = build_component(bulkhead, Bulkhead, name, client, prefix)
        retry_obj = build_retry(retry, Retry)
        budget_obj = build_component(budget, RetryBudget, name, client, prefix)
        self._setup(name, retry_obj, budget_obj, fallback, fallback_on_client_error,
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
                for call in ready:
                    call.on_unavailable(error)
                continue
            settle(ready, results)

    async def _trip(self, error: BaseException) -> None:
        try:
            await self.breaker.trip(f"hard stop: HTTP {status_of(error)} without Retry-After")
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not trip the breaker: %s", self.name, failure)

    async def _attempt(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any,
                       deposit: bool) -> T:
        breaker, bulkhead = self.breaker, self.bulkhead
        permit = await breaker.acquire() if breaker is not None else None
        try:
            slot = await bulkhead.acquire() if bulkhead is not None else None
        except BaseException as refused:  # BulkheadFull, or no answer: hand the probe back
            if breaker is not None:
                await breaker.record(permit, refused, 0.0, Outcome.IGNORED)
            raise
        started = time.monotonic()
        error: BaseException | None
        try:
            result = await fn(*args, **kwargs)
        except BaseException as raised:
            error, result = raised, None
        else:
            error = self.response_error(result)
        duration = time.monotonic() - started
        owed: list[Owed | None] = []
        if deposit and self.budget is not None:  # once per logical request that ran
            owed.append(self.budget.owed_deposit())
        if slot is not None:
            owed.append(await bulkhead.owed_release(slot))
        if breaker is not None:
            owed.append(breaker.owed_record(permit, error, duration,
                                            self.breaker_outcome(error, result)))
        await self._flush(owed)
        if error is not None:
            if breaker is not None and self.is_hard_stop(error):
                await self._trip(error)
            raise error
        return result  # type: ignore[return-value]

    async def _with_retry(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any) -> T:
        budget = self.budget
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._attempt(fn, args, kwargs, deposit=attempt == 1)
            except Exception as error:
                decision = self.decide(error, attempt, started)
                if not decision.retry:
                    raise
                if budget is not None and not await budget.try_withdraw():
                    RetryCore.mark_exhausted(error, budget.name)
                    raise
                await self._sleep(decision.delay)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await `fn(*args, **kwargs)` under the whole policy."""
        try:
            return await self._with_retry(fn, args, kwargs)
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
