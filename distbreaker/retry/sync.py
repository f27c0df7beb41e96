"""The synchronous Retry: runs the retry flow of `retry.core`, sleeping with time.sleep.

`run_flow` and the methods are in `_shell_sync.py`, generated from `_shell_aio.py` by
scripts/unasync.py.
"""

from __future__ import annotations

from ._shell_sync import RetryShell, run_flow

__all__ = ["Retry", "run_flow"]


class Retry(RetryShell):
    """Retry a sync callable: ``@Retry(max_attempts=3)`` or ``retry.call(fn, *args)``.

    With `budget` (a `distbreaker.RetryBudget`) every logical call deposits
    once and every retry withdraws once; an exhausted budget makes the failure
    final (the original error is raised, see the module docstring). `sleep`,
    `clock` and `rng` are injectable for tests.
    """
