"""distbreaker for asyncio: the same fleet-wide breakers, with awaited Redis calls."""

from ..breaker.aio import CircuitBreaker
from ..breaker.config import BreakerConfig, RedisErrorPolicy, WindowType
from ..breaker.core import BreakerMetrics, Metrics
from ..breaker.events import Transition
from ..breaker.state import State
from ..budget.aio import RetryBudget
from ..bulkhead.aio import Bulkhead
from ..bulkhead.config import BulkheadConfig
from ..bulkhead.core import BulkheadMetrics, BulkheadPermit
from ..errors import BulkheadFull, CallNotPermitted
from ..policy.aio import Policy
from ..registry.aio import Registry
from ..registry.health import ahealth as health
from ..retry.aio import Retry

__all__ = [
    "BreakerConfig",
    "BreakerMetrics",
    "Bulkhead",
    "BulkheadConfig",
    "BulkheadFull",
    "BulkheadMetrics",
    "BulkheadPermit",
    "CallNotPermitted",
    "CircuitBreaker",
    "Metrics",
    "Policy",
    "RedisErrorPolicy",
    "Registry",
    "Retry",
    "RetryBudget",
    "State",
    "Transition",
    "WindowType",
    "health",
]
