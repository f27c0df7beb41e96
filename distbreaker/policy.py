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

from .breaker import CircuitBreaker
from .budget import RetryBudget
from .bulkhead import Bulkhead
from .classify import (
    DEFAULT_HTTP_CLASSIFIER,
    HttpClassifier,
    HttpStatusError,
    HttpVerdict,
    Outcome,
    headers_of,
    status_of,
)
from .connection import sync_client
from .errors import BulkheadFull, CallNotPermitted
from .fallback import UNAVAILABLE_ERRORS
from .keys import DEFAULT_PREFIX, validate_name
from .retry import Decision, Retry, RetryCore
from .scripts import PendingCall, run_scripts_each

T = TypeVar("T")
logger = logging.getLogger("distbreaker")
Fallback = Callable[[BaseException], Any]


def build_component(spec: Any, cls: type, name: str, client: Any, prefix: str) -> Any:
    """A component from what the user gave: None/False (none), True (defaults),
    an instance (as is), a config object, or a dict of keyword arguments."""
    if spec is None or spec is False:
        return None
    if isinstance(spec, cls):
        return spec
    if spec is True:
        return cls(name, redis=client, prefix=prefix)
    if isinstance(spec, dict):
        return cls(name, redis=client, prefix=prefix, **spec)
    return cls(name, redis=client, config=spec, prefix=prefix)


def build_retry(spec: Any, cls: type) -> Any:
    """A Retry from None/False, True, an instance, a RetryConfig or a dict."""
    if spec is None or spec is False:
        return None
    if isinstance(spec, cls):
        return spec
    if spec is True:
        return cls()
    if isinstance(spec, dict):
        return cls(**spec)
    return cls(spec)


class PolicyCore:
    """The decisions of a policy: outcome for the breaker, retry, fallback."""

    breaker: Any
    bulkhead: Any
    retry: Any
    budget: Any

    def _setup(self, name: str, retry: Any, budget: Any, fallback: Fallback | None,
               fallback_on_client_error: bool, http_classifier: HttpClassifier | None) -> None:
        self.name = validate_name(name)
        if fallback is not None and not callable(fallback):
            raise TypeError(f"fallback must be callable or None, got {fallback!r}")
        if not isinstance(fallback_on_client_error, bool):
            raise TypeError("fallback_on_client_error must be a bool")
        self.retry = retry
        self.budget = budget if budget is not None else getattr(retry, "budget", None)
        self.fallback = fallback
        self.fallback_on_client_error = fallback_on_client_error
        self.classifier = http_classifier or (
            retry.config.http_classifier if retry is not None else None) or DEFAULT_HTTP_CLASSIFIER
        self._core: RetryCore | None = retry._core if retry is not None else None

    def verdict(self, error: BaseException | None) -> HttpVerdict | None:
        return None if error is None else self.classifier.classify_error(error)

    def breaker_outcome(self, error: BaseException | None, result: Any = None) -> Outcome | None:
        """How the breaker counts an attempt; None: its own classification decides.

        A returned HTTP client-error response counts nowhere, like a raised one.
        """
        if error is None:
            status = status_of(result) if hasattr(result, "status_code") else None
            if status is not None and self.classifier.classify(
                    status, headers_of(result)) is HttpVerdict.CLIENT_ERROR:
                return Outcome.IGNORED
            return Outcome.SUCCESS
        if isinstance(error, BulkheadFull):
            return Outcome.IGNORED
        verdict = self.verdict(error)
        if verdict in (HttpVerdict.CLIENT_ERROR, HttpVerdict.HARD_STOP):
            return Outcome.IGNORED  # a hard stop trips the breaker explicitly instead
        if verdict is HttpVerdict.TRANSIENT:
            return Outcome.FAILURE
        return None

    def response_error(self, result: Any) -> HttpStatusError | None:
        """An HTTP response that is a transient error or a hard stop, as an exception."""
        status = status_of(result) if hasattr(result, "status_code") else None
        if status is None:
            return None
        headers = headers_of(result)
        if self.classifier.classify(status, headers) not in (HttpVerdict.TRANSIENT,
                                                             HttpVerdict.HARD_STOP):
            return None
        error = HttpStatusError(status, headers, f"HTTP {status} from {self.name}")
        error.response = result  # type: ignore[attr-defined]
        return error

    def is_hard_stop(self, error: BaseException) -> bool:
        return self.verdict(error) is HttpVerdict.HARD_STOP

    def decide(self, error: BaseException, attempt: int, started: float) -> Decision:
        if self._core is None:
            return Decision(False, 0.0, "no retry")
        return self._core.decide(error, attempt, started, time.monotonic())

    def uses_fallback(self, error: BaseException) -> bool:
        if self.fallback is None or not isinstance(error, Exception):
            return False
        return self.fallback_on_client_error or \
            self.verdict(error) is not HttpVerdict.CLIENT_ERROR


def settle(ready: Sequence[PendingCall], results: Sequence[Any]) -> None:
    """Hand each pipelined call its own reply (a pipeline is not a transaction: the
    others ran even when one failed). A call answered by an "unavailable" error
    takes its outage path alone; any other error (foreign data) is raised once
    every other call has been settled."""
    first_error: BaseException | None = None
    for call, result in zip(ready, results, strict=True):
        if isinstance(result, UNAVAILABLE_ERRORS):
            call.on_unavailable(result)
        elif isinstance(result, BaseException):
            first_error = first_error or result
        else:
            call.on_reply(result)
    if first_error is not None:
        raise first_error


def group_ready(pending: Sequence[tuple[Any, PendingCall | None]]
                ) -> list[tuple[Any, list[PendingCall]]]:
    """Owed calls grouped by client, in order; calls whose Redis is in backoff go
    straight to their outage path (not tried)."""
    groups: dict[int, tuple[Any, list[PendingCall]]] = {}
    for client, call in pending:
        if call is None:
            continue
        if not call.usable():
            call.on_unavailable(None)
            continue
        groups.setdefault(id(client), (client, []))[1].append(call)
    return list(groups.values())


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
    def _flush(self, pending: Sequence[tuple[Any, PendingCall | None]]) -> None:
        """Send owed calls: one pipeline per Redis client (one in all when shared)."""
        for client, ready in group_ready(pending):
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
        pending: list[tuple[Any, PendingCall | None]] = []
        if deposit and self.budget is not None:  # once per logical request that ran
            pending.append((self.budget._client, self.budget.deposit_pending()))
        if slot is not None:
            pending.append((bulkhead._client, bulkhead._release_pending(slot)))
        if breaker is not None:
            pending.append((breaker._client, breaker._record_pending(
                permit, error, duration, self.breaker_outcome(error, result))))
        self._flush(pending)
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
