"""The fleet-wide circuit breaker: config, pure core, sync and asyncio shells, batching."""

from .config import BreakerConfig, RecordMode, RedisErrorPolicy, WindowType
from .core import BreakerMetrics, Metrics
from .events import Transition
from .state import State
from .sync import CircuitBreaker

__all__ = ["BreakerConfig", "BreakerMetrics", "CircuitBreaker", "Metrics", "RecordMode",
           "RedisErrorPolicy", "State", "Transition", "WindowType"]
