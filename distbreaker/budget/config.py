"""Retry budget settings (Finagle style): a frozen, validated dataclass."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .._runtime.options import Seconds, check_int, check_redis_options, merge_options, to_seconds

MILLIONTHS = 1_000_000


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    """Finagle's RetryBudget settings.

    `percent_can_retry` is a fraction (0.2 = one retry per five requests);
    `min_retries_per_sec * ttl` is the floor that lets a quiet service retry at
    all. The window (`ttl`) is cut into `slices` time slices, evicted lazily in
    Redis. `deposit_batch` > 1 keeps deposits in this process until that many
    are pending, then sends them with the next script call (a withdrawal or
    balance read carries them too), so successful calls cost no round trip;
    pending deposits only ever make the budget stricter, never looser.
    `redis_timeout` / `redis_retry_max_backoff` as for the breaker.
    """

    percent_can_retry: float = 0.2
    min_retries_per_sec: float = 10.0
    ttl: Seconds = 10.0
    slices: int = 10
    deposit_batch: int = 1
    redis_timeout: Seconds = 0.25
    redis_retry_max_backoff: Seconds = 5.0

    def __post_init__(self) -> None:
        put = object.__setattr__
        for field, top in (("percent_can_retry", MAX_PERCENT_CAN_RETRY),
                           ("min_retries_per_sec", 1_000_000.0)):
            value = getattr(self, field)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or not 0 <= value <= top):
                raise ValueError(f"{field} must be a number in [0, {top:g}], got {value!r}")
            put(self, field, float(value))
        put(self, "ttl", to_seconds(self.ttl, "ttl"))
        if not 0.01 <= self.ttl <= 86_400:
            raise ValueError(f"ttl must be in [0.01, 86400] seconds, got {self.ttl!r}")
        check_redis_options(self)
        check_int(self.slices, "slices", 1, 100)
        check_int(self.deposit_batch, "deposit_batch", 1, 10_000)

    @property
    def floor(self) -> int:
        """Retries allowed with no traffic at all: floor(min_retries_per_sec * ttl)."""
        return self.reserve_millionths // MILLIONTHS

    @property
    def percent_millionths(self) -> int:
        return round(self.percent_can_retry * MILLIONTHS)

    @property
    def reserve_millionths(self) -> int:
        return round(self.min_retries_per_sec * self.ttl * MILLIONTHS)


def build_budget_config(config: BudgetConfig | None, overrides: dict[str, Any]) -> BudgetConfig:
    """Merge constructor keyword overrides into a retry budget config."""
    return merge_options(BudgetConfig, config, overrides, "retry budget")


MAX_PERCENT_CAN_RETRY = 10.0   # 1000 %, as in Finagle
