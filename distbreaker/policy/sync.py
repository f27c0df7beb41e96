"""The composed policy: Retry( CircuitBreaker( RateLimiter( Bulkhead( call ) ) ) ), fallback
outermost (Resilience4j's order).

Defaults that matter: the retry never retries CallNotPermitted, BulkheadFull or
RequestNotPermitted; the breaker ignores BulkheadFull and RequestNotPermitted (our
own limits refusing is not the dependency failing) and HTTP client errors (4xx but
429); a 429 without Retry-After trips the breaker at once; the fallback is not
applied to client errors unless asked. Each attempt asks the breaker again, then
takes its rate limiter permits (`weighted(n)`: n per attempt; a wait for them holds
the breaker's half-open probe, as in Resilience4j), then its bulkhead permit.

Round trips per attempt in CLOSED: the bulkhead's acquire, then one merged script
call (lua/finish.lua; a pipeline when the components have different names)
carrying the bulkhead release, the breaker record and (first attempt) the
retry budget deposit: 2. Without a bulkhead: 1. A rate limiter adds its acquire (1).
A call the breaker rejects locally (a known OPEN wait) costs 0, and deposits
nothing: the budget counts the logical requests that reached an attempt (the safe
side, so a recovering dependency is not met with a budget swollen by rejected
requests).

`PolicyCore` is everything but I/O, shared with `distbreaker.aio.Policy`, and so is
`PolicyShell` (`_shell_sync.py`, generated from `_shell_aio.py` by scripts/unasync.py):
the attempt and its Redis calls.

Timeouts: the sync Policy has none of its own. Python cannot interrupt a
thread that is blocked in a call, so a sync "timeout" could only notice, after
the call finally returned, that it was late; it could not free the thread, the
socket or the bulkhead permit in time. Bound the call where it blocks: give the
HTTP client its timeout (the integrations take `timeout=` and pass it on:
`distbreaker.contrib.requests.BreakerAdapter(timeout=...)`,
`distbreaker.contrib.httpx.BreakerTransport(timeout=...)`), and the breaker
records the client's timeout error as a failure like any other. The asyncio
Policy takes `timeout=` and cancels the attempt (`distbreaker.aio.Policy`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from .._runtime.classify import HttpClassifier
from .._runtime.connection import shared_sync_client
from .._runtime.keys import DEFAULT_PREFIX
from ..errors import CallNotPermitted
from ._shell_sync import PolicyShell
from .core import Fallback, PolicyCore

T = TypeVar("T")


class Policy(PolicyShell):
    """Breaker, rate limiter, bulkhead, retry (with budget) and fallback for one dependency.

    Components are given as instances, config objects, dicts of keyword
    arguments, True (defaults) or None (left out); built ones share one Redis
    client (`redis`, a URL or a client) so their calls can share a pipeline.
    """

    def __init__(self, name: str, redis: Any = None, *, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 rate_limiter: Any = None, fallback: Fallback | None = None,
                 fallback_on_client_error: bool = False,
                 http_classifier: HttpClassifier | None = None,
                 prefix: str = DEFAULT_PREFIX, sleep: Callable[[float], Any] = time.sleep,
                 redis_timeout: float = 0.25) -> None:
        self._client = shared_sync_client(redis, redis_timeout)  # never closed: shared
        self._setup(name, self._client, prefix,
                    (breaker, bulkhead, retry, budget, rate_limiter), fallback,
                    fallback_on_client_error, http_classifier)
        self._sleep = sleep

    def _restart_limit(self) -> None:
        self._restart_now()

    def _within(self, result: T, attempt: int) -> T:
        """The protected call's result: the sync Policy has no timeout of its own (see the
        module docstring)."""
        return result

    def _fall_back(self, error: Exception) -> Any:
        return self.fallback(error)  # type: ignore[misc]


__all__ = ["CallNotPermitted", "Policy", "PolicyCore"]
