"""The fleet-wide retry budget (Finagle's RetryBudget), sync front end: I/O only.

`deposit()` once per logical request, `try_withdraw()` once per retry; the arithmetic
runs in ``lua/budget.lua`` on server time, every other decision in `budget.core`.
"""

from __future__ import annotations

from typing import Any

from .._runtime.connection import owns_client, release_sync_client, shared_sync_client
from .._runtime.health import redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import send
from .config import BudgetConfig
from .core import BudgetCore, BudgetReply


class RetryBudget(BudgetCore):
    """One retry budget per dependency, shared by every process using the same Redis.

    Over the last `ttl` seconds the fleet may retry
    ``floor(min_retries_per_sec * ttl + percent_can_retry * requests) - retries``
    more times. While Redis is unreachable a per-process budget with the same formula
    and window answers (see `BudgetCore`); Redis errors never escape `deposit()` or
    `try_withdraw()`. Foreign data in the key raises `SchemaError`.
    """

    def __init__(self, name: str, redis: Any = None, config: BudgetConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, config, prefix, overrides)
        self._client = shared_sync_client(redis, self.config.redis_timeout)
        self._owns_client = owns_client(redis)

    def _run(self, args: list[str]) -> BudgetReply:
        return send(self._client, self._pending(args))

    def deposit(self, amount: int = 1) -> int | None:
        """Count `amount` logical requests; the balance after, or None while batched."""
        args = self.deposit_args(amount)
        return None if args is None else self._run(args).balance

    def flush(self) -> None:
        """Send the deposits batched in this process (see `deposit_batch`)."""
        args = self.flush_args()
        if args is not None:
            self._run(args)

    def try_withdraw(self) -> bool:
        """Take one retry from the budget; False when it is exhausted."""
        return self._run(self.carrying_args("withdraw")).ok

    def withdraw(self) -> None:
        """Take one retry from the budget or raise `RetryBudgetExhausted`."""
        self.check_withdrawal(self._run(self.carrying_args("withdraw")))

    def balance(self) -> int:
        """Retries the fleet may still make now (this process's budget while Redis is down)."""
        return self._run(self.carrying_args("balance")).balance

    def reset(self) -> None:
        """Forget the window in Redis (the next writer's ttl/slices become the stored ones)."""
        with redis_unavailable_as(f"retry budget {self.name!r}"):
            self._client.delete(self.keys.slices)

    def close(self) -> None:
        """Send the batched deposits, then close the client this budget built from a URL
        (a client given to it is yours)."""
        self.flush()
        if self._owns_client:
            self._owns_client = False  # let go once: the client may be shared
            release_sync_client(self._client)
