"""distbreaker: one circuit breaker per dependency for a whole fleet, kept in Redis."""

from .breaker import CircuitBreaker
from .classify import Outcome, classify_exception
from .codec import Metrics
from .config import BreakerConfig, RedisErrorPolicy, WindowType
from .errors import CallNotPermitted, ConfigDriftWarning, DistbreakerError, SchemaError
from .events import Transition
from .keys import SCHEMA_VERSION
from .state import State

__all__ = [
    "SCHEMA_VERSION",
    "BreakerConfig",
    "CallNotPermitted",
    "CircuitBreaker",
    "ConfigDriftWarning",
    "DistbreakerError",
    "Metrics",
    "Outcome",
    "RedisErrorPolicy",
    "SchemaError",
    "State",
    "Transition",
    "WindowType",
    "classify_exception",
]
__version__ = "0.1.0"
