"""The public names that are the same objects in `distbreaker` and `distbreaker.aio`:
configs, errors, states, events, metrics, classification helpers, fork safety.
Each facade adds its own flavour of the components (CircuitBreaker, Bulkhead, ...).
"""

from ._runtime.classify import (
    HttpClassifier,
    HttpStatusError,
    HttpVerdict,
    Outcome,
    ResultRecordedAsFailure,
    classify_exception,
    classify_http,
    classify_result,
    parse_retry_after,
)
from ._runtime.events import Event
from ._runtime.forking import after_fork
from ._runtime.keys import SCHEMA_VERSION
from .breaker.config import BreakerConfig, RecordMode, RedisErrorPolicy, WindowType
from .breaker.core import BreakerMetrics, Metrics
from .breaker.events import Transition
from .breaker.state import State
from .budget.config import BudgetConfig
from .bulkhead.adaptive import AdaptiveLimit
from .bulkhead.config import BulkheadConfig
from .bulkhead.core import BulkheadMetrics, BulkheadPermit
from .errors import (
    BulkheadFull,
    CallNotPermitted,
    CheckFailed,
    ConfigDriftWarning,
    DistbreakerError,
    InjectedFault,
    InjectedRejection,
    NoPoolMember,
    Overloaded,
    RedisUnavailable,
    RequestNotPermitted,
    RetryBudgetExhausted,
    SchemaError,
)
from .ganesha.config import GaneshaConfig, GaneshaEvent
from .policy.core import AttemptTimeout
from .pool.config import PoolConfig
from .pool.core import MemberChange, MemberStatus, Pick, PoolStatus
from .ratelimiter.config import RateLimiterConfig
from .ratelimiter.core import RateLimiterMetrics
from .retry.config import Jitter, RetryConfig

__all__ = [
    "SCHEMA_VERSION",
    "AdaptiveLimit",
    "AttemptTimeout",
    "BreakerConfig",
    "BreakerMetrics",
    "BudgetConfig",
    "BulkheadConfig",
    "BulkheadFull",
    "BulkheadMetrics",
    "BulkheadPermit",
    "CallNotPermitted",
    "CheckFailed",
    "ConfigDriftWarning",
    "DistbreakerError",
    "Event",
    "GaneshaConfig",
    "GaneshaEvent",
    "HttpClassifier",
    "HttpStatusError",
    "HttpVerdict",
    "InjectedFault",
    "InjectedRejection",
    "Jitter",
    "MemberChange",
    "MemberStatus",
    "Metrics",
    "NoPoolMember",
    "Outcome",
    "Overloaded",
    "Pick",
    "PoolConfig",
    "PoolStatus",
    "RateLimiterConfig",
    "RateLimiterMetrics",
    "RecordMode",
    "RedisErrorPolicy",
    "RedisUnavailable",
    "RequestNotPermitted",
    "ResultRecordedAsFailure",
    "RetryBudgetExhausted",
    "RetryConfig",
    "SchemaError",
    "State",
    "Transition",
    "WindowType",
    "after_fork",
    "classify_exception",
    "classify_http",
    "classify_result",
    "parse_retry_after",
]
