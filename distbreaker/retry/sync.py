"""The synchronous Retry: runs the retry flow of `retry.core`, sleeping with time.sleep."""

from __future__ import annotations

import functools
import inspect
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .config import RetryConfig
from .core import RetryBase

T = TypeVar("T")


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

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)`, retrying transient failures."""
        started = self._clock()
        if self.budget is not None:
            self.budget.deposit()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn(*args, **kwargs)
            except Exception as error:
                decision = self._decide(error, attempt, started)
                if not decision.retry:
                    raise
                if self.budget is not None and not self.budget.try_withdraw():
                    self._core.mark_exhausted(error, self.budget.name)
                    raise
                self._sleep(decision.delay)

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError("use distbreaker.aio.Retry to decorate a coroutine function")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper
