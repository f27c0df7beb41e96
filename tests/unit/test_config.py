"""BreakerConfig validation: every bad value is refused at build time with an
error that names the field (and, for out-of-range values, the allowed range),
both through `BreakerConfig(...)` and through `CircuitBreaker(...)` keyword
overrides, before anything touches Redis."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker.breaker.config import BreakerConfig, WindowType

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
    ("slow_call_duration", "60", "number of seconds or a timedelta"),
    ("slow_call_duration", None, "number of seconds or a timedelta"),
    ("slow_call_duration", math.inf, "finite"),
    ("slow_call_duration", timedelta(seconds=-1), ">= 0"),
    ("wait_duration_in_open_state", 0, ">= 0.001"),
    ("wait_duration_in_open_state", -0.5, ">= 0"),
    ("wait_duration_in_open_state", "1s", "number of seconds or a timedelta"),
    ("wait_duration_in_open_state", [1], "number of seconds or a timedelta"),
    ("max_wait_in_half_open", -1, ">= 0"),
    ("max_wait_in_half_open", math.nan, "finite"),
    ("half_open_lease", 0, "> 0"),
    ("half_open_lease", "soon", "number of seconds or a timedelta"),
    ("key_ttl", -1, ">= 0"),
    ("key_ttl", 10, "longest wait, lease or time window"),   # < the 60 s default wait
    ("redis_timeout", 0, "> 0"),
    ("redis_timeout", False, "number of seconds or a timedelta"),
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


@pytest.mark.parametrize("case", INVALID[::4], ids=[_id(c) for c in INVALID[::4]])
def test_breaker_keyword_overrides_are_validated_before_any_redis_io(
        case: tuple[str, Any, str], redis_url: str, redis_client: redis.Redis) -> None:
    field, value, _ = case
    with pytest.raises(ValueError, match=field):
        CircuitBreaker("cfg-test", redis=redis_url, **{field: value})
    assert redis_client.dbsize() == 0


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
