"""distbreaker for asyncio: the same fleet-wide breakers, with awaited Redis calls."""

from ..codec import Metrics
from ..config import BreakerConfig, RedisErrorPolicy, WindowType
from ..errors import CallNotPermitted
from ..events import Transition
from ..state import State
from .breaker import CircuitBreaker

__all__ = [
    "BreakerConfig",
    "CallNotPermitted",
    "CircuitBreaker",
    "Metrics",
    "RedisErrorPolicy",
    "State",
    "Transition",
    "WindowType",
]
