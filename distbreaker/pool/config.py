"""Pool settings: a frozen, validated dataclass with Envoy's outlier-detection field names."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .._runtime.options import (
    Seconds,
    check_int,
    check_redis_options,
    merge_options,
    to_ms,
    to_seconds,
)

#: How the pool chooses between the two members it draws (power of two choices).
BALANCES = ("in_flight", "latency", "random")
MAX_WEIGHT = 1_000_000
MAX_MEMBER_LENGTH = 200
_BAD_MEMBER = re.compile(r"[\s\x00-\x1f\x7f]")

Members = tuple[tuple[str, int], ...]


def validate_member(member: object) -> str:
    """A member name (a host, a URL, a deployment): 1-200 characters, no whitespace or
    control characters (the wire separates fields with spaces)."""
    if not isinstance(member, str):
        raise ValueError(f"a pool member must be a str, got {type(member).__name__}")
    if not 1 <= len(member) <= MAX_MEMBER_LENGTH:
        raise ValueError(f"a pool member must be 1-{MAX_MEMBER_LENGTH} characters, "
                         f"got {len(member)}")
    if _BAD_MEMBER.search(member):
        raise ValueError(f"a pool member must not contain whitespace or control "
                         f"characters, got {member!r}")
    return member


def normalize_members(members: Any) -> Members:
    """Members as ((name, weight), ...): from names (weight 1), (name, weight) pairs or a
    mapping name -> weight; a name given twice keeps its last weight."""
    if members is None:
        return ()
    if isinstance(members, str):
        members = [members]
    items: Iterable[Any] = members.items() if isinstance(members, Mapping) else members
    out: dict[str, int] = {}
    name: Any
    for item in items:
        if isinstance(item, str):
            name, weight = item, 1
        elif isinstance(item, Mapping):
            name, weight = item.get("name"), item.get("weight", 1)
        else:
            name, weight = item
        out[validate_member(name)] = check_int(weight, f"weight of member {name!r}", 0,
                                               MAX_WEIGHT)
    return tuple(out.items())


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """Settings of one fleet-wide pool: its members and Envoy's outlier detection.

    Field names and defaults are Envoy's (``outlier_detection`` of a cluster), but every
    count is fleet-wide: a member is ejected after `consecutive_5xx` 5xx in a row seen by
    the whole fleet, not by one process. Durations in seconds (or a timedelta, or
    '30s'); `*_percent`, `enforcing_*` and thresholds in percent (0-100). Envoy's
    ``success_rate_stdev_factor`` is in thousandths (1900); here it is the factor itself
    (1.9). What Envoy lacks: latency outliers (the pool's threshold is `latency_factor` x
    the median member's mean latency, at least `latency_threshold`; a member whose
    `latency_percentile` latency is above it while the median member's is not is an
    outlier), probes after an ejection (`probe_calls`: the calls a member back
    from ejection gets first, at most that many in flight; one failure ejects it again,
    longer), a lease per
    pick (`max_call_duration`: a pick never recorded leaves the in-flight count after it).
    `members`: the static members (names, (name, weight) pairs or a mapping), sent to Redis
    by the first call of a process when the pool has none there; `set_members()` changes
    them at run time, fleet-wide.
    """

    members: Any = ()
    balance: str = "in_flight"
    interval: Seconds = 10.0
    base_ejection_time: Seconds = 30.0
    max_ejection_time: Seconds = 300.0
    max_ejection_percent: int = 10
    consecutive_5xx: int = 5
    enforcing_consecutive_5xx: int = 100
    consecutive_gateway_failure: int = 5
    enforcing_consecutive_gateway_failure: int = 0
    split_external_local_origin_errors: bool = False
    consecutive_local_origin_failure: int = 5
    enforcing_consecutive_local_origin_failure: int = 100
    success_rate_minimum_hosts: int = 5
    success_rate_request_volume: int = 100
    success_rate_stdev_factor: float = 1.9
    enforcing_success_rate: int = 100
    failure_percentage_threshold: int = 85
    failure_percentage_minimum_hosts: int = 5
    failure_percentage_request_volume: int = 50
    enforcing_failure_percentage: int = 0
    latency_factor: float = 3.0
    latency_threshold: Seconds = 0.1
    latency_percentile: int = 50
    latency_minimum_hosts: int = 5
    latency_request_volume: int = 100
    enforcing_latency: int = 100
    healthy_panic_threshold: int = 50
    probe_calls: int = 3
    max_call_duration: Seconds = 60.0
    key_ttl: Seconds = 86400.0
    redis_timeout: Seconds = 0.25
    redis_retry_max_backoff: Seconds = 5.0

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "members", normalize_members(self.members))
        if self.balance not in BALANCES:
            raise ValueError(f"balance must be one of {', '.join(BALANCES)}, "
                             f"got {self.balance!r}")
        for field in ("interval", "base_ejection_time", "max_call_duration", "key_ttl"):
            put(self, field, to_seconds(getattr(self, field), field, positive=True))
        for field in ("max_ejection_time", "latency_threshold"):
            put(self, field, to_seconds(getattr(self, field), field))
        for field in ("max_ejection_percent", "enforcing_consecutive_5xx",
                      "enforcing_consecutive_gateway_failure",
                      "enforcing_consecutive_local_origin_failure", "enforcing_success_rate",
                      "failure_percentage_threshold", "enforcing_failure_percentage",
                      "enforcing_latency", "healthy_panic_threshold"):
            check_int(getattr(self, field), field, 0, 100)
        for field in ("consecutive_5xx", "consecutive_gateway_failure",
                      "consecutive_local_origin_failure", "success_rate_minimum_hosts",
                      "success_rate_request_volume", "failure_percentage_minimum_hosts",
                      "failure_percentage_request_volume", "latency_minimum_hosts",
                      "latency_request_volume"):
            check_int(getattr(self, field), field, 0, 1_000_000_000)
        check_int(self.probe_calls, "probe_calls", 1, 1_000_000)
        check_int(self.latency_percentile, "latency_percentile", 1, 99)
        for field in ("success_rate_stdev_factor", "latency_factor"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or not 0 <= value <= 1_000_000:
                raise ValueError(f"{field} must be a number in [0, 1000000], got {value!r}")
            put(self, field, float(value))
        if not isinstance(self.split_external_local_origin_errors, bool):
            raise ValueError("split_external_local_origin_errors must be a bool, got "
                             f"{self.split_external_local_origin_errors!r}")
        check_redis_options(self)

    @property
    def wire(self) -> str:
        """The config as the script reads it: integers joined by commas (KEY_SCHEMA, Pool)."""
        return config_wire(self)

    def replace(self, **changes: Any) -> PoolConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _ms(seconds: Any) -> int:
    return to_ms(float(seconds))


def config_wire(cfg: PoolConfig) -> str:
    values = (
        _ms(cfg.interval), _ms(cfg.base_ejection_time), _ms(cfg.max_ejection_time),
        cfg.max_ejection_percent,
        cfg.consecutive_5xx, cfg.consecutive_gateway_failure,
        cfg.consecutive_local_origin_failure, cfg.enforcing_consecutive_5xx,
        cfg.enforcing_consecutive_gateway_failure,
        cfg.enforcing_consecutive_local_origin_failure,
        int(cfg.split_external_local_origin_errors),
        cfg.success_rate_minimum_hosts, cfg.success_rate_request_volume,
        round(cfg.success_rate_stdev_factor * 1000), cfg.enforcing_success_rate,
        cfg.failure_percentage_threshold, cfg.failure_percentage_minimum_hosts,
        cfg.failure_percentage_request_volume, cfg.enforcing_failure_percentage,
        round(cfg.latency_factor * 1000), cfg.latency_minimum_hosts,
        cfg.latency_request_volume, cfg.enforcing_latency,
        cfg.healthy_panic_threshold, cfg.probe_calls, max(1, _ms(cfg.max_call_duration)),
        max(1, _ms(cfg.key_ttl)), BALANCES.index(cfg.balance), _ms(cfg.latency_threshold),
        cfg.latency_percentile,
    )
    return ",".join(str(v) for v in values)


#: The wire string's fields in order (docs/KEY_SCHEMA.md lists them; a test compares).
WIRE_FIELDS = (
    "interval_ms", "base_ejection_time_ms", "max_ejection_time_ms", "max_ejection_percent",
    "consecutive_5xx", "consecutive_gateway_failure", "consecutive_local_origin_failure",
    "enforcing_consecutive_5xx", "enforcing_consecutive_gateway_failure",
    "enforcing_consecutive_local_origin_failure", "split_external_local_origin_errors",
    "success_rate_minimum_hosts", "success_rate_request_volume",
    "success_rate_stdev_factor_x1000", "enforcing_success_rate",
    "failure_percentage_threshold", "failure_percentage_minimum_hosts",
    "failure_percentage_request_volume", "enforcing_failure_percentage",
    "latency_factor_x1000", "latency_minimum_hosts", "latency_request_volume",
    "enforcing_latency", "healthy_panic_threshold", "probe_calls", "max_call_duration_ms",
    "key_ttl_ms", "balance", "latency_threshold_ms", "latency_percentile",
)


def build_pool_config(config: PoolConfig | None, overrides: dict[str, Any]) -> PoolConfig:
    """Merge constructor keyword overrides into a pool config."""
    return merge_options(PoolConfig, config, overrides, "pool")
