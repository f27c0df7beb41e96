"""The composed policy: Retry( CircuitBreaker( Bulkhead( call ) ) ), fallback outermost.

Defaults that matter (DESIGN.md): the retry never retries CallNotPermitted or
BulkheadFull; the breaker ignores BulkheadFull (the bulkhead rejecting is not
the dependency failing) and HTTP client errors (4xx but 429); a 429 without
Retry-After trips the breaker at once; the fallback is not applied to client
errors unless asked. Each attempt asks the breaker again.

Round trips per attempt in CLOSED: the bulkhead's acquire, then one pipeline
carrying the bulkhead release, the breaker record and (first attempt) the
retry budget deposit: 2. Without a bulkhead: 1. A call the breaker rejects
locally (a known OPEN wait) costs 0, and deposits nothing: the budget counts
the logical requests that reached an attempt (the safe side, so a recovering
dependency is not met with a budget swollen by rejected requests).

`PolicyCore` is everything but I/O, shared with `distbreaker.aio.Policy`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._runtime.connection import sync_client
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed, run_scripts_each
from ..breaker.classify import (
    HttpClassifier,
    Outcome,
    status_of,
)
from ..breaker.sync import CircuitBreaker
from ..budget.sync import RetryBudget
from ..bulkhead.sync import Bulkhead
from ..errors import CallNotPermitted
from ..retry.core import RetryCore
from ..retry.sync import Retry
from .core import Fallback, PolicyCore, build_component, build_retry, group_ready, settle

T = TypeVar("T")
logger = logging.getLogger("distbreaker")












class Policy(PolicyCore):
    """Breaker, bulkhead, retry (with budget) and fallback for one dependency.

    Components are given as instances, config objects, dicts of keyword
    arguments, True (defaults) or None (left out); built ones share one Redis
    client (`redis`, a URL or a client) so their calls can share a pipeline.
    """

    def __init__(self, name: str, redis: Any = None, *, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 fallback: Fallback | None = None, fallback_on_client_error: bool = False,
                 http_classifier: HttpClassifier | None = None,
                 prefix: str = DEFAULT_PREFIX, sleep: Callable[[float], Any] = time.sleep,
                 redis_timeout: float = 0.25) -> None:
        self._client = sync_client(redis, redis_timeout)
        self.breaker = build_component(breaker, CircuitBreaker, name, self._client, prefix)
        self.bulkhead = build_component(bulkhead, Bulkhead, name, self._client, prefix)
        retry_obj = build_retry(retry, Retry)
        budget_obj = build_component(budget, RetryBudget, name, self._client, prefix)
        self._setup(name, retry_obj, budget_obj, fallback, fallback_on_client_error,
                    http_classifier)
        self._sleep = sleep

    # -- Redis -------------------------------------------------------------------------
    def _flush(self, owed: Sequence[Owed | None]) -> None:
        """Send owed calls: one pipeline per Redis client (one in all when shared)."""
        for client, ready in group_ready(owed):
            try:
                results = run_scripts_each(client, [call.spec for call in ready])
            except UNAVAILABLE_ERRORS as error:
                for call in ready:
                    call.on_unavailable(error)
                continue
            settle(ready, results)

    def _trip(self, error: BaseException) -> None:
        try:
            self.breaker.trip(f"hard stop: HTTP {status_of(error)} without Retry-After")
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not trip the breaker: %s", self.name, failure)

    # -- one attempt ---------------------------------------------------------------------
    def _attempt(self, fn: Callable[..., T], args: Any, kwargs: Any,
                 deposit: bool) -> T:
        breaker, bulkhead = self.breaker, self.bulkhead
        permit = breaker.acquire() if breaker is not None else None
        try:
            slot = bulkhead.acquire() if bulkhead is not None else None
        except BaseException as refused:  # BulkheadFull, or no answer: hand the probe back
            if breaker is not None:
                breaker.record(permit, refused, 0.0, Outcome.IGNORED)
            raise
        started = time.monotonic()
        error: BaseException | None
        try:
            result = fn(*args, **kwargs)
        except BaseException as raised:
            error, result = raised, None
        else:
            error = self.response_error(result)
        duration = time.monotonic() - started
        owed: list[Owed | None] = []
        if deposit and self.budget is not None:  # once per logical request that ran
            owed.append(self.budget.owed_deposit())
        if slot is not None:
            owed.append(bulkhead.owed_release(slot))
        if breaker is not None:
            owed.append(breaker.owed_record(permit, error, duration,
                                            self.breaker_outcome(error, result)))
        self._flush(owed)
        if error is not None:
            if breaker is not None and self.is_hard_stop(error):
                self._trip(error)
            raise error
        return result  # type: ignore[return-value]

    # -- the protected call -----------------------------------------------------------------
    def _with_retry(self, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        budget = self.budget
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._attempt(fn, args, kwargs, deposit=attempt == 1)
            except Exception as error:
                decision = self.decide(error, attempt, started)
                if not decision.retry:
                    raise
                if budget is not None and not budget.try_withdraw():
                    RetryCore.mark_exhausted(error, budget.name)
                    raise
                self._sleep(decision.delay)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` under the whole policy."""
        try:
            return self._with_retry(fn, args, kwargs)
        except Exception as error:
            if self.uses_fallback(error):
                return self.fallback(error)  # type: ignore[misc]
            raise

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError("use distbreaker.aio.Policy to decorate a coroutine function")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"


__all__ = ["CallNotPermitted", "Policy", "PolicyCore"]
