"""httpx transports sending every request through a fleet-wide policy per host.

    transport = BreakerTransport(redis="redis://redis:6379/0", retry=3,
                                 breaker={"failure_rate_threshold": 50})
    client = httpx.Client(transport=transport)          # AsyncBreakerTransport for AsyncClient

Each request runs under the `distbreaker.Policy` (`distbreaker.aio.Policy`) of its
host (``host[:port]``; `name=` a fixed name or ``name(request) -> str``), built on
first use from the options (all policies share one Redis client) or by
``factory(name)``. Responses are classified by `classify_http`: 4xx come back
untouched, uncounted and unretried; a 429 without Retry-After opens the breaker
at once; 5xx and a 429 with Retry-After are retried (waiting the Retry-After)
and, when final, returned as the last response, as without the transport.
Timeouts and connection errors are failures, retried when retries are on;
errors of our own side (unsupported protocol, local protocol error, our pool
being full) are neither. Only idempotent methods with a replayable body are
retried (`retry_methods`). A rejection raises `CallNotPermitted` or
`BulkheadFull`, or with ``reject_as_response=True`` returns a synthetic 503
with Retry-After (seconds until a probe may be tried) and
``X-Distbreaker-Rejected: circuit-open|bulkhead-full`` (the error is in
``response.extensions["distbreaker_rejection"]``). Bodies are never read: a
streamed response is classified by its status line and headers.

`timeout` (seconds, or an ``httpx.Timeout``) is the HTTP timeout of a request
that carries none (a client built with ``timeout=None``): httpx enforces it
per phase (connect, read, write, pool), and its ``httpx.TimeoutException`` is
a failure. A sync call cannot be interrupted any other way. The asyncio
transport also takes `attempt_timeout`: the policy cancels the whole attempt
(`distbreaker.aio.Policy(timeout=...)`), whatever the phase.

The asyncio transport's shared Redis client binds to the event loop that first
uses it (as an `httpx.AsyncClient` does); build one transport per loop.

`PoolTransport` / `AsyncPoolTransport` route by `distbreaker.Pool` instead: a request
to a pool's logical host (``http://payments/charge``) goes to the member the pool
picks, and its outcome is recorded on that member (see `distbreaker.contrib._pool_http`
and docs/guides/httpx.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import httpx

from .._runtime.connection import async_client, sync_client
from .._runtime.keys import DEFAULT_PREFIX
from ..policy.aio import Policy as AsyncPolicy
from ..policy.core import check_timeout
from ..policy.sync import Policy
from ._http import (
    IDEMPOTENT_METHODS,
    REJECTIONS,
    ClassifierOption,
    NameOption,
    Protection,
    exchange_async,
    exchange_sync,
    rejection_headers,
)
from ._pool_http import Failover, Routes, Target, rewrite, route_request

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError)
LOCAL_ERRORS: tuple[type[BaseException], ...] = (
    httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.PoolTimeout, httpx.InvalidURL)


class _Protected:
    """The options and per-request decisions both transports share."""

    _policy_cls: type
    _make_client: Callable[[Any, float], Any]

    def __init__(self, transport: Any = None, redis: Any = None, *, name: NameOption = None,
                 factory: Callable[[str], Any] | None = None, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 http_classifier: ClassifierOption = None, prefix: str = DEFAULT_PREFIX,
                 redis_timeout: float = 0.25,
                 retry_methods: Iterable[str] | None = IDEMPOTENT_METHODS,
                 reject_as_response: bool = False, timeout: Any = None,
                 _policy_timeout: float | None = None) -> None:
        self._inner = transport if transport is not None else self._default_inner()
        self._timeout = None if timeout is None else httpx.Timeout(timeout).as_dict()
        self._protection = Protection(
            self._policy_cls, type(self)._make_client, redis, name=name, factory=factory,
            breaker=breaker, bulkhead=bulkhead, retry=retry, budget=budget,
            http_classifier=http_classifier, prefix=prefix, redis_timeout=redis_timeout,
            retry_methods=retry_methods, reject_as_response=reject_as_response,
            transient=TRANSIENT_ERRORS, local=LOCAL_ERRORS, policy_timeout=_policy_timeout)

    def _default_inner(self) -> Any:
        raise NotImplementedError

    def policy(self, name: str) -> Any:
        """The policy protecting `name` (built now if no request used it yet)."""
        return self._protection.registry.get(name)

    def _policy_for(self, request: httpx.Request) -> Any:
        if self._timeout is not None and not any(
                (request.extensions.get("timeout") or {}).values()):
            request.extensions["timeout"] = self._timeout
        url = request.url
        name = self._protection.name_of(request, url.raw_host.decode("ascii"), url.port,
                                        url.scheme)
        return self._protection.policy(name, request.method,
                                       isinstance(request.stream, httpx.ByteStream))

    def _answer(self, request: httpx.Request, error: Exception) -> httpx.Response:
        """What the caller gets for a call the policy ended with `error`: a synthetic 503
        for a rejection (``reject_as_response``), else the error raised."""
        if self._protection.reject_as_response and isinstance(error, REJECTIONS):
            return httpx.Response(503, headers=rejection_headers(error),
                                  content=f"{error}\n".encode(), request=request,
                                  extensions={"distbreaker_rejection": error})
        raise error


class BreakerTransport(_Protected, httpx.BaseTransport):
    """Wraps `transport` (default ``httpx.HTTPTransport()``) in a policy per host."""

    _policy_cls = Policy
    _make_client = staticmethod(sync_client)

    def _default_inner(self) -> httpx.BaseTransport:
        return httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return exchange_sync(self._policy_for(request),
                                 lambda: self._inner.handle_request(request),
                                 httpx.Response.close)
        except Exception as error:
            return self._answer(request, error)

    def close(self) -> None:
        self._inner.close()
        if self._protection.owns_client:
            self._protection.client.close()


class AsyncBreakerTransport(_Protected, httpx.AsyncBaseTransport):
    """Wraps `transport` (default ``httpx.AsyncHTTPTransport()``) in a policy per host."""

    _policy_cls = AsyncPolicy
    _make_client = staticmethod(async_client)

    def __init__(self, transport: Any = None, redis: Any = None, *,
                 attempt_timeout: float | None = None, **options: Any) -> None:
        super().__init__(transport, redis, _policy_timeout=check_timeout(attempt_timeout),
                         **options)

    def _default_inner(self) -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await exchange_async(self._policy_for(request),
                                        lambda: self._inner.handle_async_request(request),
                                        httpx.Response.aclose)
        except Exception as error:
            return self._answer(request, error)

    async def aclose(self) -> None:
        await self._inner.aclose()
        if self._protection.owns_client:
            await self._protection.client.aclose()


class _PoolRouted:
    """What both pool transports share: which pool, the member's request, the outcome."""

    def __init__(self, pool: Any, transport: Any = None, *,
                 key: Callable[[httpx.Request], str | None] | None = None,
                 http_classifier: Any = None, keep_host: bool = False, failover: int = 0,
                 failover_methods: Iterable[str] | None = IDEMPOTENT_METHODS) -> None:
        if not isinstance(keep_host, bool):
            raise TypeError("keep_host must be a bool")
        self._routes = Routes(pool, key, http_classifier, failover, failover_methods)
        self._keep_host = keep_host
        self._inner = transport if transport is not None else self._default_inner()

    def _default_inner(self) -> Any:
        raise NotImplementedError

    def _pool_for(self, request: httpx.Request) -> Any:
        return self._routes.pool_for(request.url.host, request.url.port)

    def _to_member(self, request: httpx.Request, member: str) -> httpx.Request:
        """The request as sent to `member`: its scheme, host, port and path prefix; the Host
        header the member's (`keep_host`: the logical host's)."""
        target: Target = self._routes.target(member)
        url = request.url
        scheme, host, port, raw_path = rewrite(url.scheme, url.raw_path.decode("ascii"), target)
        headers = request.headers.copy()
        if not self._keep_host:
            headers["Host"] = target.netloc
        return httpx.Request(request.method,
                             url.copy_with(scheme=scheme, host=host, port=port,
                                           raw_path=raw_path.encode("ascii")),
                             headers=headers, stream=request.stream,
                             extensions=request.extensions)

    def _outcome(self, response: httpx.Response, member: str) -> dict[str, Any]:
        response.extensions["distbreaker_member"] = member
        outcome, eject_for = self._routes.verdict(response.status_code, response.headers)
        return {"outcome": outcome, "eject_for": eject_for}

    def _failed(self, error: BaseException) -> str | None:
        return self._routes.error_outcome(error, TRANSIENT_ERRORS, LOCAL_ERRORS)

    def _failover(self, request: httpx.Request) -> Failover:
        return Failover(self._routes.attempts(request.method,
                                              isinstance(request.stream, httpx.ByteStream)))


class PoolTransport(_PoolRouted, httpx.BaseTransport):
    """Sends a request for a pool's logical host to the member `pool.pick()` chooses.

    `pool`: a `distbreaker.Pool` for every request, or a mapping of logical host (or
    ``host:port``) to pool (requests to other hosts go out untouched). `key(request)`:
    the pick's stickiness key. The response's status is classified by `http_classifier`
    (as the breaker transports) and recorded on the member; a 429 or 503 with
    Retry-After ejects it that long, fleet-wide. `response.extensions["distbreaker_member"]`
    names the member. `failover=N`: a failure (a 5xx, 429 or other status classified a
    failure, or no response at all) is sent again, at once, to up to N other members
    (each a new pick avoiding those tried), for `failover_methods` (default: the
    idempotent ones) with a body that can be sent again; the caller gets the last answer.
    Wrap a `BreakerTransport` (`transport=`) for a breaker per member.
    """

    def _default_inner(self) -> httpx.BaseTransport:
        return httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        pool = self._pool_for(request)
        if pool is None:
            return self._inner.handle_request(request)  # type: ignore[no-any-return]
        run, key = self._failover(request), self._routes.key_of(request)
        return route_request(  # type: ignore[no-any-return]
            pool, run, key,
            lambda member: self._inner.handle_request(self._to_member(request, member)),
            self._failed, self._outcome)

    def close(self) -> None:
        self._inner.close()


class AsyncPoolTransport(_PoolRouted, httpx.AsyncBaseTransport):
    """`PoolTransport` for `httpx.AsyncClient`, over `distbreaker.aio.Pool` pools."""

    def _default_inner(self) -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pool = self._pool_for(request)
        if pool is None:
            return await self._inner.handle_async_request(request)  # type: ignore[no-any-return]
        run, key = self._failover(request), self._routes.key_of(request)
        pick = await pool.pick(key)
        while True:
            if not run.fresh(pick.member):   # nothing else was left
                await pool.release(pick)
                return run.result()  # type: ignore[no-any-return]
            try:
                response = await self._inner.handle_async_request(
                    self._to_member(request, pick.member))
            except BaseException as error:
                outcome = self._failed(error)
                step = run.failed(error, outcome)
                if step == "next":   # record this one and pick the next: one script call
                    pick = await pool.repick(pick, error, outcome=outcome, key=key,
                                             avoid=run.tried)
                    continue
                if outcome is None:
                    await pool.release(pick)
                else:
                    await pool.record(pick, error, outcome=outcome or None)
                if step == "answer":
                    return run.result()  # type: ignore[no-any-return]
                stale = run.superseded()
                if stale is not None:
                    await stale.aclose()
                raise
            stale = run.superseded()
            if stale is not None:
                await stale.aclose()
            verdict = self._outcome(response, pick.member)
            if run.answered(response, verdict["outcome"]):
                await pool.record(pick, **verdict)
                return response  # type: ignore[no-any-return]
            pick = await pool.repick(pick, **verdict, key=key, avoid=run.tried)

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = ["LOCAL_ERRORS", "TRANSIENT_ERRORS", "AsyncBreakerTransport", "AsyncPoolTransport",
           "BreakerTransport", "PoolTransport"]
