"""The asyncio Retry: runs the retry flow of `retry.core`, awaiting calls, budget and sleeps."""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .._runtime.decorate import decorate_async
from .config import RetryConfig
from .core import Deposit, RetryBase, RetryFlow, Run, Sleep, Withdraw, advance

P = ParamSpec("P")
T = TypeVar("T")


async def run_flow(flow: RetryFlow, attempt: Callable[[int], Awaitable[T]], budget: Any,
                   sleep: Callable[[float], Awaitable[Any]]) -> T:
    """The asyncio twin of `retry.sync.run_flow`: the same steps, awaited."""
    step = advance(flow, None)
    while isinstance(step, Deposit):
        await budget.deposit()
        step = advance(flow, None)
    while True:
        try:
            return await attempt(step.attempt)  # type: ignore[union-attr]
        except BaseException as error:  # CancelledError too: the flow never retries it
            step = advance(flow, error)
            while isinstance(step, (Withdraw, Sleep)):
                if isinstance(step, Withdraw):
                    step = advance(flow, await budget.try_withdraw())
                else:
                    await sleep(step.seconds)
                    step = advance(flow, None)
            if not isinstance(step, Run):
                raise


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

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)`, retrying transient failures."""
        return await run_flow(self._flow(), lambda attempt: fn(*args, **kwargs), self.budget,
                              self._sleep)

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "Retry")
