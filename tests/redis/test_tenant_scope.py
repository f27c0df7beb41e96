"""A 429 hard stop, scoped (issue 29, item 4): a 429 without Retry-After still opens the
breaker at once, but keyed per tenant (the breaker name from a header, an API key or a
request attribute; a registry's keyed instances) one tenant's 429 never rejects another;
the HTTP classification is configurable per host; `show` names the status and the key."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from distbreaker import CallNotPermitted, HttpStatusError, Registry
from distbreaker.breaker.state import State
from distbreaker.contrib.httpx import BreakerTransport
from tests.helpers.cli import run
from tests.helpers.flaky_http import FlakyServer, ok, status

BREAKER = {"sliding_window_size": 10, "minimum_number_of_calls": 10,
           "wait_duration_in_open_state": 60}


@pytest.fixture
def server() -> Iterator[FlakyServer]:
    with FlakyServer() as flaky:
        yield flaky


@pytest.fixture
def other_server() -> Iterator[FlakyServer]:
    with FlakyServer() as flaky:
        yield flaky


def by_api_key(request: httpx.Request) -> str:
    """The per-tenant recipe: the host's breaker, one instance per API key."""
    return f"{request.url.host}:{request.url.port}:{request.headers['X-Api-Key']}"


def test_one_tenants_429_never_rejects_another(redis_url: str, server: FlakyServer) -> None:
    server.set("/a", status(429))          # tenant A has spent its quota
    server.set("/b", ok())
    transport = BreakerTransport(redis=redis_url, name=by_api_key, retry=3, breaker=BREAKER,
                                 redis_timeout=5.0)
    with httpx.Client(transport=transport) as client:
        a, b = {"X-Api-Key": "tenant-a"}, {"X-Api-Key": "tenant-b"}
        assert client.get(server.url + "/a", headers=a).status_code == 429
        assert server.count("/a") == 1                      # a hard stop: not retried
        with pytest.raises(CallNotPermitted) as rejected:
            client.get(server.url + "/a", headers=a)       # A: OPEN at once, fleet-wide
        assert rejected.value.name == f"127.0.0.1:{server.port}:tenant-a"
        for _ in range(20):
            assert client.get(server.url + "/b", headers=b).status_code == 200
        assert server.count("/b") == 20                     # B never rejected
    key = f"127.0.0.1:{server.port}:tenant-a"
    assert transport.policy(key).breaker.state is State.OPEN
    assert transport.policy(f"127.0.0.1:{server.port}:tenant-b").breaker.state is State.CLOSED
    shown = run(redis_url, "show", key).stdout
    assert f"reason:    hard stop: HTTP 429 without Retry-After (key '{key}')" in shown
    transport.close()


def test_registry_keyed_policies_scope_the_hard_stop(redis_url: str) -> None:
    registry = Registry.from_dict({"breakers": {"instances": {"llm": BREAKER}},
                                   "policies": {"instances": {"llm": {"breaker": "llm"}}}},
                                  redis=redis_url, environ={})

    def spent() -> None:
        raise HttpStatusError(429)

    with pytest.raises(HttpStatusError):
        registry.policy("llm", key="tenant-a").call(spent)
    with pytest.raises(CallNotPermitted):
        registry.policy("llm", key="tenant-a").call(lambda: "never")
    assert [registry.policy("llm", key="tenant-b").call(lambda: "served")
            for _ in range(5)] == ["served"] * 5
    assert registry.breaker("llm", key="tenant-b").state is State.CLOSED
    registry.close()


def test_the_classification_is_configurable_per_host(redis_url: str, server: FlakyServer,
                                                     other_server: FlakyServer) -> None:
    for upstream in (server, other_server):
        upstream.set("/quota", status(429))
        upstream.set("/spent", status(503, retry_after=120))
    lenient = f"127.0.0.1:{server.port}"       # its 429s are per-request rate limits
    table = {lenient: {429: "transient"}, "*": {503: "hard_stop"}}
    transport = BreakerTransport(redis=redis_url, retry={"max_attempts": 2, "base": 0,
                                                         "cap": 0},
                                 breaker=BREAKER, http_classifier=table, redis_timeout=5.0)
    with httpx.Client(transport=transport) as client:
        assert client.get(server.url + "/quota").status_code == 429
        assert server.count("/quota") == 2                  # transient there: retried
        assert transport.policy(lenient).breaker.state is State.CLOSED
        assert client.get(other_server.url + "/quota").status_code == 429
        assert other_server.count("/quota") == 1            # the default: a hard stop
        strict = f"127.0.0.1:{other_server.port}"
        assert transport.policy(strict).breaker.state is State.OPEN
        transport.policy(strict).breaker.reset()
        assert client.get(other_server.url + "/spent").status_code == 503
        with pytest.raises(CallNotPermitted) as held:       # OPEN for its Retry-After
            client.get(other_server.url + "/spent")
        assert 100 < held.value.retry_after <= 120
    assert "HTTP 503 with Retry-After 120s" in run(redis_url, "show", strict).stdout
    transport.close()
