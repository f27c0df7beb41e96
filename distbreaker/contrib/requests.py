"""A requests `HTTPAdapter` sending every request through a fleet-wide policy per host.

    session = requests.Session()
    protect(session, redis="redis://redis:6379/0", retry=3)   # mounts on http:// and https://

Same semantics as `distbreaker.contrib.httpx` (see there): a `distbreaker.Policy`
per ``host[:port]`` (or `name=` / `factory=`), 4xx returned untouched and
uncounted, 429 without Retry-After opens the breaker, 5xx and 429 with
Retry-After retried (honouring Retry-After) and finally returned as the last
response, `requests.ConnectionError` / `requests.Timeout` are failures, only
idempotent methods with a replayable body retried, rejections raise
`CallNotPermitted` / `BulkheadFull` or, with ``reject_as_response=True``, come
back as a synthetic 503 with Retry-After (the error in
``response.distbreaker_rejection``). Bodies are not read by the adapter (a
``stream=True`` request is classified by its status and headers). Leave the
adapter's own ``max_retries`` at 0, or the retry layers multiply.

`PoolAdapter` routes by `distbreaker.Pool` instead: a request to a pool's logical host
goes to the member the pool picks, its outcome recorded on that member;
``route(session, {"payments": pool})`` mounts one on ``http://payments/`` and
``https://payments/``.
"""

from __future__ import annotations

import io
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import requests
import requests.adapters
import requests.exceptions
from requests.structures import CaseInsensitiveDict

from .._runtime.connection import sync_client
from .._runtime.keys import DEFAULT_PREFIX
from ..policy.sync import Policy
from ._http import (
    IDEMPOTENT_METHODS,
    REJECTIONS,
    ClassifierOption,
    Exchange,
    NameOption,
    Protection,
    rejection_headers,
)
from ._pool_http import Failover, Routes, rewrite, route_request

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    requests.exceptions.ConnectionError, requests.exceptions.Timeout)
LOCAL_ERRORS: tuple[type[BaseException], ...] = (
    requests.exceptions.InvalidURL, requests.exceptions.InvalidSchema,
    requests.exceptions.MissingSchema, requests.exceptions.InvalidHeader,
    requests.exceptions.InvalidProxyURL)


class BreakerAdapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter whose `send` runs under the policy of the request's host.

    Keyword arguments not listed here go to `HTTPAdapter` (pool sizes...).
    """

    def __init__(self, redis: Any = None, *, name: NameOption = None,
                 factory: Callable[[str], Any] | None = None, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 http_classifier: ClassifierOption = None, prefix: str = DEFAULT_PREFIX,
                 redis_timeout: float = 0.25,
                 retry_methods: Iterable[str] | None = IDEMPOTENT_METHODS,
                 reject_as_response: bool = False, timeout: Any = None,
                 **adapter_options: Any) -> None:
        super().__init__(**adapter_options)
        #: The HTTP timeout of a request that gives none (requests' default is to wait
        #: forever, and a sync call cannot be interrupted otherwise): seconds, or
        #: requests' ``(connect, read)`` pair.
        self.timeout = _check_http_timeout(timeout)
        self._protection = Protection(
            Policy, sync_client, redis, name=name, factory=factory, breaker=breaker,
            bulkhead=bulkhead, retry=retry, budget=budget, http_classifier=http_classifier,
            prefix=prefix, redis_timeout=redis_timeout, retry_methods=retry_methods,
            reject_as_response=reject_as_response, transient=TRANSIENT_ERRORS,
            local=LOCAL_ERRORS)

    def policy(self, name: str) -> Any:
        """The policy protecting `name` (built now if no request used it yet)."""
        return self._protection.registry.get(name)

    def _policy_for(self, request: requests.PreparedRequest) -> Any:
        parts = urllib.parse.urlsplit(request.url or "")
        name = self._protection.name_of(request, parts.hostname or "", parts.port,
                                        parts.scheme)
        replayable = isinstance(request.body, (bytes, str, type(None)))
        return self._protection.policy(name, request.method or "GET", replayable)

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Any = None) -> requests.Response:
        policy = self._policy_for(request)
        exchange = Exchange()
        if timeout is None:
            timeout = self.timeout

        def attempt() -> requests.Response:
            stale = exchange.superseded()
            if stale is not None:
                stale.close()
            return exchange.received(super(BreakerAdapter, self).send(
                request, stream=stream, timeout=timeout, verify=verify, cert=cert,
                proxies=proxies))

        try:
            return policy.call(attempt)
        except Exception as error:
            response, stale = exchange.settle(error)
            if stale is not None:
                stale.close()
            if response is not None:
                return response
            if self._protection.reject_as_response and isinstance(error, REJECTIONS):
                return self._rejection(request, error)
            raise

    def _rejection(self, request: requests.PreparedRequest,
                   error: BaseException) -> requests.Response:
        body = f"{error}\n".encode()
        response = requests.Response()
        response.status_code = 503
        response.reason = "Service Unavailable"
        response.headers = CaseInsensitiveDict(rejection_headers(error))
        response.url = request.url or ""
        response.request = request
        response.connection = self
        response.encoding = "utf-8"
        response.raw = io.BytesIO(body)
        response._content = body  # reach-in: requests has no constructor for a Response
        response._content_consumed = True  # reach-in: (same) with its body already read
        response.distbreaker_rejection = error  # type: ignore[attr-defined]
        return response

    def close(self) -> None:
        super().close()
        if self._protection.owns_client:
            self._protection.client.close()


def protect(session: requests.Session, redis: Any = None, **options: Any) -> BreakerAdapter:
    """Mount one `BreakerAdapter` (built from `options`) on the session's http:// and https://."""
    adapter = BreakerAdapter(redis, **options)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return adapter


class PoolAdapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter sending a request for a pool's logical host to the member
    `pool.pick()` chooses, and recording the outcome on that member.

    Same options and semantics as `distbreaker.contrib.httpx.PoolTransport`: `pool` one
    `distbreaker.Pool` or a mapping of logical host (or ``host:port``) to pool (other
    hosts are sent as they are); `key(request)` the stickiness key; `http_classifier`;
    `keep_host` sends the logical host as the Host header; `failover` and
    `failover_methods` send a failure to other members. The response's
    `distbreaker_member` attribute names the member. Keyword arguments not listed go to
    `HTTPAdapter`.
    """

    def __init__(self, pool: Any, *,
                 key: Callable[[requests.PreparedRequest], str | None] | None = None,
                 http_classifier: Any = None, keep_host: bool = False, failover: int = 0,
                 failover_methods: Iterable[str] | None = IDEMPOTENT_METHODS,
                 **adapter_options: Any) -> None:
        if not isinstance(keep_host, bool):
            raise TypeError("keep_host must be a bool")
        super().__init__(**adapter_options)
        self._routes = Routes(pool, key, http_classifier, failover, failover_methods)
        self._keep_host = keep_host

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Any = None) -> requests.Response:
        parts = urllib.parse.urlsplit(request.url or "")
        pool = self._routes.pool_for(parts.hostname or "", parts.port)
        options = {"stream": stream, "timeout": timeout, "verify": verify, "cert": cert,
                   "proxies": proxies}
        if pool is None:
            return super().send(request, **options)
        run = Failover(self._routes.attempts(
            request.method or "GET", isinstance(request.body, (bytes, str, type(None)))))
        key = self._routes.key_of(request)

        def verdict_of(response: requests.Response, member: str) -> dict[str, Any]:
            outcome, eject_for = self._routes.verdict(response.status_code, response.headers)
            response.distbreaker_member = member  # type: ignore[attr-defined]
            return {"outcome": outcome, "eject_for": eject_for}

        return route_request(  # type: ignore[no-any-return]
            pool, run, key,
            lambda member: super(PoolAdapter, self).send(
                self._to_member(request, parts, member), **options),
            lambda error: self._routes.error_outcome(error, TRANSIENT_ERRORS, LOCAL_ERRORS),
            verdict_of)

    def _to_member(self, request: requests.PreparedRequest, parts: urllib.parse.SplitResult,
                   member: str) -> requests.PreparedRequest:
        target = self._routes.target(member)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        scheme, _, _, path = rewrite(parts.scheme, path, target)
        sent = request.copy()
        sent.url = urllib.parse.urlunsplit((scheme, target.netloc, path, "", ""))
        if self._keep_host:
            sent.headers["Host"] = parts.netloc
        return sent


def route(session: requests.Session, pools: Any, **options: Any) -> PoolAdapter:
    """Mount one `PoolAdapter` (a mapping of logical host -> pool, and `options`) on
    ``http://<host>/`` and ``https://<host>/`` of each host."""
    adapter = PoolAdapter(pools, **options)
    for host in pools:
        session.mount(f"http://{host}/", adapter)
        session.mount(f"https://{host}/", adapter)
    return adapter


__all__ = ["LOCAL_ERRORS", "TRANSIENT_ERRORS", "BreakerAdapter", "PoolAdapter", "protect",
           "route"]


def _check_http_timeout(timeout: Any) -> Any:
    """None, positive seconds, or a ``(connect, read)`` pair of them (None: no bound)."""
    parts = timeout if isinstance(timeout, tuple) else (timeout,)
    if len(parts) not in (1, 2) or not all(
            p is None or (isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0)
            for p in parts):
        raise ValueError(f"timeout must be positive seconds or a (connect, read) pair, "
                         f"got {timeout!r}")
    return timeout

