"""Retry settings: a frozen, validated dataclass, and the default exceptions never retried."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from enum import Enum
from typing import Any

from .._runtime.classify import HttpClassifier
from .._runtime.options import Seconds, check_int, exception_types, merge_options, to_seconds
from ..errors import BulkheadFull, CallNotPermitted, RequestNotPermitted, SchemaError


class Jitter(str, Enum):
    """How a backoff ceiling becomes a wait: FULL random in [0, c], EQUAL in [c/2, c], NONE c."""

    FULL = "full"
    EQUAL = "equal"
    NONE = "none"


def default_ignore() -> tuple[type[BaseException], ...]:
    """Rejections by the breaker, the bulkhead or the rate limiter (it already waited its
    `timeout_duration`): retrying them only adds load; and
    foreign or corrupt data in Redis (SchemaError): a retry meets the same data, and
    would spend the retry budget on it."""
    return (CallNotPermitted, BulkheadFull, RequestNotPermitted, SchemaError)


@dataclasses.dataclass(frozen=True)
class RetryConfig:
    """Retry settings (durations in seconds, float or timedelta).

    `max_attempts` counts the first call. The n-th retry (n = 0, 1, ...) waits
    `min(cap, base * multiplier**n)` shaped by `jitter`, or exactly the
    Retry-After the error carries; a Retry-After longer than `max_retry_after`
    (None: no limit) makes the failure final. `deadline` caps the whole logical
    call: a wait that would end at or past it is not started.
    """

    max_attempts: int = 3
    base: Seconds = 0.1
    multiplier: float = 2.0
    cap: Seconds = 10.0
    jitter: Jitter | str = Jitter.FULL
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    ignore: tuple[type[BaseException], ...] = dataclasses.field(default_factory=default_ignore)
    deadline: Seconds | None = None
    retry_predicate: Callable[[BaseException], bool] | None = None
    respect_retry_after: bool = True
    max_retry_after: Seconds | None = 60.0
    http_classifier: HttpClassifier | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        check_int(self.max_attempts, "max_attempts", 1, 10_000)
        for field in ("base", "cap"):
            put(self, field, to_seconds(getattr(self, field), field))
        m = self.multiplier
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (
                math.isfinite(m) and 1 <= m <= 1000):
            raise ValueError(f"multiplier must be a number in [1, 1000], got {m!r}")
        put(self, "multiplier", float(m))
        try:
            put(self, "jitter", Jitter(self.jitter))
        except ValueError:
            raise ValueError(f"jitter must be 'full', 'equal' or 'none', "
                             f"got {self.jitter!r}") from None
        put(self, "retry_on", exception_types(self.retry_on, "retry_on"))
        put(self, "ignore", exception_types(self.ignore, "ignore"))
        for field in ("deadline", "max_retry_after"):
            if getattr(self, field) is not None:
                put(self, field, to_seconds(getattr(self, field), field))
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline must be > 0 seconds or None, got {self.deadline!r}")
        if self.retry_predicate is not None and not callable(self.retry_predicate):
            raise ValueError(f"retry_predicate must be callable or None, "
                             f"got {self.retry_predicate!r}")
        if not isinstance(self.respect_retry_after, bool):
            raise ValueError(f"respect_retry_after must be a bool, "
                             f"got {self.respect_retry_after!r}")
        classifier = self.http_classifier
        if classifier is not None and not isinstance(classifier, HttpClassifier):
            if not isinstance(classifier, dict):
                raise ValueError(f"http_classifier must be an HttpClassifier or a "
                                 f"{{status: verdict}} dict, got {classifier!r}")
            put(self, "http_classifier", HttpClassifier(classifier))

    def replace(self, **changes: Any) -> RetryConfig:
        return dataclasses.replace(self, **changes)


def build_retry_config(config: RetryConfig | None, overrides: dict[str, Any]) -> RetryConfig:
    """Merge constructor keyword overrides into a retry config."""
    return merge_options(RetryConfig, config, overrides, "retry")
