"""The synchronous registry: named breakers, bulkheads, budgets, retries and policies."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._runtime.connection import sync_client
from ..breaker.sync import CircuitBreaker
from ..budget.sync import RetryBudget
from ..bulkhead.sync import Bulkhead
from ..policy.sync import Policy
from ..retry.sync import Retry
from .config import RegistryConfigError, RegistrySpec, load_file
from .core import Classes, RegistryCore
from .health import RegistryHealth, run_sync

CLASSES = Classes(breaker=CircuitBreaker, bulkhead=Bulkhead, budget=RetryBudget, retry=Retry,
                  policy=Policy)


def client_for(spec: RegistrySpec, redis: Any, make: Any) -> Any:
    """The registry's one client: `redis` if given, else from the config's `redis` URL."""
    target = redis if redis is not None else spec.redis
    if target is not None and not isinstance(target, str) and redis is None:
        raise RegistryConfigError(spec.source, "redis", None,
                                  f"must be a URL string, got {target!r}")
    try:
        return make(target, spec.redis_timeout)
    except (TypeError, ValueError) as error:
        raise RegistryConfigError(spec.source, "redis", None, str(error)) from None


class Registry(RegistryCore[CircuitBreaker, Bulkhead, RetryBudget, Retry, Policy]):
    """One breaker, bulkhead, retry budget, Retry and Policy per name, for this process.

    Built from a mapping (`from_dict`) or a YAML / TOML / JSON file (`from_file`),
    see `distbreaker.registry.config` for the shape; `redis` (a URL or a client)
    overrides the configuration's. Every component shares the registry's one
    Redis client. ``registry.breaker("payments")`` returns the same object on
    every call; ``registry.breaker("llm", key=tenant)`` the tenant's own breaker
    (named ``llm:<tenant>``) with the config of ``llm``.
    """

    def __init__(self, config: Mapping[str, Any] | RegistrySpec | None = None, *,
                 redis: Any = None, environ: Mapping[str, str] | None = None,
                 source: str = "<dict>") -> None:
        spec = config if isinstance(config, RegistrySpec) else RegistrySpec(
            config or {}, source=source, environ=environ)
        #: What the client was built from (a URL, or the client given).
        self.redis = redis if redis is not None else spec.redis
        self._owns_client = redis is None or isinstance(redis, str)
        super().__init__(spec, client_for(spec, redis, sync_client), CLASSES)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, redis: Any = None,
                  environ: Mapping[str, str] | None = None) -> Registry:
        """A registry from a mapping (environment overrides from `environ`, default
        ``os.environ``)."""
        return cls(data, redis=redis, environ=environ)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, redis: Any = None,
                  environ: Mapping[str, str] | None = None) -> Registry:
        """A registry from a ``.yaml`` / ``.yml`` (needs PyYAML), ``.toml`` or ``.json`` file."""
        return cls(load_file(path), redis=redis, environ=environ, source=str(path))

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
