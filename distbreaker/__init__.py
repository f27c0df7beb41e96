"""distbreaker: one circuit breaker per dependency for a whole fleet, kept in Redis."""

from ._facade import *  # noqa: F403  (the names shared with distbreaker.aio)
from ._facade import __all__ as _shared
from .breaker.sync import CircuitBreaker
from .budget.sync import RetryBudget
from .bulkhead.sync import Bulkhead
from .ganesha.sync import GaneshaBreaker
from .policy.sync import Policy
from .ratelimiter.sync import RateLimiter
from .registry import ComponentHealth, Registry, RegistryConfigError, RegistryHealth, health
from .retry.sync import Retry

__all__ = [*_shared, "Bulkhead", "CircuitBreaker", "ComponentHealth", "GaneshaBreaker",
           "Policy", "RateLimiter", "Registry", "RegistryConfigError", "RegistryHealth", "Retry",
           "RetryBudget", "health"]
__version__ = "0.1.0"
