"""contrib.httpx (sync and async) and contrib.requests against a local flaky HTTP server
and a real redis-server: every behaviour is checked through all three clients, with
the hits counted on the server side."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import requests

from distbreaker import HttpStatusError, Policy
from distbreaker.breaker.core import Metrics
from distbreaker.breaker.state import State
from distbreaker.contrib._http import (
    Exchange,
    PolicyRegistry,
    Protection,
    host_name,
    rejection_headers,
    retry_spec,
)
from distbreaker.contrib.httpx import AsyncBreakerTransport, BreakerTransport
from distbreaker.contrib.requests import BreakerAdapter, protect
from distbreaker.errors import CallNotPermitted
from tests.helpers.flaky_http import FlakyServer, ok, reset, slow, status, trickle

# 4 calls decide; half of them failing opens the breaker.
BREAKER = {"sliding_window_size": 4, "minimum_number_of_calls": 4, "failure_rate_threshold": 50,
           "wait_duration_in_open_state": 60, "permitted_calls_in_half_open": 2}
NO_BACKOFF = {"base": 0.0, "cap": 0.0}


class Driver:
    """One client flavour behind one interface: get, stream, breaker metrics."""

    timeout_error: type[BaseException]
    connection_error: type[BaseException]

    def get(self, url: str, timeout: float = 5.0, method: str = "GET") -> Any:
        raise NotImplementedError

    def stream(self, url: str, at_status: Callable[[], Any]) -> tuple[int, Any, int]:
        """(status, what `at_status()` said once the status was known, body length)."""
        raise NotImplementedError

    def metrics(self, name: str) -> Metrics:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SyncHttpx(Driver):
    timeout_error = httpx.TimeoutException
    connection_error = httpx.TransportError

    def __init__(self, **options: Any) -> None:
        self.transport = BreakerTransport(**options)
        self.client = httpx.Client(transport=self.transport)

    def get(self, url: str, timeout: float = 5.0, method: str = "GET") -> Any:
        return self.client.request(method, url, timeout=timeout)

    def stream(self, url: str, at_status: Callable[[], Any]) -> tuple[int, Any, int]:
        with self.client.stream("GET", url) as response:
            seen = at_status()
            return response.status_code, seen, len(response.read())

    def metrics(self, name: str) -> Metrics:
        return self.transport.policy(name).breaker.metrics()

    def close(self) -> None:
        self.client.close()


class AsyncHttpx(Driver):
    timeout_error = httpx.TimeoutException
    connection_error = httpx.TransportError

    def __init__(self, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.transport = AsyncBreakerTransport(**options)
        self.client = httpx.AsyncClient(transport=self.transport)

    def get(self, url: str, timeout: float = 5.0, method: str = "GET") -> Any:
        return self.loop.run_until_complete(self.client.request(method, url, timeout=timeout))

    def stream(self, url: str, at_status: Callable[[], Any]) -> tuple[int, Any, int]:
        async def run() -> tuple[int, Any, int]:
            async with self.client.stream("GET", url) as response:
                seen = at_status()
                return response.status_code, seen, len(await response.aread())

        return self.loop.run_until_complete(run())

    def metrics(self, name: str) -> Metrics:
        return self.loop.run_until_complete(self.transport.policy(name).breaker.metrics())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


class Requests(Driver):
    timeout_error = requests.Timeout
    connection_error = requests.ConnectionError

    def __init__(self, **options: Any) -> None:
        self.session = requests.Session()
        self.adapter = protect(self.session, **options)

    def get(self, url: str, timeout: float = 5.0, method: str = "GET") -> Any:
        return self.session.request(method, url, timeout=timeout)

    def stream(self, url: str, at_status: Callable[[], Any]) -> tuple[int, Any, int]:
        with self.session.get(url, stream=True, timeout=5.0) as response:
            seen = at_status()
            return response.status_code, seen, len(response.content)

    def metrics(self, name: str) -> Metrics:
        return self.adapter.policy(name).breaker.metrics()

    def close(self) -> None:
        self.session.close()


DRIVERS = {"httpx": SyncHttpx, "httpx-async": AsyncHttpx, "requests": Requests}
Make = Callable[..., Driver]


@pytest.fixture(params=sorted(DRIVERS))
def make(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Make]:
    made: list[Driver] = []

    def build(**options: Any) -> Driver:
        # A generous Redis timeout: a connect slower than the 0.25 s default on a busy CI
        # machine would fail open and leave the breaker's metrics empty (seen once in CI).
        options.setdefault("redis_timeout", 5.0)
        driver = DRIVERS[request.param](redis=redis_url, **options)
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


@pytest.fixture
def server() -> Iterator[FlakyServer]:
    with FlakyServer() as flaky:
        yield flaky


@pytest.fixture
def other_server() -> Iterator[FlakyServer]:
    with FlakyServer() as flaky:
        yield flaky


def host(server: FlakyServer) -> str:
    return f"127.0.0.1:{server.port}"


def rejected(driver: Driver, url: str) -> CallNotPermitted:
    with pytest.raises(CallNotPermitted) as caught:
        driver.get(url)
    return caught.value


# -- through each client ------------------------------------------------------------------


def test_failing_upstream_trips_and_then_is_not_called(make: Make, server: FlakyServer) -> None:
    server.set(None, status(503))
    client = make(breaker=BREAKER)
    for _ in range(4):
        assert client.get(server.url + "/pay").status_code == 503  # a response, as without us
    assert server.count() == 4
    assert client.metrics(host(server)).state is State.OPEN
    for _ in range(6):
        error = rejected(client, server.url + "/pay")
        assert error.name == host(server) and error.retry_after > 50
    assert server.count() == 4  # the rejected requests never reached the upstream


def test_client_errors_are_returned_never_retried_nor_counted(make: Make,
                                                             server: FlakyServer) -> None:
    server.set("/bad", status(400))
    server.set("/missing", status(404))
    client = make(breaker=BREAKER, retry={"max_attempts": 3, **NO_BACKOFF})
    for _ in range(5):
        assert client.get(server.url + "/bad").status_code == 400
        assert client.get(server.url + "/missing").status_code == 404
    assert server.count() == 10  # no retry
    metrics = client.metrics(host(server))
    assert (metrics.state, metrics.calls, metrics.failed) == (State.CLOSED, 0, 0)
    assert client.get(server.url + "/ok").status_code == 200


def test_429_without_retry_after_trips_at_once(make: Make, server: FlakyServer) -> None:
    server.set(None, status(429))
    client = make(breaker=BREAKER, retry={"max_attempts": 3, **NO_BACKOFF})
    response = client.get(server.url + "/llm")
    assert response.status_code == 429 and server.count() == 1  # returned, not retried
    assert client.metrics(host(server)).state is State.OPEN
    rejected(client, server.url + "/llm")
    assert server.count() == 1


def test_503_with_retry_after_is_retried_after_the_advised_delay(make: Make,
                                                                  server: FlakyServer) -> None:
    server.script("/ra", [status(503, retry_after=1)], then=ok())
    client = make(breaker=BREAKER, retry={"max_attempts": 3, **NO_BACKOFF})
    started = time.monotonic()
    response = client.get(server.url + "/ra")
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    first, second = server.hits["/ra"]
    assert 0.95 <= second - first <= 10.0, second - first  # Retry-After: 1, not the 0 s backoff
    assert elapsed >= 0.95


def test_exhausted_retries_return_the_last_response_and_post_is_not_retried(
        make: Make, server: FlakyServer) -> None:
    server.set("/down", status(503, retry_after=0))
    server.set("/busy", status(429, retry_after=0))
    client = make(breaker={**BREAKER, "sliding_window_size": 20, "minimum_number_of_calls": 20},
                  retry={"max_attempts": 3, **NO_BACKOFF})
    response = client.get(server.url + "/down")
    assert response.status_code == 503 and response.headers["Retry-After"] == "0"
    assert server.count("/down") == 3
    assert response.text.startswith("503 /down")  # the body is readable as usual
    assert client.get(server.url + "/busy").status_code == 429  # 429 + Retry-After: transient
    assert server.count("/busy") == 3
    assert client.get(server.url + "/down", method="POST").status_code == 503
    assert server.count("/down") == 4  # POST is not idempotent: one attempt
    assert client.get(server.url + "/down", method="PUT").status_code == 503
    assert server.count("/down") == 7
    assert client.metrics(host(server)).failed == 10  # every attempt counted


def test_retry_budget_caps_retries_across_requests(make: Make, server: FlakyServer) -> None:
    server.set(None, status(503))
    client = make(breaker={**BREAKER, "sliding_window_size": 100, "minimum_number_of_calls": 100},
                  retry={"max_attempts": 3, **NO_BACKOFF},
                  budget={"percent_can_retry": 0.2, "min_retries_per_sec": 0})
    for _ in range(20):
        assert client.get(server.url + "/x").status_code == 503  # the budget's "no": returned
    assert 21 <= server.count() <= 25, server.count()  # ~20% retried; 60 hits without


def test_errors_of_our_own_side_are_neither_counted_nor_retried(redis_url: str,
                                                                 server: FlakyServer) -> None:
    transport = BreakerTransport(redis=redis_url, breaker=BREAKER, retry=3)
    with httpx.Client(transport=transport) as client:
        for _ in range(5):
            with pytest.raises(httpx.UnsupportedProtocol):
                client.get(f"ftp://127.0.0.1:{server.port}/file")
        metrics = transport.policy(host(server)).breaker.metrics()
        assert (metrics.state, metrics.calls) == (State.CLOSED, 0)


def test_breaker_opening_mid_retry_returns_the_last_real_response(make: Make,
                                                                  server: FlakyServer) -> None:
    server.set(None, status(503))
    client = make(breaker={**BREAKER, "sliding_window_size": 2, "minimum_number_of_calls": 2},
                  retry={"max_attempts": 5, **NO_BACKOFF})
    assert client.get(server.url + "/x").status_code == 503
    assert server.count() == 2  # the third attempt was rejected by the now OPEN breaker
    rejected(client, server.url + "/x")


def test_timeouts_count_as_failures(make: Make, server: FlakyServer) -> None:
    server.set("/slow", slow(1.5))
    client = make(breaker=BREAKER)
    for _ in range(4):
        with pytest.raises(client.timeout_error):
            client.get(server.url + "/slow", timeout=0.2)
    assert server.wait_for(4) == 4
    assert client.metrics(host(server)).state is State.OPEN
    rejected(client, server.url + "/slow")
    time.sleep(0.1)
    assert server.count() == 4


def test_connection_reset_is_a_retried_failure(make: Make, server: FlakyServer) -> None:
    server.set("/reset", reset())
    client = make(breaker=BREAKER, retry={"max_attempts": 2, **NO_BACKOFF})
    with pytest.raises(client.connection_error):
        client.get(server.url + "/reset")
    assert server.count() == 2
    assert client.metrics(host(server)).failed == 2


def test_recovery_through_half_open_probes(make: Make, server: FlakyServer) -> None:
    server.set(None, status(503))
    client = make(breaker={**BREAKER, "wait_duration_in_open_state": 1.5})
    for _ in range(4):
        client.get(server.url + "/svc")
    server.set(None, ok())
    rejected(client, server.url + "/svc")
    time.sleep(1.6)
    assert client.get(server.url + "/svc").status_code == 200  # probe 1 of 2
    assert client.metrics(host(server)).state is State.HALF_OPEN
    assert client.get(server.url + "/svc").status_code == 200  # probe 2: closes
    assert client.metrics(host(server)).state is State.CLOSED
    for _ in range(5):
        assert client.get(server.url + "/svc").status_code == 200
    assert server.count() == 4 + 2 + 5


def test_each_host_has_its_own_breaker(make: Make, server: FlakyServer,
                                       other_server: FlakyServer) -> None:
    server.set(None, status(503))
    client = make(breaker=BREAKER)
    for _ in range(4):
        client.get(server.url + "/a")
    for _ in range(5):
        assert client.get(other_server.url + "/b").status_code == 200
    rejected(client, server.url + "/a")
    assert client.metrics(host(server)).state is State.OPEN
    assert client.metrics(host(other_server)).state is State.CLOSED
    assert (server.count(), other_server.count()) == (4, 5)


def test_a_given_name_shares_one_breaker_across_hosts(make: Make, server: FlakyServer,
                                                       other_server: FlakyServer) -> None:
    server.set(None, status(429))
    client = make(breaker=BREAKER, name="payments")
    assert client.get(server.url + "/a").status_code == 429
    error = rejected(client, other_server.url + "/b")
    assert error.name == "payments" and other_server.count() == 0


def test_rejection_as_a_synthetic_503(make: Make, server: FlakyServer) -> None:
    server.set(None, status(429))
    client = make(breaker=BREAKER, reject_as_response=True)
    assert client.get(server.url + "/a").status_code == 429
    response = client.get(server.url + "/a")
    assert response.status_code == 503 and server.count() == 1
    assert response.headers["Retry-After"] == "60"
    assert response.headers["X-Distbreaker-Rejected"] == "circuit-open"
    assert "is OPEN" in response.text


def test_streamed_bodies_are_not_read_by_the_policy(make: Make, server: FlakyServer) -> None:
    server.set("/big", trickle(1.0))  # status at once, the rest of the body 1 s later
    client = make(breaker=BREAKER, retry={"max_attempts": 3, **NO_BACKOFF})
    code, answered, length = client.stream(server.url + "/big",
                                           lambda: server.answered["/big"])
    assert code == 200 and length == 1000
    assert answered == 0  # the status reached the caller before the body was even sent


# -- the shared pure part and the options --------------------------------------------------


@pytest.mark.parametrize(("parts", "expected"), [
    (("Api.Example.com", None, "https"), "api.example.com"),
    (("api.example.com", 443, "https"), "api.example.com"),
    (("api.example.com", 80, "https"), "api.example.com:80"),
    (("api.example.com.", 8443, "https"), "api.example.com:8443"),
    (("::1", 8080, "http"), "[::1]:8080"),
    (("we{ird} host", None, "http"), "we_ird__host"),
])
def test_host_name(parts: tuple[str, int | None, str], expected: str) -> None:
    assert host_name(*parts) == expected


def test_retry_option_shorthands() -> None:
    spec = retry_spec(3, (OSError,), (ValueError,))
    assert spec["max_attempts"] == 3
    assert spec["retry_on"] == (OSError, HttpStatusError)
    assert ValueError in spec["ignore"] and CallNotPermitted in spec["ignore"]
    assert retry_spec(None, (), ()) is None and retry_spec(True, (), ())["retry_on"]
    mine = {"max_attempts": 2, "retry_on": (KeyError,)}
    assert retry_spec(mine, (OSError,), ())["retry_on"] == (KeyError,)


def test_factory_and_options_are_exclusive(redis_url: str) -> None:
    with pytest.raises(TypeError, match="either factory or policy options"):
        BreakerTransport(redis=redis_url, factory=lambda n: Policy(n, redis_url))
    with pytest.raises(ValueError):
        BreakerAdapter(name="has space")


def test_a_factory_builds_one_policy_per_name(redis_url: str, server: FlakyServer) -> None:
    built: list[str] = []

    def factory(name: str) -> Policy:
        built.append(name)
        return Policy(name, redis_url, breaker=BREAKER)

    with httpx.Client(transport=BreakerTransport(factory=factory)) as client:
        for _ in range(3):
            client.get(server.url + "/a")
    assert built == [host(server)]
    registry = PolicyRegistry(lambda n: Policy("other", redis_url))
    with pytest.raises(ValueError, match="built a policy named"):
        registry.get("mine")


def test_callable_name_and_registry_without_retry_twin(redis_url: str,
                                                        server: FlakyServer) -> None:
    protection = Protection(
        Policy, lambda r, t: r, redis_url, name=lambda request: f"tenant-{request}",
        factory=None, breaker=True, bulkhead=None, retry=2, budget=None, http_classifier=None,
        prefix="distbreaker", redis_timeout=0.25, retry_methods=["get"],
        reject_as_response=False, transient=(OSError,), local=())
    assert protection.name_of("7", "h", None, "http") == "tenant-7"
    get = protection.policy("n", "GET")
    post = protection.policy("n", "POST")
    assert get.retry is not None and post.retry is None
    assert post.breaker is get.breaker and protection.policy("n", "POST") is post
    assert protection.policy("n", "GET", replayable=False) is post


def test_exchange_and_rejection_headers() -> None:
    exchange = Exchange()
    first = exchange.received("r1")
    assert exchange.superseded() == first and exchange.last is None
    exchange.received("r2")
    final = HttpStatusError(503)
    final.response = "r2"  # type: ignore[attr-defined]
    assert exchange.settle(final) == ("r2", None)
    assert exchange.settle(CallNotPermitted("n", "OPEN", 3.2)) == ("r2", None)
    assert exchange.settle(OSError("reset")) == (None, "r2")
    headers = rejection_headers(CallNotPermitted("n", "OPEN", 3.2))
    assert headers["Retry-After"] == "4" and headers["X-Distbreaker-Rejected"] == "circuit-open"
