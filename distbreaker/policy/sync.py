"""The composed policy: Retry( CircuitBreaker( Bulkhead( call ) ) ), fallback outermost.

Defaults that matter: the retry never retries CallNotPermitted or
BulkheadFull; the breaker ignores BulkheadFull (the bulkhead rejecting is not
the dependency failing) and HTTP client errors (4xx but 429); a 429 without
Retry-After trips the breaker at once; the fallback is not applied to client
errors unless asked. Each attempt asks the breaker again.

Round trips per attempt in CLOSED: the bulkhead's acquire, then one merged script
call (lua/finish.lua; a pipeline when the components have different names)
carrying the bulkhead release, the breaker record and (first attempt) the
retry budget deposit: 2. Without a bulkhead: 1. A call the breaker rejects
locally (a known OPEN wait) costs 0, and deposits nothing: the budget counts
the logical requests that reached an attempt (the safe side, so a recovering
dependency is not met with a budget swollen by rejected requests).

`PolicyCore` is everything but I/O, shared with `distbreaker.aio.Policy`.

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

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from .._runtime.classify import HttpClassifier, Outcome
from .._runtime.connection import shared_sync_client
from .._runtime.decorate import decorate_sync
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed, PendingCall, run_script, run_scripts_each
from ..breaker.sync import CircuitBreaker
from ..budget.sync import RetryBudget
from ..bulkhead.sync import Bulkhead
from ..errors import CallNotPermitted
from ..retry.sync import Retry, run_flow
from .core import (
    Fallback,
    PolicyCore,
    Ran,
    group_ready,
    merged,
    settle,
    unreachable,
)

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("distbreaker")


class Policy(PolicyCore):
    """Breaker, bulkhead, retry (with budget) and fallback for one dependency.

    Components are given as instances, config objects, dicts of keyword
    arguments, True (defaults) or None (left out); built ones share one Redis
    client (`redis`, a URL or a client) so their calls can share a pipeline.
    """

    _kinds = (CircuitBreaker, Bulkhead, Retry, RetryBudget)

    def __init__(self, name: str, redis: Any = None, *, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 fallback: Fallback | None = None, fallback_on_client_error: bool = False,
                 http_classifier: HttpClassifier | None = None,
                 prefix: str = DEFAULT_PREFIX, sleep: Callable[[float], Any] = time.sleep,
                 redis_timeout: float = 0.25) -> None:
        self._client = shared_sync_client(redis, redis_timeout)  # never closed: shared
        self._setup(name, self._client, prefix, (breaker, bulkhead, retry, budget), fallback,
                    fallback_on_client_error, http_classifier)
        self._sleep = sleep

    def _restart_limit(self) -> None:
        try:
            self.bulkhead.restart_limit()
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not restart the adaptive limit: %s", self.name,
                           failure)

    # -- Redis -------------------------------------------------------------------------
    def _flush(self, owed: Sequence[Owed | None]) -> None:
        """Send owed calls, per Redis client (one in all when shared): one merged call
        (lua/finish.lua), else one pipeline."""
        first_error: Exception | None = None
        for client, ready in group_ready(owed):
            try:
                self._send_group(client, ready)
            except Exception as error:  # (foreign data) the other clients' calls still go
                first_error = first_error or error
        if first_error is not None:
            raise first_error

    @staticmethod
    def _send_group(client: Any, ready: Sequence[PendingCall]) -> None:
        one = merged(ready)
        if one is not None:
            try:
                outcome: Any = run_script(client, one.script, one.keys, one.args)
            except UNAVAILABLE_ERRORS as error:
                outcome = error
            if one.answered(outcome):
                return
        try:
            results = run_scripts_each(client, [call.spec for call in ready])
        except UNAVAILABLE_ERRORS as error:
            unreachable(ready, error)
        else:
            settle(ready, results)

    def _trip(self, reason: str) -> None:
        try:
            self.breaker.trip(reason)
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not trip the breaker: %s", self.name, failure)

    # -- one attempt, then the protected call -------------------------------------------
    def _attempt(self, fn: Callable[..., T], args: Any, kwargs: Any, attempt: int) -> T:
        breaker, bulkhead = self.breaker, self.bulkhead
        permit = breaker.acquire() if breaker is not None else None
        try:
            slot = bulkhead.acquire(self.priority) if bulkhead is not None else None
        except BaseException as refused:  # BulkheadFull, or no answer: hand the probe back
            if breaker is not None:
                breaker.record(permit, refused, 0.0, Outcome.IGNORED)
            raise
        refusal = self.lease_refusal(permit, slot)
        if refusal is not None:  # paused since acquiring: hand both back, do not call
            release = bulkhead.owed_release(slot) if slot is not None else None
            record = None if breaker is None else breaker.owed_record(
                permit, refusal, 0.0, Outcome.IGNORED)
            self._flush([release, record])
            raise refusal
        ran = Ran()
        try:
            ran.ended(fn(*args, **kwargs), None)
        except BaseException as error:
            ran.ended(None, error)
        error = self.settle_response(ran)
        release = bulkhead.owed_release(slot, error) if slot is not None else None
        self._flush(self.owed_after(ran, attempt, permit, release))
        reason = self.trip_reason(ran)
        if reason is not None:
            self._trip(reason)
        return ran.unwrap()  # type: ignore[no-any-return]

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)` under the whole policy."""
        try:
            return run_flow(self._flow(), functools.partial(self._attempt, fn, args, kwargs),
                            self.budget, self._sleep)
        except Exception as error:
            if self.uses_fallback(error):
                return self.fallback(error)  # type: ignore[misc,no-any-return]
            raise

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        return decorate_sync(self.call, fn, "Policy")

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"


__all__ = ["CallNotPermitted", "Policy", "PolicyCore"]
