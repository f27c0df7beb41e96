"""The fleet-wide retry budget (Finagle's RetryBudget), sync front end: I/O only.

`deposit()` once per logical request, `try_withdraw()` once per retry; the arithmetic
runs in ``lua/budget.lua`` on server time, every other decision in `budget.core`.
The methods are in `_shell_sync.py`, generated from `_shell_aio.py` by scripts/unasync.py.
"""

from __future__ import annotations

from ._shell_sync import BudgetShell


class RetryBudget(BudgetShell):
    """One retry budget per dependency, shared by every process using the same Redis.

    Over the last `ttl` seconds the fleet may retry
    ``floor(min_retries_per_sec * ttl + percent_can_retry * requests) - retries``
    more times. While Redis is unreachable a per-process budget with the same formula
    and window answers (see `BudgetCore`); Redis errors never escape `deposit()` or
    `try_withdraw()`. Foreign data in the key raises `SchemaError`.
    """
