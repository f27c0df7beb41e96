"""Retry for asyncio: the decisions of `distbreaker.retry.RetryCore`, with awaited waits."""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .config import RetryConfig
from .core import RetryBase

T = TypeVar("T")


class Retry(RetryBase):
    """Retry a coroutine function: ``@Retry(max_attempts=3)`` or ``await retry.call(fn)``.

    Same semantics as `distbreaker.Retry`; `budget` must be a
    `distbreaker.aio.RetryBudget`. Cancellation is never retried.
    """

    def __init__(self, config: RetryConfig | None = None, *, budget: Any = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] | None = None, rng: random.Random | None = None,
                 **overrides: Any) -> None:
        if budget is not None and not inspect.iscoroutinefunction(budget.try_withdraw):
            raise TypeError("use distbreaker.aio.RetryBudget with distbreaker.aio.Retry")
        super().__init__(config, budget, sleep, clock, rng, overrides)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await `fn(*args, **kwargs)`, retrying transient failures."""
        started = self._clock()
        if self.budget is not None:
            await self.budget.deposit()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await fn(*args, **kwargs)
            except Exception as error:
                decision = self._decide(error, attempt, started)
                if not decision.retry:
                    raise
                if self.budget is not None and not await self.budget.try_withdraw():
                    self._core.mark_exhausted(error, self.budget.name)
                    raise
                await self._sleep(decision.delay)

    def __call__(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("distbreaker.aio.Retry decorates coroutine functions; "
                            "use distbreaker.Retry for plain functions")

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            return await self.call(fn, *args, **kwargs)

        return wrapper
