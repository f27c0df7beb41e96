"""HTTP classification, Retry-After parsing, and the exception classifier kept intact."""

from __future__ import annotations

import email.utils
from datetime import timedelta
from types import SimpleNamespace

import pytest

from distbreaker._runtime.classify import (
    HttpClassifier,
    HttpStatusError,
    HttpVerdict,
    Outcome,
    classify_exception,
    classify_http,
    parse_retry_after,
    retry_after_of,
    status_of,
)
from distbreaker.breaker.config import BreakerConfig


@pytest.mark.parametrize("status", [100, 200, 204, 301, 304, 399])
def test_informational_success_and_redirects_are_ok(status: int) -> None:
    assert classify_http(status) is HttpVerdict.OK


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 428, 430, 451, 499])
def test_4xx_except_429_are_client_errors(status: int) -> None:
    assert classify_http(status, {"Retry-After": "5"}) is HttpVerdict.CLIENT_ERROR


def test_429_without_retry_after_is_a_hard_stop() -> None:
    assert classify_http(429) is HttpVerdict.HARD_STOP
    assert classify_http(429, {"X-Other": "1"}) is HttpVerdict.HARD_STOP
    assert classify_http(429, {"Retry-After": "soon"}) is HttpVerdict.HARD_STOP


def test_429_with_retry_after_is_transient_in_any_header_form() -> None:
    assert classify_http(429, {"Retry-After": "5"}) is HttpVerdict.TRANSIENT
    assert classify_http(429, [("retry-after", "5")]) is HttpVerdict.TRANSIENT
    assert classify_http(429, {"RETRY-AFTER": "Wed, 21 Oct 2015 07:28:00 GMT"}) \
        is HttpVerdict.TRANSIENT
    assert classify_http(429, [(b"Retry-After", b"1")]) is HttpVerdict.TRANSIENT


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599])
def test_5xx_are_transient(status: int) -> None:
    assert classify_http(status) is HttpVerdict.TRANSIENT


@pytest.mark.parametrize("status", [99, 600, -1, True, "503", 503.0])
def test_invalid_status_is_refused(status: object) -> None:
    with pytest.raises(ValueError, match="status"):
        classify_http(status)  # type: ignore[arg-type]


def test_parse_retry_after_seconds() -> None:
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 3.5 ") == 3.5
    assert parse_retry_after(b"7") == 7.0
    assert parse_retry_after(2) == 2.0
    assert parse_retry_after(timedelta(seconds=4)) == 4.0
    assert parse_retry_after("-5") == 0.0


def test_parse_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    future = email.utils.formatdate(now + 30, usegmt=True)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(future, now=now) == pytest.approx(30.0)
    assert parse_retry_after(past, now=now) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "nan", "inf", float("nan"), True])
def test_parse_retry_after_garbage_is_none(value: object) -> None:
    assert parse_retry_after(value) is None


def test_overrides_per_dependency() -> None:
    classifier = HttpClassifier({409: "transient", 503: HttpVerdict.CLIENT_ERROR})
    assert classifier.classify(409) is HttpVerdict.TRANSIENT
    assert classifier.classify(503) is HttpVerdict.CLIENT_ERROR
    assert classifier.classify(404) is HttpVerdict.CLIENT_ERROR   # untouched statuses
    assert classifier.classify(502) is HttpVerdict.TRANSIENT
    with pytest.raises(ValueError, match=r"overrides\[409\]"):
        HttpClassifier({409: "maybe"})
    with pytest.raises(ValueError, match="status"):
        HttpClassifier({700: "ok"})


def test_errors_carrying_a_status_in_library_styles() -> None:
    httpx_like = Exception("x")
    httpx_like.response = SimpleNamespace(  # type: ignore[attr-defined]
        status_code=429, headers={"Retry-After": "2"})
    aiohttp_like = Exception("y")
    aiohttp_like.status = 404  # type: ignore[attr-defined]
    aiohttp_like.headers = {}  # type: ignore[attr-defined]
    classifier = HttpClassifier()
    assert status_of(httpx_like) == 429
    assert classifier.classify_error(httpx_like) is HttpVerdict.TRANSIENT
    assert retry_after_of(httpx_like) == 2.0
    assert classifier.classify_error(aiohttp_like) is HttpVerdict.CLIENT_ERROR
    assert classifier.classify_error(ValueError("no status")) is None


def test_http_status_error_with_retry_after_attribute_makes_429_transient() -> None:
    assert HttpClassifier().classify_error(HttpStatusError(429)) is HttpVerdict.HARD_STOP
    error = HttpStatusError(429, retry_after=1.5)
    assert HttpClassifier().classify_error(error) is HttpVerdict.TRANSIENT
    assert HttpStatusError(503, {"Retry-After": "4"}).retry_after == 4.0


def test_classify_exception_is_unchanged() -> None:
    config = BreakerConfig(ignore_exceptions=(KeyError,))
    assert classify_exception(config, ValueError()) is Outcome.FAILURE
    assert classify_exception(config, KeyError()) is Outcome.IGNORED
    assert classify_exception(config, KeyboardInterrupt()) is Outcome.IGNORED
