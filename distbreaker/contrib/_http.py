"""What the httpx and requests integrations share, without I/O.

A `Protection` names a request's breaker (host[:port] by default), keeps one lazily
built policy per name, decides whether a request may be retried, and what the caller
gets once the policy is done (the last real response, the error, or a synthetic 503).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from .._runtime.classify import HttpClassifier, HttpStatusError
from .._runtime.keys import DEFAULT_PREFIX, MAX_NAME_LENGTH, validate_name
from ..errors import BulkheadFull, CallNotPermitted
from ..retry.config import default_ignore

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
DEFAULT_PORTS = {"http": 80, "https": 443}
REJECTIONS = (CallNotPermitted, BulkheadFull)
REJECTED_HEADER = "X-Distbreaker-Rejected"
_UNSAFE = re.compile(r"[^A-Za-z0-9._:\[\]-]")
R = TypeVar("R")


def host_name(host: str, port: int | None, scheme: str) -> str:
    """The default breaker name of a request: host, plus ``:port`` unless the scheme's default.

    IPv6 hosts get brackets; characters other than letters, digits and ``._:-[]``
    become ``_`` (so the name is valid and cannot hold a hash tag brace).
    """
    host = host.lower().rstrip(".") or "_"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    name = host if port is None or port == DEFAULT_PORTS.get(scheme.lower()) else f"{host}:{port}"
    return _UNSAFE.sub("_", name)[:MAX_NAME_LENGTH]


def retry_spec(retry: Any, transient: tuple[type[BaseException], ...],
               local: tuple[type[BaseException], ...]) -> Any:
    """The `retry=` option as Policy takes it: an int is max_attempts. Built from options
    (True, int, dict), only `transient` transport errors and HTTP errors are retried,
    never rejections nor `local` errors."""
    if retry is None or retry is False:
        return None
    if isinstance(retry, int) and not isinstance(retry, bool):
        retry = {"max_attempts": retry}
    elif retry is True:
        retry = {}
    if isinstance(retry, dict):
        if "retry_on" not in retry:
            retry = {**retry, "retry_on": (*transient, HttpStatusError)}
        if "ignore" not in retry:
            retry = {**retry, "ignore": (*default_ignore(), *local)}
    return retry


def breaker_spec(breaker: Any, local: tuple[type[BaseException], ...]) -> Any:
    """The `breaker=` option: built from options, errors of our own side are ignored."""
    if breaker is True:
        breaker = {}
    if isinstance(breaker, dict) and not {"ignore_exceptions", "config"} & set(breaker):
        breaker = {**breaker, "ignore_exceptions": local}
    return breaker


def without_retry(policy: Any) -> Any:
    """The same breaker, bulkhead and budget (still deposited to), never retrying."""
    return policy.without_retry()


class PolicyRegistry:
    """One policy per name, built on first use by `factory(name)`; thread-safe."""

    def __init__(self, factory: Callable[[str], Any]) -> None:
        if not callable(factory):
            raise TypeError(f"factory must be callable, got {factory!r}")
        self._factory = factory
        self._lock = threading.Lock()
        self._policies: dict[str, Any] = {}
        self._no_retry: dict[str, Any] = {}

    def get(self, name: str, retry: bool = True) -> Any:
        table = self._policies if retry else self._no_retry
        policy = table.get(name)
        if policy is None:
            with self._lock:
                policy = self._policies.get(name)
                if policy is None:
                    policy = self._factory(validate_name(name))
                    if getattr(policy, "name", name) != name:
                        raise ValueError(f"factory({name!r}) built a policy named "
                                         f"{policy.name!r}")
                    self._policies[name] = policy
                if not retry:
                    policy = self._no_retry.setdefault(name, without_retry(policy))
        return policy

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._policies)


class Exchange:
    """One logical request across attempts: which response to close, which to hand back.

    The policy decides retries; this only remembers the last real response so a
    superseded one is closed before the next attempt (freeing its connection)
    and the last one is returned when the HTTP error is final.
    """

    def __init__(self) -> None:
        self.last: Any = None

    def superseded(self) -> Any:
        """The previous attempt's response (to close), if any, now forgotten."""
        stale, self.last = self.last, None
        return stale

    def received(self, response: Any) -> Any:
        self.last = response
        return response

    def settle(self, error: Exception) -> tuple[Any, Any]:
        """(response to return instead of raising `error` or None, response to close or None).

        A final HTTP error (retries exhausted, Retry-After too long, 429 hard stop)
        returns its response. A rejection after an earlier attempt got a response
        (the breaker opened mid-retry) returns that response: what the upstream said.
        """
        response = getattr(error, "response", None) if isinstance(error, HttpStatusError) else None
        if response is not None and response is self.last:
            return response, None
        if self.last is not None and isinstance(error, REJECTIONS):
            return self.last, None
        return None, self.last


def exchange_sync(policy: Any, attempt: Callable[[], R], close: Callable[[R], Any]) -> R:
    """Send one logical request under `policy`: each attempt's superseded response is
    closed; a final HTTP error returns its last response (as without distbreaker);
    anything else is raised."""
    exchange = Exchange()

    def send() -> R:
        stale = exchange.superseded()
        if stale is not None:
            close(stale)
        return exchange.received(attempt())  # type: ignore[no-any-return]

    try:
        return policy.call(send)  # type: ignore[no-any-return]
    except Exception as error:
        response, stale = exchange.settle(error)
        if stale is not None:
            close(stale)
        if response is None:
            raise
        return response  # type: ignore[no-any-return]


async def exchange_async(policy: Any, attempt: Callable[[], Awaitable[R]],
                         close: Callable[[R], Awaitable[Any]]) -> R:
    """The asyncio twin of `exchange_sync`."""
    exchange = Exchange()

    async def send() -> R:
        stale = exchange.superseded()
        if stale is not None:
            await close(stale)
        return exchange.received(await attempt())  # type: ignore[no-any-return]

    try:
        return await policy.call(send)  # type: ignore[no-any-return]
    except Exception as error:
        response, stale = exchange.settle(error)
        if stale is not None:
            await close(stale)
        if response is None:
            raise
        return response  # type: ignore[no-any-return]


def rejection_headers(error: BaseException) -> dict[str, str]:
    """Headers of the synthetic 503 for a rejection: Retry-After (whole seconds, at
    least 1) and what rejected the call."""
    wait = getattr(error, "retry_after", 0.0) or 0.0
    kind = "circuit-open" if isinstance(error, CallNotPermitted) else "bulkhead-full"
    return {"Retry-After": str(max(1, math.ceil(wait))), REJECTED_HEADER: kind,
            "Content-Type": "text/plain; charset=utf-8"}


NameOption = str | Callable[[Any], str] | None
#: `http_classifier=`: one classifier (or {status: verdict} table) for every host, a
#: mapping of host (or breaker name) -> classifier or table (``"*"``: the others), or
#: a callable of the breaker name.
ClassifierOption = (HttpClassifier | Mapping[Any, Any] | Callable[[str], Any] | None)


def _as_classifier(value: Any) -> HttpClassifier | None:
    if value is None or isinstance(value, HttpClassifier):
        return value
    if isinstance(value, Mapping):
        return HttpClassifier(value)
    raise TypeError(f"http_classifier must be an HttpClassifier, a {{status: verdict}} "
                    f"mapping, a mapping of hosts to those, or a callable, got {value!r}")


def classifier_for(option: ClassifierOption, name: str) -> HttpClassifier | None:
    """The classifier of breaker `name` (``host[:port]``, or a per-tenant name such as
    ``host:tenant``): per host when `option` maps hosts (the longest key that is the
    name or its part before a ``:``-separated suffix; ``"*"`` otherwise)."""
    if callable(option) and not isinstance(option, HttpClassifier):
        return _as_classifier(option(name))
    if isinstance(option, Mapping) and option and all(
            isinstance(k, str) and not k.strip().isdigit() for k in option):
        hosts = sorted((k for k in option if k != "*"), key=len, reverse=True)
        match = next((k for k in hosts if name == k or name.startswith(f"{k}:")), "*")
        return _as_classifier(option.get(match))
    return _as_classifier(option)


class Protection:
    """Options common to the transports and the adapter, and the policy per request.

    `policy_cls` is `distbreaker.Policy` or `distbreaker.aio.Policy`; `make_client`
    turns `redis` (URL or client) into the one client every built policy shares.
    `transient` are the client library's errors worth retrying (connection,
    timeout); `local` its errors that say nothing about the host (invalid URL...).
    """

    def __init__(self, policy_cls: type, make_client: Callable[[Any, float], Any], redis: Any,
                 *, name: NameOption, factory: Callable[[str], Any] | None, breaker: Any,
                 bulkhead: Any, retry: Any, budget: Any,
                 http_classifier: ClassifierOption, prefix: str, redis_timeout: float,
                 retry_methods: Iterable[str] | None, reject_as_response: bool,
                 transient: tuple[type[BaseException], ...],
                 local: tuple[type[BaseException], ...],
                 policy_timeout: float | None = None) -> None:
        if name is not None and not callable(name):
            validate_name(name)
        if not isinstance(reject_as_response, bool):
            raise TypeError("reject_as_response must be a bool")
        self.name = name
        self.reject_as_response = reject_as_response
        self.retry_methods = (None if retry_methods is None
                              else frozenset(m.upper() for m in retry_methods))
        self.client: Any = None
        self.owns_client = factory is None and (redis is None or isinstance(redis, str))
        if factory is not None:
            given = [opt for opt, value, default in (
                ("redis", redis, None), ("breaker", breaker, True), ("bulkhead", bulkhead, None),
                ("retry", retry, None), ("budget", budget, None),
                ("http_classifier", http_classifier, None), ("prefix", prefix, DEFAULT_PREFIX),
                ("timeout", policy_timeout, None),
            ) if value is not default]
            if given:
                raise TypeError(f"give either factory or policy options, not both "
                                f"(got factory and {', '.join(given)})")
        else:
            classifier_for(http_classifier, "")  # checked now, not on the first request
            self.client = client = make_client(redis, redis_timeout)
            options = {"breaker": breaker_spec(breaker, local), "bulkhead": bulkhead,
                       "retry": retry_spec(retry, transient, local), "budget": budget,
                       "prefix": prefix}
            if policy_timeout is not None:  # asyncio policies only: the attempt is cancelled
                options["timeout"] = policy_timeout

            def factory(policy_name: str) -> Any:
                return policy_cls(policy_name, redis=client, **options,
                                  http_classifier=classifier_for(http_classifier, policy_name))

        self.registry = PolicyRegistry(factory)

    def name_of(self, request: Any, host: str, port: int | None, scheme: str) -> str:
        if self.name is None:
            return host_name(host, port, scheme)
        if callable(self.name):
            return validate_name(self.name(request))
        return self.name

    def policy(self, name: str, method: str = "GET", replayable: bool = True) -> Any:
        """The policy for a request to `name`; without retries when the request may not
        be sent twice (method not in `retry_methods`, or a body that cannot be replayed)."""
        retry = replayable and (self.retry_methods is None or method.upper() in self.retry_methods)
        return self.registry.get(name, retry)
