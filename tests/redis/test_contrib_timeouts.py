"""`timeout=` in the HTTP integrations, against a real redis-server and a local HTTP
server: requests and httpx pass it to the HTTP client (for requests that carry none),
the asyncio httpx transport and the aiohttp middleware also cancel a late attempt."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
import requests

from distbreaker.contrib.aiohttp import BreakerMiddleware
from distbreaker.contrib.httpx import AsyncBreakerTransport, BreakerTransport
from distbreaker.contrib.requests import BreakerAdapter
from distbreaker.policy.core import AttemptTimeout
from tests.helpers.flaky_http import FlakyServer, slow

BREAKER = {"minimum_number_of_calls": 10}


@pytest.fixture
def server() -> Iterator[FlakyServer]:
    with FlakyServer() as flaky:
        flaky.set("/slow", slow(2.0))  # 20x the timeouts under test: late timers still fire first
        yield flaky


def host(server: FlakyServer) -> str:
    return f"127.0.0.1:{server.port}"


def test_requests_adapter_default_timeout(server: FlakyServer, redis_url: str) -> None:
    adapter = BreakerAdapter(redis=redis_url, breaker=BREAKER, timeout=0.1)
    with requests.Session() as session:
        session.mount("http://", adapter)
        with pytest.raises(requests.exceptions.Timeout):
            session.get(server.url + "/slow")          # no timeout given: the adapter's
        assert session.get(server.url + "/slow", timeout=30).status_code == 200  # given wins
    metrics = adapter.policy(host(server)).breaker.metrics()
    assert (metrics.calls, metrics.failed) == (2, 1)
    with pytest.raises(ValueError, match="timeout"):
        BreakerAdapter(redis=redis_url, timeout=-1)


def test_httpx_transport_timeout_for_requests_without_one(server: FlakyServer,
                                                          redis_url: str) -> None:
    transport = BreakerTransport(redis=redis_url, breaker=BREAKER, timeout=0.1)
    with httpx.Client(transport=transport, timeout=None) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.get(server.url + "/slow")
        assert client.get(server.url + "/slow", timeout=30).status_code == 200
    metrics = transport.policy(host(server)).breaker.metrics()
    assert (metrics.calls, metrics.failed) == (2, 1)


def test_async_httpx_attempt_timeout_cancels(server: FlakyServer, redis_url: str) -> None:
    async def scenario() -> tuple[int, int]:
        transport = AsyncBreakerTransport(redis=redis_url, breaker=BREAKER,
                                          attempt_timeout=0.1)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            with pytest.raises(AttemptTimeout):
                await client.get(server.url + "/slow")
            metrics = await transport.policy(host(server)).breaker.metrics()
        return metrics.calls, metrics.failed

    assert asyncio.run(scenario()) == (1, 1)


def test_aiohttp_middleware_timeout_cancels(server: FlakyServer, redis_url: str) -> None:
    async def scenario() -> tuple[int, int]:
        middleware = BreakerMiddleware(redis=redis_url, breaker=BREAKER, timeout=0.1)
        async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
            with pytest.raises(TimeoutError):
                async with session.get(server.url + "/slow"):
                    pass
            metrics = await middleware.policy(host(server)).breaker.metrics()
        await middleware.aclose()
        return metrics.calls, metrics.failed

    assert asyncio.run(scenario()) == (1, 1)


def test_a_factory_and_a_timeout_do_not_mix(redis_url: str) -> None:
    with pytest.raises(TypeError, match="timeout"):
        BreakerMiddleware(factory=lambda name: None, timeout=1)
