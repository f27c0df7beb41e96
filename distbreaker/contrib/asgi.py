"""ASGI middleware (Starlette, FastAPI, any ASGI app): rejections become 503, plus health.

```python
from fastapi import FastAPI
from distbreaker.contrib.asgi import DistbreakerMiddleware

app = FastAPI()
app.add_middleware(DistbreakerMiddleware, registry=registry)   # or app = Middleware(app, ...)
```

A `CallNotPermitted` or `BulkheadFull` raised by the app before it started its
response is answered with a 503, ``Retry-After`` and
``X-Distbreaker-Rejected``. With a `registry` (sync or asyncio), ``/health``
and ``/health/ready`` serve its report (503 only while this process cannot
serve a critical component; an OPEN breaker keeps it ready) and ``/health/live``
answers 200 without reading anything
(`health_prefix` moves them; None turns them off; ``details=False`` serves
the status only). A sync registry's report is read in a worker thread.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ._web import REJECTIONS, HealthPaths, health_body, live_body, rejection

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["DistbreakerMiddleware"]


class DistbreakerMiddleware:
    """Wraps an ASGI app (see the module docstring)."""

    def __init__(self, app: ASGIApp, registry: Any = None, *,
                 health_prefix: str | None = "/health", details: bool = True) -> None:
        self.app = app
        self.registry = registry
        self.details = details
        self.paths = HealthPaths(health_prefix if registry is not None else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.paths.route(scope.get("path", ""))
        if route is not None:
            await self._health(route, send)
            return
        started = False

        async def watching(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watching)
        except REJECTIONS as error:
            if started:  # too late for a 503: the app already answered
                raise
            status, headers, body = rejection(error)
            await _respond(send, status, headers, body)

    async def _health(self, route: str, send: Send) -> None:
        if route == "live":
            status, body = live_body()
        else:
            health = self.registry.health
            if inspect.iscoroutinefunction(health):
                report = await health()
            else:
                report = await asyncio.to_thread(health)
            status, body = health_body(report, self.details)
        await _respond(send, status, {"Content-Type": "application/json",
                                      "Cache-Control": "no-store"}, body)


async def _respond(send: Send, status: int, headers: dict[str, str], body: bytes) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
