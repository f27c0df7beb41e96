"""What the sync and asyncio registries share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; the front ends add
how they build their client (the asyncio one: one per event loop).
"""

from __future__ import annotations

import logging
from typing import Any

from ..breaker.aio import CircuitBreaker
from ..budget.aio import RetryBudget
from ..bulkhead.aio import Bulkhead
from ..policy.aio import Policy
from ..pool.aio import Pool
from ..ratelimiter.aio import RateLimiter
from ..retry.aio import Retry
from .core import Classes, RegistryCore
from .health import RegistryHealth, run_async

logger = logging.getLogger("distbreaker")

CLASSES = Classes(breaker=CircuitBreaker, bulkhead=Bulkhead, budget=RetryBudget, retry=Retry,
                  policy=Policy, rate_limiter=RateLimiter, pool=Pool)


class RegistryShell(RegistryCore[CircuitBreaker, Bulkhead, RetryBudget, Retry, Policy,
                                 RateLimiter, Pool]):
    """The registry's health and close, over this flavour's components."""

    CLASSES = CLASSES

    async def health(self) -> RegistryHealth:
        """Every unkeyed component's health (one read each) and whether Redis answers."""
        try:
            await self._client.ping()
            reachable = True
        except Exception:
            reachable = False
        seen: dict[int, Any] = {}
        reports = [await run_async(probe, seen, key) for key, probe in self.health_plans()]
        return RegistryHealth(reachable, tuple(reports))

    async def check(self) -> None:
        """Build every declared component and run its `check()`: raise `CheckFailed`
        (naming the cause and its fix) unless Redis can serve them all. For an app that
        would rather fail at start-up than run on local fallbacks (the sync Registry's
        `strict=True` does this when it is built)."""
        for _, component in self.components():
            checker = getattr(component, "check", None)
            if checker is not None:
                await checker()

    async def aclose(self) -> None:
        """Close every component it built (batched outcomes sent, subscriptions ended, each
        breaker's goodbye to the config-rollout hash), then the Redis client if the
        registry built it from a URL (asyncio: the running loop's). A component that
        fails to close is logged, never raised: the others still close."""
        for component in self.built():
            closer = getattr(component, "aclose", None)
            if closer is None:
                continue
            try:
                await closer()
            except Exception:
                logger.warning("distbreaker registry: closing %r failed", component,
                               exc_info=True)
        if self._owns_client:
            await self._client.aclose()
