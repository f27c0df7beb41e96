"""Rate limiter settings: a frozen, validated dataclass (Resilience4j's field names)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._runtime.options import (
    RedisErrorPolicy,
    Seconds,
    check_int,
    check_redis_options,
    merge_options,
    to_ms,
    to_seconds,
)

#: limit_for_period x limit_refresh_period (ms) at most this: the script's arithmetic
#: (microseconds in doubles) stays exact. 150 million permits per minute, for example.
MAX_PRODUCT = 9_000_000_000_000
_MAX_LIMIT = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class RateLimiterConfig:
    """Settings of one fleet-wide rate limiter.

    `limit_for_period` permits per `limit_refresh_period`, fleet-wide, decided by
    Redis time (GCRA: a bucket of `burst` permits, default `limit_for_period`,
    refilled at `limit_for_period / limit_refresh_period`). A call asks for one permit,
    or a weight (``acquire(permits=n)``: tokens per call, at most `burst`). It waits up
    to `timeout_duration` for its permits (0: refused at once with
    `RequestNotPermitted`); a waiting call's permits are reserved when it asks, so
    waiting calls are served in the order they asked, fleet-wide. Resilience4j's
    defaults, but the refresh period: 0.5 s rather than 500 ns (Redis time is in
    microseconds, and a fleet shares one limit).

    While Redis is unreachable (`on_redis_error`): ``fail_open`` limits each process
    to ``limit_for_period // expected_workers`` (and the burst likewise, at least 1)
    with the same script on an in-process fakeredis; ``fail_closed`` refuses every
    call. `key_ttl`: an idle limiter's key (its counters, an operator's limit) expires
    after it; at least twice the longest reservation (timeout + period); by default an
    hour, or that floor when it is longer.
    """

    limit_for_period: int = 50
    limit_refresh_period: Seconds = 0.5
    timeout_duration: Seconds = 5.0
    burst: int | None = None
    on_redis_error: RedisErrorPolicy | str = RedisErrorPolicy.FAIL_OPEN
    expected_workers: int = 1
    key_ttl: Seconds | None = None
    redis_timeout: Seconds = 0.25
    redis_retry_max_backoff: Seconds = 5.0

    def __post_init__(self) -> None:
        put = object.__setattr__
        check_int(self.limit_for_period, "limit_for_period", 1, _MAX_LIMIT)
        if self.burst is not None:
            check_int(self.burst, "burst", 1, _MAX_LIMIT)
        for field in ("limit_refresh_period", "timeout_duration"):
            put(self, field, to_seconds(getattr(self, field), field))
        if self.limit_refresh_period < 0.001:
            raise ValueError("limit_refresh_period must be >= 0.001 seconds (Redis time is "
                             f"read in ms), got {self.limit_refresh_period!r}")
        if self.limit_for_period * self.period_ms > MAX_PRODUCT:
            raise ValueError(f"limit_for_period x limit_refresh_period (ms) must be <= "
                             f"{MAX_PRODUCT:.0e} (e.g. 150 million per minute), got "
                             f"{self.limit_for_period} per {self.period_ms} ms")
        check_int(self.expected_workers, "expected_workers", 1, 1_000_000)
        put(self, "on_redis_error", RedisErrorPolicy.check(self.on_redis_error))
        check_redis_options(self)
        if self.key_ttl is not None:
            put(self, "key_ttl", to_seconds(self.key_ttl, "key_ttl"))
            if self.key_ttl < self._ttl_floor:
                raise ValueError(f"key_ttl must be >= {self._ttl_floor:g} seconds (twice "
                                 f"timeout_duration + limit_refresh_period), got "
                                 f"{self.key_ttl!r}")

    @property
    def _ttl_floor(self) -> float:
        return 2 * (float(self.timeout_duration) + float(self.limit_refresh_period))

    @property
    def effective_key_ttl(self) -> float:
        """`key_ttl`, or by default an hour (longer when the floor is: see the class)."""
        if self.key_ttl is None:
            return max(3600.0, self._ttl_floor)
        return float(self.key_ttl)

    @property
    def period_ms(self) -> int:
        return max(1, to_ms(self.limit_refresh_period))

    @property
    def effective_burst(self) -> int:
        """The bucket's size in permits (`burst`, default `limit_for_period`)."""
        return self.limit_for_period if self.burst is None else self.burst

    @property
    def fallback_limit(self) -> int:
        """This process's limit per period while Redis is unreachable (fail_open)."""
        return max(1, self.limit_for_period // self.expected_workers)

    @property
    def fallback_burst(self) -> int:
        return max(1, self.effective_burst // self.expected_workers)

    def replace(self, **changes: Any) -> RateLimiterConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def build_ratelimiter_config(config: RateLimiterConfig | None,
                             overrides: dict[str, Any]) -> RateLimiterConfig:
    """Merge constructor keyword overrides into a rate limiter config."""
    return merge_options(RateLimiterConfig, config, overrides, "rate limiter")
