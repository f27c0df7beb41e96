"""What the sync and asyncio retry budgets share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; the front ends add
only their docstrings. The local fallback is an in-memory fakeredis: it runs
inline, nothing to await.
"""

from __future__ import annotations

from typing import Any

from .._runtime.connection import LoopClients
from .._runtime.health import redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.preflight import preflight_async
from .._runtime.scripts import send_async
from .config import BudgetConfig
from .core import BudgetCore, BudgetReply


class BudgetShell(BudgetCore):
    """The retry budget's methods around its I/O."""

    def __init__(self, name: str, redis: Any = None, config: BudgetConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, config, prefix, overrides, redis)
        self._clients = LoopClients(redis, self.config.redis_timeout)

    @property
    def _client(self) -> Any:
        """The client (asyncio: the running event loop's; a URL's is shared)."""
        return self._clients.get()

    async def _run(self, args: list[str]) -> BudgetReply:
        return await send_async(self._client, self._pending(args))

    async def deposit(self, amount: int = 1) -> int | None:
        """Count `amount` logical requests; the balance after, or None while batched."""
        args = self.deposit_args(amount)
        return None if args is None else (await self._run(args)).balance

    async def flush(self) -> None:
        """Send the deposits batched in this process (see `deposit_batch`)."""
        args = self.flush_args()
        if args is not None:
            await self._run(args)

    async def try_withdraw(self) -> bool:
        """Take one retry from the budget; False when it is exhausted."""
        return (await self._run(self.carrying_args("withdraw"))).ok

    async def withdraw(self) -> None:
        """Take one retry from the budget or raise `RetryBudgetExhausted`."""
        self.check_withdrawal(await self._run(self.carrying_args("withdraw")))

    async def balance(self) -> int:
        """Retries the fleet may still make now (this process's budget while Redis is down)."""
        return (await self._run(self.carrying_args("balance"))).balance

    async def reset(self) -> None:
        """Forget the window in Redis (the next writer's ttl/slices become the stored ones)."""
        with redis_unavailable_as(f"retry budget {self.name!r}"):
            await self._client.delete(self.keys.slices)

    async def check(self) -> None:
        """Raise `CheckFailed` (a `RedisUnavailable` naming the cause and its fix) unless
        Redis can serve this budget: for an app that would rather fail at start-up than
        run on local fallbacks (a wrong URL, a replica, a missing ACL permission, a full
        Redis). Writes nothing; protected calls never raise it."""
        await preflight_async(self._client, f"retry budget {self.name!r}", ("budget",),
                              self.keys.slices, "")

    async def aclose(self) -> None:
        """Send the batched deposits, then close the client this budget built from a URL
        (a client given to it is yours)."""
        await self.flush()
        await self._clients.release()
