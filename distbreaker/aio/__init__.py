"""distbreaker for asyncio: the same fleet-wide components, with awaited Redis calls."""

from .._facade import *  # noqa: F403  (the names shared with distbreaker)
from .._facade import __all__ as _shared
from ..breaker.aio import CircuitBreaker
from ..budget.aio import RetryBudget
from ..bulkhead.aio import Bulkhead
from ..ganesha.aio import GaneshaBreaker
from ..policy.aio import Policy
from ..pool.aio import Pool
from ..ratelimiter.aio import RateLimiter
from ..registry.aio import Registry
from ..registry.config import RegistryConfigError
from ..registry.health import ComponentHealth, RegistryHealth
from ..registry.health import ahealth as health
from ..retry.aio import Retry

__all__ = [*_shared, "Bulkhead", "CircuitBreaker", "ComponentHealth", "GaneshaBreaker",
           "Policy", "Pool", "RateLimiter", "Registry", "RegistryConfigError", "RegistryHealth",
           "Retry", "RetryBudget", "health"]
