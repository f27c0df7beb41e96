"""distbreaker: one circuit breaker per dependency for a whole fleet, kept in Redis."""

from .breaker import CircuitBreaker
from .budget import RetryBudget
from .budget_codec import BudgetConfig
from .bulkhead import Bulkhead
from .bulkhead_codec import BulkheadConfig, BulkheadMetrics, BulkheadPermit
from .classify import (
    HttpClassifier,
    HttpStatusError,
    HttpVerdict,
    Outcome,
    classify_exception,
    classify_http,
    parse_retry_after,
)
from .codec import Metrics
from .config import BreakerConfig, RedisErrorPolicy, WindowType
from .errors import (
    BulkheadFull,
    CallNotPermitted,
    ConfigDriftWarning,
    DistbreakerError,
    RetryBudgetExhausted,
    SchemaError,
)
from .events import Transition
from .keys import SCHEMA_VERSION
from .policy import Policy
from .retry import Jitter, Retry, RetryConfig
from .state import State

__all__ = [
    "SCHEMA_VERSION",
    "BreakerConfig",
    "BudgetConfig",
    "Bulkhead",
    "BulkheadConfig",
    "BulkheadFull",
    "BulkheadMetrics",
    "BulkheadPermit",
    "CallNotPermitted",
    "CircuitBreaker",
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
    "parse_retry_after",
]
__version__ = "0.1.0"
