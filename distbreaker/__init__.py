"""distbreaker: one circuit breaker per dependency for a whole fleet, kept in Redis."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The public names are imported when first used (PEP 562), not with the package:
# `distbreaker --version` and `distbreaker ls` import `distbreaker.cli`, which imports
# this package first, and importing every component costs a large part of a second.
# Type checkers and the API docs read the real imports under TYPE_CHECKING;
# tests/unit/test_facades.py checks that both give the same objects.
_FLAVOURED = {
    "Bulkhead": (".bulkhead.sync", "Bulkhead"),
    "CircuitBreaker": (".breaker.sync", "CircuitBreaker"),
    "ComponentHealth": (".registry", "ComponentHealth"),
    "GaneshaBreaker": (".ganesha.sync", "GaneshaBreaker"),
    "Policy": (".policy.sync", "Policy"),
    "Pool": (".pool.sync", "Pool"),
    "RateLimiter": (".ratelimiter.sync", "RateLimiter"),
    "Registry": (".registry", "Registry"),
    "RegistryConfigError": (".registry", "RegistryConfigError"),
    "RegistryHealth": (".registry", "RegistryHealth"),
    "Retry": (".retry.sync", "Retry"),
    "RetryBudget": (".budget.sync", "RetryBudget"),
    "health": (".registry", "health"),
}

if TYPE_CHECKING:
    from ._facade import *  # noqa: F403  (the names shared with distbreaker.aio)
    from ._facade import __all__ as _shared
    from .breaker.sync import CircuitBreaker
    from .budget.sync import RetryBudget
    from .bulkhead.sync import Bulkhead
    from .ganesha.sync import GaneshaBreaker
    from .policy.sync import Policy
    from .pool.sync import Pool
    from .ratelimiter.sync import RateLimiter
    from .registry import ComponentHealth, Registry, RegistryConfigError, RegistryHealth, health
    from .retry.sync import Retry

    __all__ = [*_shared, "Bulkhead", "CircuitBreaker", "ComponentHealth", "GaneshaBreaker",
               "Policy", "Pool", "RateLimiter", "Registry", "RegistryConfigError",
               "RegistryHealth", "Retry", "RetryBudget", "health"]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (and `__all__`, which needs the shared names)."""
    if name == "__all__":
        value: Any = [*importlib.import_module("._facade", __name__).__all__, *_FLAVOURED]
    elif name in _FLAVOURED:
        module, attr = _FLAVOURED[name]
        value = getattr(importlib.import_module(module, __name__), attr)
    else:
        if name.startswith("_") or _is_submodule(name):  # `from . import x` asks first
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        facade = importlib.import_module("._facade", __name__)
        if name not in facade.__all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(facade, name)
    globals()[name] = value
    return value


def _is_submodule(name: str) -> bool:
    here = os.path.dirname(__file__)
    return os.path.isdir(os.path.join(here, name)) or os.path.isfile(
        os.path.join(here, name + ".py"))


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__getattr__("__all__")))
