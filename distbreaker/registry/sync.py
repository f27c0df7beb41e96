"""The synchronous registry: named breakers, bulkheads, budgets, retries and policies."""

from __future__ import annotations

from typing import Any

from .._runtime.connection import sync_client
from ..breaker.sync import CircuitBreaker
from ..budget.sync import RetryBudget
from ..bulkhead.sync import Bulkhead
from ..policy.sync import Policy
from ..retry.sync import Retry
from .core import Classes, RegistryCore
from .health import RegistryHealth, run_sync

CLASSES = Classes(breaker=CircuitBreaker, bulkhead=Bulkhead, budget=RetryBudget, retry=Retry,
                  policy=Policy)


class Registry(RegistryCore[CircuitBreaker, Bulkhead, RetryBudget, Retry, Policy]):
    """One breaker, bulkhead, retry budget, Retry and Policy per name, for this process.

    Built from a mapping (`from_dict`) or a YAML / TOML / JSON file (`from_file`),
    see `distbreaker.registry.config` for the shape; `redis` (a URL or a client)
    overrides the configuration's. Every component shares the registry's one
    Redis client. ``registry.breaker("payments")`` returns the same object on
    every call; ``registry.breaker("llm", key=tenant)`` the tenant's own breaker
    (named ``llm:<tenant>``) with the config of ``llm``.
    """

    CLASSES = CLASSES
    make_client = staticmethod(sync_client)

    def health(self) -> RegistryHealth:
        """Every unkeyed component's health (one read each) and whether Redis answers."""
        try:
            self._client.ping()
            reachable = True
        except Exception:
            reachable = False
        seen: dict[int, Any] = {}
        return RegistryHealth(reachable, tuple(
            run_sync(probe, seen, key) for key, probe in self.health_plans()))

    def close(self) -> None:
        """Close the Redis client if the registry built it from a URL."""
        if self._owns_client:
            self._client.close()

    def __repr__(self) -> str:
        return f"Registry({self.source!r})"
