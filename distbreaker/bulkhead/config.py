"""Bulkhead settings: a frozen, validated dataclass."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._runtime.options import Seconds, check_int, check_redis_options, merge_options, to_seconds
from .adaptive import AdaptiveLimit


@dataclasses.dataclass(frozen=True)
class BulkheadConfig:
    """Settings of one fleet-wide bulkhead.

    `max_concurrent_calls` permits exist fleet-wide. `max_wait_duration` 0
    rejects at once with `BulkheadFull`; a positive value waits that long at
    most, woken by releases. Every permit is a `lease`: a holder that dies
    (SIGKILL) gives its permit back within one lease; a live holder renews its
    lease every `lease / 3` while its call runs.

    While Redis is unreachable each process enforces its own `fallback_limit`
    with a local semaphore: by default ``max(1, max_concurrent_calls //
    expected_workers)``, so the fleet stays near its limit when the user says
    how many processes share it. `fallback_limit=0` rejects every call while
    Redis is down (fail closed). The fallback is never unlimited.

    `adaptive` (an `AdaptiveLimit`, or a mapping of its fields) makes the limit
    fleet-wide adaptive: it lives in Redis and moves with the outcomes every worker
    reports, and `max_concurrent_calls` only sizes the local fallback. Calls may carry
    a priority (`acquire(priority=...)`; a call without one may use the whole limit):
    near the limit `critical` calls may use all of it, `normal` ones all but
    `critical_reserve`, `sheddable` ones at most `sheddable_share` of it (each at least
    one permit), so lower priorities are shed first, fleet-wide.
    """

    max_concurrent_calls: int = 25
    max_wait_duration: Seconds = 0.0
    lease: Seconds = 30.0
    expected_workers: int = 1
    fallback_limit: int | None = None
    key_ttl: Seconds = 3600.0
    redis_timeout: Seconds = 0.25
    redis_retry_max_backoff: Seconds = 5.0
    adaptive: AdaptiveLimit | None = None
    critical_reserve: float = 0.1
    sheddable_share: float = 0.7

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "adaptive", AdaptiveLimit.build(self.adaptive))  # type: ignore[arg-type]
        for field in ("critical_reserve", "sheddable_share"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or (not 0 <= value < 1 and not (field == "sheddable_share" and value == 1)):
                raise ValueError(f"{field} must be a number in [0, 1), got {value!r}")
            put(self, field, float(value))
        check_int(self.max_concurrent_calls, "max_concurrent_calls", 1, _MAX_LIMIT)
        check_int(self.expected_workers, "expected_workers", 1, _MAX_LIMIT)
        if self.fallback_limit is not None:
            check_int(self.fallback_limit, "fallback_limit", 0, _MAX_LIMIT)
        for field in ("max_wait_duration", "lease", "key_ttl"):
            put(self, field, to_seconds(getattr(self, field), field))
        if self.lease < 0.01:
            raise ValueError(f"lease must be >= 0.01 seconds, got {self.lease!r}")
        check_redis_options(self)
        floor = max(self.lease, self.max_wait_duration)
        if self.key_ttl < floor:
            raise ValueError(f"key_ttl must be >= {floor} seconds (the lease and the longest "
                             f"wait), got {self.key_ttl!r}")

    @property
    def effective_fallback_limit(self) -> int:
        """The per-process limit while Redis is unreachable."""
        if self.fallback_limit is not None:
            return self.fallback_limit
        return max(1, self.max_concurrent_calls // self.expected_workers)

    @property
    def waiting_socket_timeout(self) -> float:
        """Socket timeout of the client BLPOP waits on: outlasts the longest wait."""
        return self.max_wait_duration + self.redis_timeout + 1

    @property
    def renew_interval(self) -> float:
        """How often a held permit's lease is renewed (seconds)."""
        return self.lease / 3

    def replace(self, **changes: Any) -> BulkheadConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build_bulkhead_config(config: BulkheadConfig | None,
                          overrides: dict[str, Any]) -> BulkheadConfig:
    """Merge constructor keyword overrides into a bulkhead config."""
    return merge_options(BulkheadConfig, config, overrides, "bulkhead")


_MAX_LIMIT = 1_000_000
