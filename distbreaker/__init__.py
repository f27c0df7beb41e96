"""distbreaker: one circuit breaker per dependency for a whole fleet, kept in Redis."""

from ._runtime.keys import SCHEMA_VERSION
from .breaker.classify import (
    HttpClassifier,
    HttpStatusError,
    HttpVerdict,
    Outcome,
    classify_exception,
    classify_http,
    parse_retry_after,
)
from .breaker.config import BreakerConfig, RedisErrorPolicy, WindowType
from .breaker.core import BreakerMetrics, Metrics
from .breaker.events import Transition
from .breaker.state import State
from .breaker.sync import CircuitBreaker
from .budget.config import BudgetConfig
from .budget.sync import RetryBudget
from .bulkhead.config import BulkheadConfig
from .bulkhead.core import BulkheadMetrics, BulkheadPermit
from .bulkhead.sync import Bulkhead
from .errors import (
    BulkheadFull,
    CallNotPermitted,
    ConfigDriftWarning,
    DistbreakerError,
    RetryBudgetExhausted,
    SchemaError,
)
from .policy.sync import Policy
from .registry import ComponentHealth, Registry, RegistryConfigError, RegistryHealth, health
from .retry.config import Jitter, RetryConfig
from .retry.sync import Retry

__all__ = [
    "SCHEMA_VERSION",
    "BreakerConfig",
    "BreakerMetrics",
    "BudgetConfig",
    "Bulkhead",
    "BulkheadConfig",
    "BulkheadFull",
    "BulkheadMetrics",
    "BulkheadPermit",
    "CallNotPermitted",
    "CircuitBreaker",
    "ComponentHealth",
    "ConfigDriftWarning",
    "DistbreakerError",
    "HttpClassifier",
    "HttpStatusError",
    "HttpVerdict",
    "Jitter",
    "Metrics",
    "Outcome",
    "Policy",
    "RedisErrorPolicy",
    "Registry",
    "RegistryConfigError",
    "RegistryHealth",
    "Retry",
    "RetryBudget",
    "RetryBudgetExhausted",
    "RetryConfig",
    "SchemaError",
    "State",
    "Transition",
    "WindowType",
    "classify_exception",
    "classify_http",
    "health",
    "parse_retry_after",
]
__version__ = "0.1.0"
