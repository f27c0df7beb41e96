"""Outcome classification of exceptions, in Resilience4j's order, and of HTTP statuses.

Shared machinery: the breaker counts outcomes with it, the retry and the adaptive
bulkhead read statuses and Retry-After with it, so it belongs to no one component.
The public names are exported by `distbreaker` and `distbreaker.aio`.
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import timedelta, timezone
from enum import Enum
from types import MappingProxyType
from typing import Any, Protocol

logger = logging.getLogger("distbreaker")


class Outcome(str, Enum):
    """How one finished call counts in the window."""

    SUCCESS = "success"
    FAILURE = "failure"
    IGNORED = "ignored"


class OutcomeRules(Protocol):
    """The exception and result rules of a breaker's config (`BreakerConfig`)."""

    @property
    def record_exceptions(self) -> tuple[type[BaseException], ...]: ...
    @property
    def ignore_exceptions(self) -> tuple[type[BaseException], ...]: ...
    @property
    def record_predicate(self) -> Callable[[BaseException], bool] | None: ...
    @property
    def ignore_predicate(self) -> Callable[[BaseException], bool] | None: ...
    @property
    def record_result(self) -> Callable[[Any], bool] | None: ...


class ResultRecordedAsFailure(Exception):
    """The `error` of the event of a call whose returned value `record_result` counted
    as a failure (Resilience4j's ResultRecordedAsFailureException); never raised."""

    def __init__(self, name: str, result: Any = None) -> None:
        self.name = name
        self.result = result
        super().__init__(f"circuit breaker {name!r}: result recorded as a failure")


def classify_exception(config: OutcomeRules, exc: BaseException) -> Outcome:
    """Ignore wins; then record_exceptions / record_predicate; not recorded => success.

    Exceptions that are not `Exception` (KeyboardInterrupt, asyncio's
    CancelledError, SystemExit) say nothing about the dependency: ignored.
    """
    if not isinstance(exc, Exception):
        return Outcome.IGNORED
    if isinstance(exc, config.ignore_exceptions) or (
            config.ignore_predicate is not None and config.ignore_predicate(exc)):
        return Outcome.IGNORED
    if config.record_exceptions:
        recorded = isinstance(exc, config.record_exceptions) or (
            config.record_predicate is not None and bool(config.record_predicate(exc)))
    elif config.record_predicate is not None:
        recorded = bool(config.record_predicate(exc))
    else:
        recorded = True
    return Outcome.FAILURE if recorded else Outcome.SUCCESS


# -- HTTP ------------------------------------------------------------------------


class HttpVerdict(str, Enum):
    """What an HTTP status says about the dependency.

    OK: fine. CLIENT_ERROR: the request is wrong (never retried, never a
    breaker failure, not hidden by a fallback). HARD_STOP: 429 without a
    Retry-After (stop calling: open the breaker). TRANSIENT: worth retrying
    (5xx, 429 with a Retry-After).
    """

    OK = "ok"
    CLIENT_ERROR = "client_error"
    HARD_STOP = "hard_stop"
    TRANSIENT = "transient"


def _header(headers: Any, name: str) -> Any:
    """`name` from a mapping (any case) or a list of pairs; None when absent."""
    if headers is None:
        return None
    getter = getattr(headers, "get", None)
    if getter is not None:
        value = getter(name)
        if value is not None:
            return value
        items = headers.items() if hasattr(headers, "items") else ()
    else:
        items = headers
    wanted = name.lower()
    for key, value in items:
        key = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        if key.lower() == wanted:
            return value
    return None


def parse_retry_after(value: Any, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: delay-seconds or an HTTP date.

    `now` is the wall clock (epoch seconds) an HTTP date is measured from
    (default `time.time()`). Past dates give 0.0; garbage gives None.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)):
        return max(0.0, float(value)) if math.isfinite(value) else None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = str(value).strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def classify_http(status: int, headers: Any = None) -> HttpVerdict:
    """1xx-3xx ok; 400-428 and 430-499 client_error; 429 hard_stop, or transient
    with a usable Retry-After; 5xx transient."""
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"status must be an HTTP status code in [100, 599], got {status!r}")
    if status < 400:
        return HttpVerdict.OK
    if status == 429:
        usable = parse_retry_after(_header(headers, "Retry-After")) is not None
        return HttpVerdict.TRANSIENT if usable else HttpVerdict.HARD_STOP
    if status < 500:
        return HttpVerdict.CLIENT_ERROR
    return HttpVerdict.TRANSIENT


class HttpStatusError(Exception):
    """An HTTP error response as an exception, for code that has no client library's own.

    `retry_after` (seconds) is parsed from the headers when not given.
    """

    def __init__(self, status: int, headers: Any = None, message: str = "",
                 retry_after: float | None = None) -> None:
        self.status_code = status
        self.headers = dict(headers or {})
        self.retry_after = (retry_after if retry_after is not None
                            else parse_retry_after(_header(self.headers, "Retry-After")))
        super().__init__(message or f"HTTP {status}")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (httpx, requests, aiohttp, urllib styles)."""
    for holder in (exc, getattr(exc, "response", None)):
        if holder is None:
            continue
        for attr in ("status_code", "status"):
            value = getattr(holder, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def headers_of(exc: BaseException) -> Any:
    """The response headers an exception carries, or None."""
    headers = getattr(exc, "headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    return headers


def retry_after_of(exc: BaseException, now: float | None = None) -> float | None:
    """Seconds the error asks to wait: its `retry_after` attribute, else a Retry-After header."""
    value = parse_retry_after(getattr(exc, "retry_after", None), now)
    if value is not None:
        return value
    return parse_retry_after(_header(headers_of(exc), "Retry-After"), now)


class HttpClassifier:
    """`classify_http` with per-dependency overrides, e.g. ``{409: "transient"}``."""

    def __init__(self, overrides: Mapping[int, HttpVerdict | str] | None = None) -> None:
        table: dict[int, HttpVerdict] = {}
        for status, verdict in (overrides or {}).items():
            classify_http(status)  # validates the status
            try:
                table[status] = HttpVerdict(verdict)
            except ValueError:
                raise ValueError(f"overrides[{status}] must be one of "
                                 f"{[v.value for v in HttpVerdict]}, got {verdict!r}") from None
        self.overrides: Mapping[int, HttpVerdict] = MappingProxyType(table)

    def classify(self, status: int, headers: Any = None) -> HttpVerdict:
        verdict = self.overrides.get(status)
        return verdict if verdict is not None else classify_http(status, headers)

    def classify_error(self, exc: BaseException) -> HttpVerdict | None:
        """The verdict for an exception carrying an HTTP status, else None.

        A `retry_after` attribute counts as a Retry-After header (for 429).
        """
        status = status_of(exc)
        if status is None:
            return None
        headers = headers_of(exc)
        if status == 429 and parse_retry_after(_header(headers, "Retry-After")) is None:
            seconds = parse_retry_after(getattr(exc, "retry_after", None))
            if seconds is not None:
                headers = {"Retry-After": str(seconds)}
        return self.classify(status, headers)

    def __repr__(self) -> str:
        return f"HttpClassifier({dict(self.overrides)!r})"


DEFAULT_HTTP_CLASSIFIER = HttpClassifier()


def classify_result(config: OutcomeRules, result: Any) -> Outcome:
    """How a returned value counts: FAILURE when `record_result` says so, else SUCCESS.

    As in Resilience4j, None is never tested. A predicate that raises is a bug in
    the predicate, not news about the dependency: logged, and the call is a success.
    """
    predicate = config.record_result
    if predicate is None or result is None:
        return Outcome.SUCCESS
    try:
        recorded = bool(predicate(result))
    except Exception:
        logger.exception("record_result predicate %r failed on %r", predicate, result)
        return Outcome.SUCCESS
    return Outcome.FAILURE if recorded else Outcome.SUCCESS
