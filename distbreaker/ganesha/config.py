"""Ganesha mode's configuration: the Rate strategy's settings and key layout."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from .._runtime.options import (
    Seconds,
    check_int,
    check_percent,
    check_redis_options,
    merge_options,
    to_seconds,
)


class GaneshaEvent(str, Enum):
    """Ganesha's status events."""

    TRIPPED = "tripped"
    CALMED_DOWN = "calmed_down"


@dataclasses.dataclass(frozen=True)
class GaneshaConfig:
    """Ganesha's Rate strategy settings (seconds, as Ganesha takes them) and key layout.

    `key_ttl` 0 keeps Ganesha's own behaviour (keys never expire); a positive
    value (at least `time_window + interval_to_half_open`) makes every Python
    write refresh a TTL on the keys it touches.
    `redis_timeout` / `redis_retry_max_backoff` as for the breaker.
    """

    failure_rate_threshold: float = 50.0
    interval_to_half_open: int = 5
    minimum_requests: int = 10
    time_window: int = 30
    prefix: str = "ganesha_"
    success_suffix: str = "_success"
    failure_suffix: str = "_failure"
    rejection_suffix: str = "_rejection"
    status_suffix: str = "_status"
    key_ttl: Seconds = 0.0
    redis_timeout: Seconds = 0.25
    redis_retry_max_backoff: Seconds = 5.0

    def __post_init__(self) -> None:
        check_percent(self.failure_rate_threshold, "failure_rate_threshold")
        check_int(self.interval_to_half_open, "interval_to_half_open", 1, 86_400)
        check_int(self.minimum_requests, "minimum_requests", 1, 1_000_000_000)
        check_int(self.time_window, "time_window", 1, 86_400)
        for field in ("prefix", "success_suffix", "failure_suffix", "rejection_suffix",
                      "status_suffix"):
            value = getattr(self, field)
            if not isinstance(value, str) or any(not c.isprintable() or c.isspace()
                                                 for c in value):
                raise ValueError(f"{field} must be a printable str without whitespace, "
                                 f"got {value!r}")
        suffixes = {self.success_suffix, self.failure_suffix, self.rejection_suffix,
                    self.status_suffix}
        if len(suffixes) != 4:
            raise ValueError("the four suffixes must differ from each other")
        object.__setattr__(self, "key_ttl", to_seconds(self.key_ttl, "key_ttl"))
        shortest = self.time_window + self.interval_to_half_open
        if 0 < self.key_ttl < shortest:
            # A TTL set by Python would expire events other writers (Ganesha's PHP side,
            # which sets no TTL) added after Python's last write, inside the window.
            raise ValueError(f"key_ttl must be 0 (no TTL) or at least time_window + "
                             f"interval_to_half_open = {shortest} s, so a TTL never "
                             f"expires another writer's events inside the window; "
                             f"got {self.key_ttl!r}")
        check_redis_options(self)

    def replace(self, **changes: Any) -> GaneshaConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def keys(self, service: str) -> list[str]:
        """Ganesha's keys for a service: success, failure, rejection, status."""
        base = f"{self.prefix}{service}"
        return [base + self.success_suffix, base + self.failure_suffix,
                base + self.rejection_suffix, base + self.status_suffix]


def build_ganesha_config(config: GaneshaConfig | None,
                         overrides: dict[str, Any]) -> GaneshaConfig:
    """Merge constructor keyword overrides into a Ganesha config."""
    return merge_options(GaneshaConfig, config, overrides, "ganesha")
