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

Seconds = float | int | timedelta | str

#: The longest duration any option takes: 100 years. Its milliseconds (added to the
#: server time, or to other durations) go into Redis commands as integers and through
#: Lua numbers, which print integers exactly only below 1e14; a larger value would be
#: accepted here and then make every call fail with "value is not an integer or out of
#: range".
MAX_SECONDS = 100 * 365 * 86400


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
    """A duration as float seconds, or a ValueError naming `field`: the ONE duration
    parser of keyword arguments, config files, the environment and the CLI.

    Numbers are seconds; a `timedelta`; or a string: ``"30"`` (seconds), ``"30s"``,
    ``"250ms"``, ``"1m30s"``, ``"1h 30m"``, ``"1.5h"``, ``"2d"``, or ISO 8601
    (``"PT30S"``, ``"PT1M30S"``, ``"P1DT2H"``). `positive`: 0 is refused too (a
    timeout, a lease).
    """
    if isinstance(value, str):
        value = _parse_text(value, field)
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a duration: a number of seconds, a timedelta or "
                         f"a string such as '30s', '1m30s', '250ms' or 'PT30S', got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} must be a finite duration >= 0 seconds, got {value!r}")
    if positive and value == 0:
        raise ValueError(f"{field} must be > 0 seconds, got {float(value)!r}")
    if value > MAX_SECONDS:
        raise ValueError(f"{field} must be at most {MAX_SECONDS} seconds (100 years): its "
                         f"milliseconds go into Redis commands as integers, got {value!r}")
    return float(value)


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(_NUMBER + r"\s*(ms|s|m|h|d)\s*", re.I)
_PLAIN = re.compile(r"\s*[+]?" + _NUMBER + r"\s*")
_ISO = re.compile(r"P(?:" + _NUMBER + r"W)?(?:" + _NUMBER + r"D)?(?:T(?:" + _NUMBER + r"H)?"
                  r"(?:" + _NUMBER + r"M)?(?:" + _NUMBER + r"S)?)?", re.I)
_ISO_UNITS = (604800.0, 86400.0, 3600.0, 60.0, 1.0)


def _parse_text(text: str, field: str) -> float:
    """The seconds a duration string says (see `to_seconds`)."""
    plain = _PLAIN.fullmatch(text)
    if plain:
        return float(plain.group(1))
    stripped = text.strip()
    iso = _ISO.fullmatch(stripped)
    if iso and stripped.upper() not in ("P", "PT") and not stripped.upper().endswith("T"):
        return sum(float(n) * unit for n, unit in zip(iso.groups(), _ISO_UNITS, strict=True)
                   if n is not None)
    parts = list(_PART.finditer(stripped))
    if parts and "".join(m.group(0) for m in parts).strip() == stripped:  # nothing between
        return sum(float(m.group(1)) * _UNITS[m.group(2).lower()] for m in parts)
    raise ValueError(f"{field} must be a duration such as 30 (seconds), '30s', '1m30s', "
                     f"'250ms', '1h', '2d' or ISO 8601 'PT30S', got {text!r}")


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


#: Resilience4j's names for settings distbreaker names differently (after camelCase and
#: kebab-case are read as snake_case, which covers the names both share), per component.
R4J_ALIASES: dict[str, dict[str, str]] = {
    "breaker": {"slow_call_duration_threshold": "slow_call_duration",
                "permitted_number_of_calls_in_half_open_state": "permitted_calls_in_half_open",
                "max_wait_duration_in_half_open_state": "max_wait_in_half_open",
                "record_failure_predicate": "record_predicate",
                "ignore_exception_predicate": "ignore_predicate"},
    "retry": {"wait_duration": "base", "exponential_backoff_multiplier": "multiplier",
              "exponential_max_wait_duration": "cap", "retry_exceptions": "retry_on",
              "ignore_exceptions": "ignore", "retry_exception_predicate": "retry_predicate"},
}


def snake_name(field: str) -> str:
    """camelCase and kebab-case setting names (Resilience4j's YAML and properties) as
    snake_case: ``slowCallRateThreshold`` / ``slow-call-rate-threshold`` ->
    ``slow_call_rate_threshold``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", field).replace("-", "_").lower()


def alias_of(what: str, field: str) -> str:
    """The distbreaker name of a setting given in any of the accepted spellings (its
    snake_case form, or a Resilience4j name); unknown names come back snake_cased."""
    snake = snake_name(field)
    return R4J_ALIASES.get(what, {}).get(snake, snake)


def suggest_field(what: str, field: str, known: Any) -> str | None:
    """The known setting `field` most likely means (its alias, else the closest name)."""
    import difflib

    named = alias_of(what, field)
    if named in known:
        return named
    close = difflib.get_close_matches(named, sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None


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
        hints = [f"{u} -> {m}" for u in unknown for m in [suggest_field(what, u, known)] if m]
        raise TypeError(f"unknown {what} option(s): {', '.join(unknown)}"
                        + (f" (did you mean: {', '.join(hints)}?)" if hints else ""))
    return dataclasses.replace(base, **overrides) if overrides else base  # type: ignore[type-var]


def parse_duration(value: Any, field: str) -> float:
    """`to_seconds` (kept under this name for the registry's readers)."""
    return to_seconds(value, field)
