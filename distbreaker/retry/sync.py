"""The synchronous Retry: runs the retry flow of `retry.core`, sleeping with time.sleep."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from .._runtime.decorate import decorate_sync
from .config import RetryConfig
from .core import Deposit, RetryBase, RetryFlow, Run, Sleep, Withdraw, advance

P = ParamSpec("P")
T = TypeVar("T")


def run_flow(flow: RetryFlow, attempt: Callable[[int], T], budget: Any,
             sleep: Callable[[float], Any]) -> T:
    """Execute the steps of a retry flow (`retry.core.retry_flow`); it decides everything.

    Withdraw and Sleep run while the failed attempt's error is being handled, so
    a bare ``raise`` re-raises it, traceback and all, when the flow gives up.
    """
    step = advance(flow, None)
    while isinstance(step, Deposit):
        budget.deposit()
        step = advance(flow, None)
    while True:
        try:
            return attempt(step.attempt)  # type: ignore[union-attr]
        except BaseException as error:
            step = advance(flow, error)
            while isinstance(step, (Withdraw, Sleep)):
                if isinstance(step, Withdraw):
                    step = advance(flow, budget.try_withdraw())
                else:
                    sleep(step.seconds)
                    step = advance(flow, None)
            if not isinstance(step, Run):
                raise


class Retry(RetryBase):
    """Retry a sync callable: ``@Retry(max_attempts=3)`` or ``retry.call(fn, *args)``.

    With `budget` (a `distbreaker.RetryBudget`) every logical call deposits
    once and every retry withdraws once; an exhausted budget makes the failure
    final (the original error is raised, see the module docstring). `sleep`,
    `clock` and `rng` are injectable for tests.
    """

    def __init__(self, config: RetryConfig | None = None, *, budget: Any = None,
                 sleep: Callable[[float], Any] = time.sleep,
                 clock: Callable[[], float] | None = None, rng: random.Random | None = None,
                 **overrides: Any) -> None:
        super().__init__(config, budget, sleep, clock, rng, overrides)

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)`, retrying transient failures."""
        return run_flow(self._flow(), lambda attempt: fn(*args, **kwargs), self.budget,
                        self._sleep)

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        return decorate_sync(self.call, fn, "Retry")
