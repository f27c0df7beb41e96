"""Config validation: every bad value is refused at build time with an error that
names the field (and, for out-of-range values, the allowed range). BreakerConfig
first (the same cases as `CircuitBreaker(...)` keywords, with nothing written to
Redis, are in tests/redis/test_bad_input.py), then the bulkhead, retry budget,
batched record mode and Ganesha configs."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from typing import Any

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.config import BreakerConfig, WindowType
from distbreaker.budget.config import BudgetConfig
from distbreaker.budget.sync import RetryBudget
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.bulkhead.sync import Bulkhead
from distbreaker.ganesha.config import GaneshaConfig
from distbreaker.ganesha.sync import GaneshaBreaker
from distbreaker.retry.config import RetryConfig

# (field, bad value, text the message must contain besides the field name)
INVALID: list[tuple[str, Any, str]] = [
    ("failure_rate_threshold", 0, "(0, 100]"),
    ("failure_rate_threshold", -5, "(0, 100]"),
    ("failure_rate_threshold", 100.01, "(0, 100]"),
    ("failure_rate_threshold", math.nan, "(0, 100]"),
    ("failure_rate_threshold", math.inf, "(0, 100]"),
    ("failure_rate_threshold", "50", "(0, 100]"),
    ("failure_rate_threshold", True, "(0, 100]"),
    ("slow_call_rate_threshold", 0, "(0, 100]"),
    ("slow_call_rate_threshold", 101, "(0, 100]"),
    ("slow_call_rate_threshold", None, "(0, 100]"),
    ("sliding_window_size", 0, "[1, 100000]"),
    ("sliding_window_size", -1, "[1, 100000]"),
    ("sliding_window_size", 100_001, "[1, 100000]"),
    ("sliding_window_size", 10.0, "integer"),
    ("sliding_window_size", True, "integer"),
    ("sliding_window_size", "10", "integer"),
    ("minimum_number_of_calls", 0, "[1, "),
    ("minimum_number_of_calls", -3, "[1, "),
    ("minimum_number_of_calls", 2.5, "integer"),
    ("permitted_calls_in_half_open", 0, "[1, 10000]"),
    ("permitted_calls_in_half_open", 10_001, "[1, 10000]"),
    ("permitted_calls_in_half_open", None, "integer"),
    ("sliding_window_type", "SLIDING", "COUNT_BASED or TIME_BASED"),
    ("sliding_window_type", 5, "COUNT_BASED or TIME_BASED"),
    ("sliding_window_type", None, "COUNT_BASED or TIME_BASED"),
    ("slow_call_duration", 0, "> 0"),
    ("slow_call_duration", -1, ">= 0"),
    ("slow_call_duration", "sixty", "must be a duration"),
    ("slow_call_duration", None, "must be a duration"),
    ("slow_call_duration", math.inf, "finite"),
    ("slow_call_duration", timedelta(seconds=-1), ">= 0"),
    ("wait_duration_in_open_state", 0, ">= 0.001"),
    ("wait_duration_in_open_state", -0.5, ">= 0"),
    ("wait_duration_in_open_state", "1x", "must be a duration"),
    ("wait_duration_in_open_state", [1], "must be a duration"),
    ("max_wait_in_half_open", -1, ">= 0"),
    ("max_wait_in_half_open", math.nan, "finite"),
    ("half_open_lease", 0, "> 0"),
    ("half_open_lease", "soon", "must be a duration"),
    ("key_ttl", -1, ">= 0"),
    ("key_ttl", 10, "longest wait, lease or time window"),   # < the 60 s default wait
    ("redis_timeout", 0, "> 0"),
    ("redis_timeout", False, "must be a duration"),
    ("redis_retry_max_backoff", -1, ">= 0"),
    ("on_redis_error", "ignore", "'fail_open' or 'fail_closed'"),
    ("record_exceptions", (str,), "exception classes"),
    ("record_exceptions", ("ValueError",), "exception classes"),
    ("ignore_exceptions", (42,), "exception classes"),
    ("record_predicate", 5, "callable"),
    ("ignore_predicate", "yes", "callable"),
]


def _id(case: tuple[str, Any, str]) -> str:
    return f"{case[0]}={case[1]!r}"


@pytest.mark.parametrize("case", INVALID, ids=[_id(c) for c in INVALID])
def test_invalid_value_names_the_field(case: tuple[str, Any, str]) -> None:
    field, value, detail = case
    with pytest.raises(ValueError) as caught:
        BreakerConfig(**{field: value})
    message = str(caught.value)
    assert field in message and detail in message, message


def test_time_window_size_is_capped_at_an_hour() -> None:
    BreakerConfig(sliding_window_type="TIME_BASED", sliding_window_size=3600)
    with pytest.raises(ValueError, match=r"sliding_window_size must be in \[1, 3600\]"):
        BreakerConfig(sliding_window_type="TIME_BASED", sliding_window_size=3601)


def test_key_ttl_must_outlive_a_time_window() -> None:
    with pytest.raises(ValueError, match="key_ttl must be >= 600"):
        BreakerConfig(sliding_window_type="TIME_BASED", sliding_window_size=600, key_ttl=300)


def test_unknown_keyword_names_the_option() -> None:
    with pytest.raises(TypeError, match="failure_threshold"):
        CircuitBreaker("cfg-test", redis="redis://127.0.0.1:1/0", failure_threshold=50)
    with pytest.raises(TypeError, match="failure_threshold"):
        BreakerConfig(failure_threshold=50)  # type: ignore[call-arg]


def test_config_must_be_a_breaker_config() -> None:
    with pytest.raises(TypeError, match="config must be a BreakerConfig"):
        CircuitBreaker("cfg-test", redis="redis://127.0.0.1:1/0",
                       config={"failure_rate_threshold": 10})  # type: ignore[arg-type]


def test_timedelta_is_accepted_and_converted_to_seconds() -> None:
    config = BreakerConfig(wait_duration_in_open_state=timedelta(seconds=2, milliseconds=500),
                           slow_call_duration=timedelta(milliseconds=250),
                           max_wait_in_half_open=timedelta(0))
    assert config.wait_duration_in_open_state == 2.5
    assert config.slow_call_duration == 0.25
    assert config.max_wait_in_half_open == 0.0
    assert config.to_wire().split(";")[6] == "2500" and config.to_wire().endswith(";250")


def test_window_type_aliases() -> None:
    for alias in ("COUNT", "count", "COUNT_BASED", WindowType.COUNT_BASED):
        assert BreakerConfig(sliding_window_type=alias).sliding_window_type is \
            WindowType.COUNT_BASED
    for alias in ("TIME", "time_based", WindowType.TIME_BASED):
        assert BreakerConfig(sliding_window_type=alias).sliding_window_type is \
            WindowType.TIME_BASED


def test_boundaries_are_accepted() -> None:
    config = BreakerConfig(failure_rate_threshold=100, slow_call_rate_threshold=0.001,
                           sliding_window_size=1, minimum_number_of_calls=1,
                           permitted_calls_in_half_open=1, wait_duration_in_open_state=0.001,
                           key_ttl=60)
    assert config.failure_rate_threshold == 100.0
    assert config.to_wire() == "1;C;1;1;100;0.001;1;1;0;60000;60000;60000"


def test_defaults_are_resilience4j_and_match_the_documented_wire_form() -> None:
    assert BreakerConfig().to_wire() == "1;C;100;100;50;100;60000;10;0;60000;3600000;60000"


def test_minimum_is_capped_at_the_count_window_only() -> None:
    assert BreakerConfig(sliding_window_size=5,
                         minimum_number_of_calls=50).effective_minimum_calls == 5
    assert BreakerConfig(sliding_window_type="TIME", sliding_window_size=5,
                         minimum_number_of_calls=50).effective_minimum_calls == 50


def test_config_is_frozen_and_replace_validates_again() -> None:
    config = BreakerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.failure_rate_threshold = 10  # type: ignore[misc]
    assert config.replace(failure_rate_threshold=10).failure_rate_threshold == 10
    with pytest.raises(ValueError, match="failure_rate_threshold"):
        config.replace(failure_rate_threshold=0)


def test_keyword_overrides_apply_on_top_of_a_config() -> None:
    base = BreakerConfig(sliding_window_size=20, minimum_number_of_calls=20)
    breaker = CircuitBreaker("cfg-test", redis="redis://127.0.0.1:1/0", config=base,
                             failure_rate_threshold=25)
    assert breaker.config.sliding_window_size == 20
    assert breaker.config.failure_rate_threshold == 25
    assert base.failure_rate_threshold == 50


# -- batched record mode ------------------------------------------------------------

def test_config_validates_the_batching_fields() -> None:
    config = BreakerConfig(record_mode="batched", flush_interval=0.005, max_batch=50)
    assert config.batched and config.max_pending == 10_000
    assert config.to_wire() == BreakerConfig().to_wire()  # local behaviour only
    assert not BreakerConfig().batched  # exact stays the default
    with pytest.raises(ValueError, match="record_mode"):
        BreakerConfig(record_mode="lazy")
    with pytest.raises(ValueError, match="flush_interval"):
        BreakerConfig(flush_interval=0)
    with pytest.raises(ValueError, match="max_pending"):
        BreakerConfig(max_batch=100, max_pending=99)


# -- bulkhead --------------------------------------------------------------------------

def test_bulkhead_config_validates_and_names_the_field() -> None:
    config = BulkheadConfig(max_wait_duration=timedelta(milliseconds=250), lease=2)
    assert config.max_wait_duration == 0.25 and config.lease == 2.0
    assert config.renew_interval == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="max_concurrent_calls"):
        BulkheadConfig(max_concurrent_calls=0)
    with pytest.raises(ValueError, match="max_wait_duration"):
        BulkheadConfig(max_wait_duration=-1)
    with pytest.raises(ValueError, match="lease"):
        BulkheadConfig(lease=0)
    with pytest.raises(ValueError, match="expected_workers"):
        BulkheadConfig(expected_workers=0)
    with pytest.raises(ValueError, match="key_ttl"):
        BulkheadConfig(lease=60, key_ttl=30)
    with pytest.raises(TypeError, match="unknown bulkhead option"):
        Bulkhead("x", redis="redis://127.0.0.1:1/0", max_calls=3)


def test_fallback_limit_is_the_fleet_limit_over_the_workers_and_at_least_one() -> None:
    assert BulkheadConfig(max_concurrent_calls=25).effective_fallback_limit == 25
    assert BulkheadConfig(max_concurrent_calls=25,
                          expected_workers=4).effective_fallback_limit == 6
    assert BulkheadConfig(max_concurrent_calls=3, expected_workers=8).effective_fallback_limit == 1
    assert BulkheadConfig(fallback_limit=0).effective_fallback_limit == 0


# -- retry budget ----------------------------------------------------------------------

@pytest.mark.parametrize(("options", "field"), [
    ({"percent_can_retry": -0.1}, "percent_can_retry"),
    ({"percent_can_retry": 11}, "percent_can_retry"),
    ({"min_retries_per_sec": -1}, "min_retries_per_sec"), ({"ttl": 0}, "ttl"),
    ({"slices": 0}, "slices"), ({"slices": 101}, "slices"),
])
def test_budget_config_names_the_field(options: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BudgetConfig(**options)
    with pytest.raises(TypeError, match="unknown retry budget option"):
        RetryBudget("x", redis="redis://localhost:1/0", percent=0.1)


# -- Ganesha ---------------------------------------------------------------------------

def test_ganesha_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="minimum_requests"):
        GaneshaConfig(minimum_requests=0)
    with pytest.raises(ValueError, match="failure_rate_threshold"):
        GaneshaConfig(failure_rate_threshold=150)
    with pytest.raises(ValueError, match="service"):
        GaneshaBreaker("has space", redis="redis://127.0.0.1:1")


@pytest.mark.parametrize(("config", "field"), [
    (lambda v: BreakerConfig(key_ttl=v), "key_ttl"),
    (lambda v: BreakerConfig(wait_duration_in_open_state=v), "wait_duration_in_open_state"),
    (lambda v: BreakerConfig(slow_call_duration=v), "slow_call_duration"),
    (lambda v: BulkheadConfig(lease=v), "lease"),
    (lambda v: BulkheadConfig(max_wait_duration=v), "max_wait_duration"),
    (lambda v: RetryConfig(cap=v), "cap"),
])
def test_a_duration_whose_milliseconds_redis_cannot_take_is_refused_naming_it(
        config: Any, field: str) -> None:
    """key_ttl=1e15 used to be accepted, then every call failed with "value is not an
    integer or out of range": its milliseconds go into Redis commands as integers."""
    with pytest.raises(ValueError, match=rf"^{field} must be at most 3153600000 seconds"):
        config(1e15)
