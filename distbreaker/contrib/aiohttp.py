"""An aiohttp client middleware sending every request through a fleet-wide policy per host.

```python
import aiohttp
from distbreaker.contrib.aiohttp import BreakerMiddleware

breakers = BreakerMiddleware(redis="redis://redis:6379/0", retry=3,
                             breaker={"failure_rate_threshold": 50})
async with aiohttp.ClientSession(middlewares=(breakers,)) as session:
    async with session.get("https://api.example.com/v1/items") as response:
        ...
```

The same behaviour as `distbreaker.contrib.httpx` (aiohttp >= 3.12, whose
client middlewares this is): each request runs under the `distbreaker.aio.Policy`
of its host (``host[:port]``; `name=` a fixed name or ``name(request)``; or
``factory(name)``); 4xx come back untouched, uncounted and unretried; a 429
without Retry-After opens the breaker at once; 5xx and a 429 with Retry-After
are retried and, when final, returned as the last response; connection errors
and timeouts are failures, retried when retries are on; an invalid URL is
neither. Only idempotent methods with a body that can be sent again (none,
bytes, str, JSON) are retried. A rejection raises `CallNotPermitted` or
`BulkheadFull`. Keep aiohttp's own retry middlewares off, or the retry layers
multiply. The shared Redis client binds to the event loop that first uses it:
one middleware per loop (as for an `aiohttp.ClientSession`).

`timeout` (seconds) bounds each attempt (request sent, status line and headers
received): the policy cancels it (`distbreaker.aio.Policy(timeout=...)`), the
breaker counts it as a failure, and it is retried when retries are on. It adds to
the session's own ``ClientTimeout``, which keeps bounding the body's read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
from aiohttp import payload

from .._runtime.connection import async_client
from .._runtime.keys import DEFAULT_PREFIX
from ..policy.aio import Policy
from ..policy.core import check_timeout
from ._http import (
    IDEMPOTENT_METHODS,
    REJECTIONS,
    ClassifierOption,
    NameOption,
    Protection,
    exchange_async,
)
from ._web import note_rejection

__all__ = ["LOCAL_ERRORS", "TRANSIENT_ERRORS", "BreakerMiddleware"]

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)
LOCAL_ERRORS: tuple[type[BaseException], ...] = (aiohttp.InvalidURL,)


def replayable(request: aiohttp.ClientRequest) -> bool:
    """Whether the request's body can be sent again (nothing, or bytes in memory)."""
    body = request.body
    return body == b"" or isinstance(body, payload.BytesPayload)


class BreakerMiddleware:
    """An aiohttp client middleware (pass it in ``ClientSession(middlewares=...)``)."""

    def __init__(self, redis: Any = None, *, name: NameOption = None,
                 factory: Callable[[str], Any] | None = None, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 http_classifier: ClassifierOption = None, prefix: str = DEFAULT_PREFIX,
                 redis_timeout: float = 0.25,
                 retry_methods: Iterable[str] | None = IDEMPOTENT_METHODS,
                 timeout: float | None = None) -> None:
        self._protection = Protection(
            Policy, async_client, redis, name=name, factory=factory, breaker=breaker,
            bulkhead=bulkhead, retry=retry, budget=budget, http_classifier=http_classifier,
            prefix=prefix, redis_timeout=redis_timeout, retry_methods=retry_methods,
            reject_as_response=False, transient=TRANSIENT_ERRORS, local=LOCAL_ERRORS,
            policy_timeout=check_timeout(timeout))

    def policy(self, name: str) -> Any:
        """The policy protecting `name` (built now if no request used it yet)."""
        return self._protection.registry.get(name)

    async def __call__(self, request: aiohttp.ClientRequest,
                       handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        url = request.url
        name = self._protection.name_of(request, url.raw_host or "", url.port, url.scheme)
        policy = self._protection.policy(name, request.method, replayable(request))

        async def attempt() -> _Classified:
            return _Classified(await handler(request))

        try:
            result = await exchange_async(policy, attempt, _release)
        except REJECTIONS as rejected:
            note_rejection(rejected)
            raise
        return result.response if isinstance(result, _Classified) else result

    async def aclose(self) -> None:
        """Close the Redis client if the middleware built it from a URL."""
        if self._protection.owns_client:
            await self._protection.client.aclose()


class _Classified:
    """An aiohttp response as the policy classifies responses (by `status_code`)."""

    __slots__ = ("response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    @property
    def status_code(self) -> int:
        return self.response.status

    @property
    def headers(self) -> Any:
        return self.response.headers


async def _release(result: _Classified) -> None:
    result.response.release()
