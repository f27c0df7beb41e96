"""distbreaker.contrib.aiohttp with aiohttp's own test server and client."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from distbreaker import BulkheadFull, CallNotPermitted
from distbreaker.aio import State
from distbreaker.contrib.aiohttp import BreakerMiddleware

RETRY = {"max_attempts": 3, "base": 0.001, "cap": 0.001}
BREAKER = {"sliding_window_size": 6, "minimum_number_of_calls": 6,
           "wait_duration_in_open_state": 30}


def _upstream(hits: Counter[str]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        hits[f"{request.method} {request.path}"] += 1
        status = {"/ok": 200, "/fail": 500, "/missing": 404, "/limited": 429}[request.path]
        return web.Response(status=status, text=request.path)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def _run(redis_url: str, body: Callable[[TestClient, BreakerMiddleware, Counter[str]],
                                        Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        hits: Counter[str] = Counter()
        middleware = BreakerMiddleware(redis=redis_url, **options)
        async with TestClient(TestServer(_upstream(hits)), middlewares=(middleware,)) as client:
            try:
                return await body(client, middleware, hits)
            finally:
                await middleware.aclose()

    return asyncio.run(main())


def test_5xx_is_retried_then_returned_and_the_breaker_opens(redis_url: str) -> None:
    async def body(client: TestClient, middleware: BreakerMiddleware,
                   hits: Counter[str]) -> None:
        response = await client.get("/fail")
        assert response.status == 500          # the last real response, as without us
        assert await response.text() == "/fail"
        assert hits["GET /fail"] == 3
        response = await client.get("/fail")
        assert hits["GET /fail"] == 6          # six failures: the window is full, OPEN
        breaker = middleware.policy(f"127.0.0.1:{client.port}").breaker
        assert await breaker.get_state() is State.OPEN
        with pytest.raises(CallNotPermitted):
            await client.get("/ok")
        assert hits["GET /ok"] == 0

    _run(redis_url, body, retry=RETRY, breaker=BREAKER)


def test_4xx_untouched_429_opens_post_not_retried(redis_url: str) -> None:
    async def body(client: TestClient, middleware: BreakerMiddleware,
                   hits: Counter[str]) -> None:
        assert (await client.get("/missing")).status == 404
        assert hits["GET /missing"] == 1
        breaker = middleware.policy("upstream").breaker
        assert (await breaker.metrics()).calls == 0       # 4xx: not counted
        assert (await client.post("/fail", data=b"charge")).status == 500
        assert hits["POST /fail"] == 1                   # not idempotent: never retried
        assert (await client.get("/limited")).status == 429
        assert await breaker.get_state() is State.OPEN   # 429 without Retry-After: hard stop

    _run(redis_url, body, name="upstream", retry=RETRY, breaker=BREAKER)


def test_a_full_bulkhead_rejects_and_connection_errors_are_failures(redis_url: str) -> None:
    async def body(client: TestClient, middleware: BreakerMiddleware,
                   hits: Counter[str]) -> None:
        bulkhead = middleware.policy("upstream").bulkhead
        held = await bulkhead.acquire()
        with pytest.raises(BulkheadFull):
            await client.get("/ok")
        await bulkhead.release(held)
        assert (await client.get("/ok")).status == 200
        async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get("http://127.0.0.1:1/")
        metrics = await middleware.policy("upstream").breaker.metrics()
        assert (metrics.calls, metrics.failed) == (2, 1)

    _run(redis_url, body, name="upstream", bulkhead={"max_concurrent_calls": 1})
