"""Option helpers every component's config uses: durations, ranges, keyword overrides.

Durations are seconds (`float` or `datetime.timedelta`) in Python and integer
milliseconds inside the scripts; every error names the field it is about.
"""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import timedelta
from enum import Enum
from typing import Any, TypeVar

Seconds = float | int | timedelta


class RedisErrorPolicy(str, Enum):
    """What a protected call does while Redis is unreachable (every component that
    protects calls has an `on_redis_error` of this type)."""

    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"

    @classmethod
    def check(cls, value: Any) -> RedisErrorPolicy:
        """`value` as a policy, or a ValueError naming `on_redis_error`."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError("on_redis_error must be 'fail_open' or 'fail_closed', "
                             f"got {value!r}") from None


def to_seconds(value: Any, field: str, *, positive: bool = False) -> float:
    """Convert a duration (seconds or timedelta) to float seconds, or raise naming `field`.

    `positive`: 0 is refused too (a timeout, a lease).
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number of seconds or a timedelta, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} must be a finite duration >= 0 seconds, got {value!r}")
    if positive and value == 0:
        raise ValueError(f"{field} must be > 0 seconds, got {float(value)!r}")
    return float(value)


def check_redis_options(config: Any) -> None:
    """Validate a frozen config's `redis_timeout` (> 0: the socket and connect timeout of
    URL-built clients) and `redis_retry_max_backoff` (>= 0: the longest wait before Redis
    is tried again) and store them as float seconds: the same for every component."""
    put = object.__setattr__
    put(config, "redis_timeout", to_seconds(config.redis_timeout, "redis_timeout",
                                            positive=True))
    put(config, "redis_retry_max_backoff",
        to_seconds(config.redis_retry_max_backoff, "redis_retry_max_backoff"))


def to_ms(seconds: float) -> int:
    """Seconds to the integer milliseconds used inside the scripts."""
    return round(seconds * 1000)


def check_int(value: Any, field: str, low: int, high: int) -> int:
    """Validate an integer within [low, high] or raise a ValueError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{field} must be in [{low}, {high}], got {value!r}")
    return value


def check_percent(value: Any, field: str) -> float:
    """Validate a percentage threshold in (0, 100]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be a number in (0, 100], got {value!r}")
    if not 0 < value <= 100:
        raise ValueError(f"{field} must be in (0, 100], got {value!r}")
    return float(value)


def exception_types(value: Any, field: str) -> tuple[type[BaseException], ...]:
    """Exception classes from one class or an iterable; a ValueError naming `field`."""
    if isinstance(value, type):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{field} must be an exception class or a tuple of them, "
                         f"got {value!r}") from None
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ValueError(f"{field} must hold exception classes, got {item!r}")
    return items


C = TypeVar("C")


def merge_options(cls: type[C], config: C | None, overrides: dict[str, Any], what: str) -> C:
    """`config` (or `cls()`) with constructor keyword overrides, naming unknown fields clearly.

    Shared by every component's constructor (breaker, bulkhead, retry, budget, ganesha).
    """
    base = config if config is not None else cls()
    if not isinstance(base, cls):
        raise TypeError(f"config must be a {cls.__name__}, got {type(base).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown {what} option(s): {', '.join(unknown)}")
    return dataclasses.replace(base, **overrides) if overrides else base  # type: ignore[type-var]


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*")


def parse_duration(value: Any, field: str) -> float:
    """A duration written in a config file or the environment, as float seconds.

    Numbers (and timedeltas) are seconds, as everywhere in distbreaker; strings
    are a number with an optional unit: ``"500ms"``, ``"30s"``, ``"5m"``,
    ``"1h"``, ``"2.5"`` (seconds). Raises a ValueError naming `field`.
    """
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match is None:
            raise ValueError(f"{field} must be a duration such as 30, '500ms', '30s', '5m' "
                             f"or '1h', got {value!r}")
        number, unit = match.groups()
        value = float(number) * _DURATION_UNITS[unit or "s"]
    return to_seconds(value, field)
