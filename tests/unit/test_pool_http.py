"""contrib._pool_http without I/O: member addresses, the rewritten URL, verdicts."""

from __future__ import annotations

import pytest

from distbreaker import HttpClassifier
from distbreaker.contrib._pool_http import (
    FAILURE,
    GATEWAY,
    LOCAL,
    SUCCESS,
    Routes,
    Target,
    parse_member,
    rewrite,
    verdict,
)


@pytest.mark.parametrize(("address", "target"), [
    ("10.0.0.7", Target(None, "10.0.0.7", None)),
    ("10.0.0.7:8080", Target(None, "10.0.0.7", 8080)),
    ("[::1]:8443", Target(None, "::1", 8443)),
    ("https://eu.api.example.com/v1/", Target("https", "eu.api.example.com", None, "/v1")),
    ("http://h:81/deployments/gpt-4o", Target("http", "h", 81, "/deployments/gpt-4o")),
])
def test_member_addresses(address: str, target: Target) -> None:
    assert parse_member(address) == target


@pytest.mark.parametrize("bad", ["", " ", "ftp://h", "h:99999", "http://u:p@h", "h/x?q=1",
                                 "::1", "http://"])
def test_bad_member_addresses(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_member(bad)


def test_rewrite_and_netloc() -> None:
    assert rewrite("http", "/a?b=1", parse_member("https://h:8443/base")) == (
        "https", "h", 8443, "/base/a?b=1")
    assert rewrite("http", "/a", parse_member("h")) == ("http", "h", None, "/a")
    assert parse_member("[::1]:80").netloc == "[::1]:80"
    assert parse_member("h").netloc == "h"


def test_verdicts() -> None:
    assert verdict(200, {}) == (SUCCESS, None)
    assert verdict(404, {}) == (SUCCESS, None)          # the member answered
    assert verdict(500, {}) == (FAILURE, None)
    assert verdict(503, {"Retry-After": "7"}) == (GATEWAY, 7.0)
    assert verdict(504, {}) == (GATEWAY, None)
    assert verdict(429, {}) == (FAILURE, None)
    assert verdict(429, {"Retry-After": "30"}) == (FAILURE, 30.0)
    assert verdict(429, {"Retry-After": "0"}) == (FAILURE, None)
    assert verdict(409, {}, HttpClassifier({409: "transient"})) == (FAILURE, None)
    assert verdict(500, {}, HttpClassifier({500: "ok"})) == (SUCCESS, None)


class FakePool:
    def pick(self, key: object = None) -> None:
        return None


def test_routes_by_host_and_port() -> None:
    a, b = FakePool(), FakePool()
    routes = Routes({"Payments": a, "payments:8080": b})
    assert routes.pool_for("payments", None) is a
    assert routes.pool_for("PAYMENTS", 8080) is b
    assert routes.pool_for("payments", 9090) is a
    assert routes.pool_for("other", None) is None
    assert Routes(a).pool_for("anything", 1) is a
    assert routes.key_of(object()) is None
    assert Routes(a, key=lambda r: "k").key_of(object()) == "k"
    assert routes.error_outcome(KeyboardInterrupt(), (OSError,), ()) is None
    assert routes.error_outcome(ValueError(), (OSError,), (ValueError,)) is None
    assert routes.error_outcome(ConnectionError(), (OSError,), ()) == LOCAL
    assert routes.error_outcome(RuntimeError(), (OSError,), ()) == ""
    assert Routes(a, http_classifier={409: "transient"}).verdict(409, {}) == (FAILURE, None)


def test_failover_steps() -> None:
    from distbreaker.contrib._pool_http import Failover

    run = Failover(3)
    assert run.fresh("a") and not run.fresh("a")
    assert not run.answered("503 from a", FAILURE)          # attempts left: go on
    assert run.fresh("b")
    assert run.failed(ConnectionError(), LOCAL) == "next"
    assert run.fresh("c")
    assert run.failed(ConnectionError(), LOCAL) == "answer"  # a's answer beats a refusal
    assert run.result() == "503 from a"
    assert run.failed(RuntimeError(), "") == "raise"
    assert run.failed(KeyboardInterrupt(), None) == "raise"
    only = Failover(1)
    assert only.fresh("a") and only.failed(TimeoutError(), LOCAL) == "raise"
    with pytest.raises(TimeoutError):
        only.result()
    assert Failover(2).answered("ok", SUCCESS)
    assert Routes(FakePool(), failover=2).attempts("GET", True) == 3
    assert Routes(FakePool(), failover=2).attempts("POST", True) == 1
    assert Routes(FakePool(), failover=2).attempts("GET", False) == 1
    assert Routes(FakePool(), failover=2, failover_methods=None).attempts("POST", True) == 3
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError):
            Routes(FakePool(), failover=bad)  # type: ignore[arg-type]
