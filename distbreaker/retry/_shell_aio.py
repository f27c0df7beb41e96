"""What the sync and asyncio Retry share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; the front ends add
only their docstrings (and the asyncio check that its budget is awaitable).
"""

from __future__ import annotations

import asyncio
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
    """Execute the steps of a retry flow (`retry.core.retry_flow`); it decides everything.

    Withdraw and Sleep run while the failed attempt's error is being handled, so
    a bare ``raise`` re-raises it, traceback and all, when the flow gives up.
    """
    step = advance(flow, None)
    while isinstance(step, Deposit):
        await budget.deposit()
        step = advance(flow, None)
    while True:
        try:
            return await attempt(step.attempt)  # type: ignore[union-attr]
        except BaseException as error:  # asyncio's CancelledError too: never retried
            step = advance(flow, error)
            while isinstance(step, (Withdraw, Sleep)):
                if isinstance(step, Withdraw):
                    step = advance(flow, await budget.try_withdraw())
                else:
                    await sleep(step.seconds)
                    step = advance(flow, None)
            if not isinstance(step, Run):
                raise


class RetryShell(RetryBase):
    """A Retry's calls: the retry flow of `retry.core` run around the protected call."""

    def __init__(self, config: RetryConfig | None = None, *, budget: Any = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] | None = None, rng: random.Random | None = None,
                 **overrides: Any) -> None:
        self._check_budget(budget)
        super().__init__(config, budget, sleep, clock, rng, overrides)

    def _check_budget(self, budget: Any) -> None:
        """Refuse a budget of the other flavour (the asyncio Retry awaits its budget)."""

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)`, retrying transient failures."""
        return await run_flow(self._flow(), lambda attempt: fn(*args, **kwargs), self.budget,
                              self._sleep)

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "Retry")
