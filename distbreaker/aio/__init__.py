"""distbreaker for asyncio: the same fleet-wide breakers, with awaited Redis calls."""

from ..bulkhead_codec import BulkheadConfig, BulkheadMetrics, BulkheadPermit
from ..codec import Metrics
from ..config import BreakerConfig, RedisErrorPolicy, WindowType
from ..errors import BulkheadFull, CallNotPermitted
from ..events import Transition
from ..state import State
from .breaker import CircuitBreaker
from .budget import RetryBudget
from .bulkhead import Bulkhead
from .policy import Policy
from .retry import Retry

__all__ = [
    "BreakerConfig",
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
    "Retry",
    "RetryBudget",
    "State",
    "Transition",
    "WindowType",
]
