"""The asyncio Retry: runs the retry flow of `retry.core`, awaiting calls, budget and sleeps.

`run_flow` and the methods are in `_shell_aio.py` (the source scripts/unasync.py writes
the sync copy from).
"""

from __future__ import annotations

import inspect
from typing import Any

from ._shell_aio import RetryShell, run_flow

__all__ = ["Retry", "run_flow"]


class Retry(RetryShell):
    """Retry a coroutine function: ``@Retry(max_attempts=3)`` or ``await retry.call(fn)``.

    Same semantics as `distbreaker.Retry`; `budget` must be a
    `distbreaker.aio.RetryBudget`. Cancellation is never retried.
    """

    def _check_budget(self, budget: Any) -> None:
        if budget is not None and not inspect.iscoroutinefunction(budget.try_withdraw):
            raise TypeError("use distbreaker.aio.RetryBudget with distbreaker.aio.Retry")
