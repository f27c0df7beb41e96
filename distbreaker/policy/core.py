"""What a policy decides, shared by the sync and asyncio policies (no I/O).

How the breaker counts an attempt, which responses are errors, which Redis
calls an attempt owes and what it raises, the retry flow and the fallback, and
how owed Redis calls are grouped and settled.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from redis.exceptions import NoPermissionError

from .._runtime.classify import (
    DEFAULT_HTTP_CLASSIFIER,
    HttpClassifier,
    HttpStatusError,
    HttpVerdict,
    Outcome,
    headers_of,
    retry_after_of,
    status_of,
)
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.keys import validate_name
from .._runtime.options import to_seconds
from .._runtime.scripts import (
    LuaScript,
    Owed,
    PendingCall,
    each_result,
    load_script,
    malformed,
)
from ..bulkhead.adaptive import priority_level
from ..errors import BulkheadFull, RequestNotPermitted
from ..retry.core import Decision, RetryFlow, retry_flow

Fallback = Callable[[BaseException], Any]


class AttemptTimeout(TimeoutError):
    """An attempt the asyncio Policy cancelled after its `timeout` (a `TimeoutError`).

    The breaker counts it as a failure (whatever its exception rules say: the
    dependency did not answer in time); the retry retries it like any transient error.
    """

    def __init__(self, name: str, timeout: float, attempt: int) -> None:
        self.name, self.timeout, self.attempt = name, timeout, attempt
        super().__init__(f"policy {name!r}: attempt {attempt} timed out after {timeout:g} s")


def check_timeout(timeout: Any) -> float | None:
    """None, or a positive number of seconds (a timedelta works too)."""
    if timeout is None:
        return None
    return to_seconds(timeout, "timeout", positive=True)


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


class Ran:
    """One attempt of the protected call, timed from its creation to `ended`.

    `settled` and `verdict` are set once, by `PolicyCore.settle_response`: every later
    decision about the attempt reads the verdict instead of classifying again.
    """

    __slots__ = ("duration", "error", "result", "settled", "started", "verdict")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.duration = 0.0
        self.result: Any = None
        self.error: BaseException | None = None
        self.settled = False
        self.verdict: HttpVerdict | None = None

    def ended(self, result: Any, error: BaseException | None) -> None:
        self.duration = time.monotonic() - self.started
        self.result, self.error = result, error

    def unwrap(self) -> Any:
        """The attempt's result, or raise its error."""
        if self.error is None:
            return self.result
        try:
            raise self.error
        finally:
            self.error = None  # no cycle between the raising frame and the traceback


class PolicyCore:
    """The decisions of a policy: outcome for the breaker, owed calls, retry, fallback."""

    #: This flavour's breaker, bulkhead, retry, budget and rate limiter classes.
    _kinds: tuple[type, type, type, type, type]

    def _setup(self, name: str, client: Any, prefix: str,
               specs: tuple[Any, Any, Any, Any, Any], fallback: Fallback | None,
               fallback_on_client_error: bool, http_classifier: HttpClassifier | None) -> None:
        """Build the components from what the user gave (`specs`: breaker, bulkhead,
        retry, budget, rate limiter), sharing `client`, then check the other options."""
        breaker_cls, bulkhead_cls, retry_cls, budget_cls, limiter_cls = self._kinds
        breaker, bulkhead, retry, budget, rate_limiter = specs
        spec_budget = budget
        self.breaker = build_component(breaker, breaker_cls, name, client, prefix)
        self.rate_limiter = build_component(rate_limiter, limiter_cls, name, client, prefix)
        self.bulkhead = build_component(bulkhead, bulkhead_cls, name, client, prefix)
        if http_classifier is not None and (retry is True or (
                isinstance(retry, dict) and "http_classifier" not in retry)):
            # one classification per policy: what the breaker counts, the retry retries
            retry = {**({} if retry is True else retry), "http_classifier": http_classifier}
        retry = build_retry(retry, retry_cls)
        budget = build_component(budget, budget_cls, name, client, prefix)
        #: What this policy built itself (from True, a config or a dict): `close` closes
        #: it; components given as instances are the caller's to close.
        self.owned = [built for given, built in ((breaker, self.breaker),
                                                 (rate_limiter, self.rate_limiter),
                                                 (bulkhead, self.bulkhead), (spec_budget, budget))
                      if built is not None and built is not given]
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
        if (self.breaker is not None and self.bulkhead is not None
                and self.bulkhead.config.adaptive is not None):
            # Slow start with an adaptive bulkhead: its limit restarts low instead.
            self.breaker.recover_with(self._restart_limit)

    def _restart_limit(self) -> None:
        """The breaker closed after a recovery: restart the adaptive limit low (each
        flavour sends it its own way)."""
        raise NotImplementedError

    #: The bulkhead priority of this policy's calls (None: the whole limit); see
    #: `prioritized`.
    priority: str | int | None = None

    def prioritized(self, priority: str | int) -> Any:
        """A copy sharing everything with this policy whose calls carry `priority` to
        the bulkhead ("critical", "normal", "sheddable" or an int: lower priorities are
        shed first near the limit, fleet-wide)."""
        priority_level(priority)  # a clear error now, not at the first call
        twin = copy.copy(self)
        twin.priority = priority
        return twin

    #: Rate limiter permits each attempt takes (see `weighted`).
    permits: int = 1

    def weighted(self, permits: int) -> Any:
        """A copy sharing everything with this policy whose attempts each take `permits`
        from its rate limiter (e.g. the LLM tokens a request will use)."""
        if self.rate_limiter is None:
            raise ValueError(f"policy {self.name!r} has no rate limiter to weigh calls for")
        self.rate_limiter.check_permits(permits)
        twin = copy.copy(self)
        twin.permits = permits
        return twin

    def without_retry(self) -> Any:
        """A copy sharing this policy's breaker, bulkhead and budget (still deposited
        to) that never retries (e.g. for a request that must not be sent twice)."""
        twin = copy.copy(self)
        twin.retry = None
        return twin

    def verdict(self, error: BaseException | None) -> HttpVerdict | None:
        return None if error is None else self.classifier.classify_error(error)

    def breaker_outcome(self, error: BaseException | None, result: Any = None) -> Outcome | None:
        """How the breaker counts an attempt; None: its own classification decides.

        A returned HTTP client-error response counts nowhere, like a raised one.
        """
        if error is None:
            return self._outcome(None, result, self._response_verdict(result))
        return self._outcome(error, result, self.verdict(error))

    def _outcome(self, error: BaseException | None, result: Any,
                 verdict: HttpVerdict | None) -> Outcome | None:
        """`breaker_outcome`, given the attempt's verdict (classified once)."""
        if error is None:
            if verdict is HttpVerdict.CLIENT_ERROR:
                return Outcome.IGNORED
            if self.breaker is not None:
                return self.breaker.result_outcome(result) or Outcome.SUCCESS
            return Outcome.SUCCESS
        if isinstance(error, (BulkheadFull, RequestNotPermitted)):
            return Outcome.IGNORED  # our own limits refusing: not the dependency failing
        if isinstance(error, AttemptTimeout):
            return Outcome.FAILURE
        if verdict in (HttpVerdict.CLIENT_ERROR, HttpVerdict.HARD_STOP):
            return Outcome.IGNORED  # a hard stop trips the breaker explicitly instead
        if verdict is HttpVerdict.TRANSIENT:
            return Outcome.FAILURE
        return None

    def _response_verdict(self, result: Any) -> HttpVerdict | None:
        """The verdict on a returned value that is an HTTP response, else None."""
        status = status_of(result) if hasattr(result, "status_code") else None
        return None if status is None else self.classifier.classify(status, headers_of(result))

    def response_error(self, result: Any) -> HttpStatusError | None:
        """An HTTP response that is a transient error or a hard stop, as an exception."""
        return self._error_of(result, self._response_verdict(result))

    def _error_of(self, result: Any, verdict: HttpVerdict | None) -> HttpStatusError | None:
        """`response_error`, given the response's verdict."""
        if verdict not in (HttpVerdict.TRANSIENT, HttpVerdict.HARD_STOP):
            return None
        status, headers = status_of(result), headers_of(result)
        assert status is not None  # a verdict: a response
        error = HttpStatusError(status, headers, f"HTTP {status} from {self.name}")
        error.response = result  # type: ignore[attr-defined]
        return error

    def is_hard_stop(self, error: BaseException) -> bool:
        return self.verdict(error) is HttpVerdict.HARD_STOP

    def settle_response(self, ran: Ran) -> BaseException | None:
        """Classify the attempt, once: a returned response that is an error becomes the
        attempt's error (before the bulkhead release, which reports it to an adaptive
        limit); the error, if any. Later calls answer from `ran` (no second verdict)."""
        if not ran.settled:
            ran.settled = True
            if ran.error is None:
                ran.verdict = self._response_verdict(ran.result)
                ran.error = self._error_of(ran.result, ran.verdict)
            else:
                ran.verdict = self.verdict(ran.error)
        return ran.error

    def owed_after(self, ran: Ran, attempt: int, permit: Any,
                   release: Owed | None) -> list[Owed | None]:
        """The Redis calls attempt number `attempt` owes now that it ran, in pipeline
        order: the retry budget deposit (first attempt only: once per logical request
        that reached an attempt), the bulkhead `release`, the breaker record.

        A returned response that is an error becomes the attempt's error here (see
        `settle_response`: the attempt is classified once)."""
        self.settle_response(ran)
        owed: list[Owed | None] = []
        if attempt == 1 and self.budget is not None:
            owed.append(self.budget.owed_deposit())
        owed.append(release)
        if self.breaker is not None:
            outcome = self._outcome(ran.error, ran.result, ran.verdict)
            owed.append(self.breaker.owed_record(permit, ran.error, ran.duration, outcome))
        return owed

    def lease_refusal(self, permit: Any, slot: Any) -> BaseException | None:
        """Checked immediately before an attempt invokes the protected function: the
        rejection to raise when the breaker probe's or the bulkhead permit's lease has
        already ended (the process was paused since acquiring), else None. The caller
        hands both back first."""
        if self.breaker is not None and permit is not None:
            rejection = self.breaker.lease_rejection(permit)
            if rejection is not None:
                return rejection
        if self.bulkhead is not None and slot is not None:
            return self.bulkhead.lease_rejection(slot)  # type: ignore[no-any-return]
        return None

    def trip_reason(self, ran: Ran) -> str | None:
        """Why the breaker must be tripped after this attempt (a hard stop), or None. It
        names the status and the breaker's key (a per-tenant name says whose request it
        was): `distbreaker show` prints it while the breaker is OPEN."""
        error = self.settle_response(ran)
        if error is None or self.breaker is None or ran.verdict is not HttpVerdict.HARD_STOP:
            return None
        wait = self.trip_for(ran)
        advised = "without Retry-After" if wait is None else f"with Retry-After {wait:g}s"
        return f"hard stop: HTTP {status_of(error)} {advised} (key {self.breaker.name!r})"

    def trip_for(self, ran: Ran) -> float | None:
        """How long a hard stop holds the breaker OPEN: the Retry-After the response gave
        (a status classified HARD_STOP may carry one), else None (the open wait)."""
        if ran.error is None or ran.verdict is not HttpVerdict.HARD_STOP:
            return None
        wait = retry_after_of(ran.error)
        return wait if wait else None

    def decide(self, error: BaseException, attempt: int, started: float) -> Decision:
        if self.retry is None:
            return Decision(False, 0.0, "no retry")
        return self.retry.decide(error, attempt, started, time.monotonic())

    def _flow(self) -> RetryFlow:
        """The retry flow of one logical call. No Deposit step: the first attempt's
        pipeline carries the deposit, and only when that attempt ran."""
        budget = None if self.budget is None else self.budget.name
        events = self.retry.listeners if self.retry is not None else None
        return retry_flow(self.decide, time.monotonic, budget, deposit=False, events=events,
                          name=self.name)

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
            call.reply(result)
    if first_error is not None:
        raise first_error


def unreachable(ready: Sequence[PendingCall], error: BaseException) -> None:
    """A pipeline that got no answer: every call in it takes its outage path."""
    for call in ready:
        call.on_unavailable(error)


#: The scripts lua/finish.lua runs in one call, each at most once.
MERGEABLE = frozenset({"budget", "bulkhead", "breaker"})


def hash_tag(key: str) -> str:
    """The part of `key` Redis Cluster hashes (between the first "{" and the next "}")."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1:end] if start >= 0 and end > start + 1 else key


class MergedCall(NamedTuple):
    """The calls an attempt owes as ONE script call (lua/finish.lua)."""

    script: LuaScript
    keys: list[str]
    args: list[Any]
    ready: Sequence[PendingCall]

    def answered(self, outcome: Any) -> bool:
        """Hand each call its part of the merged call's `outcome` (its reply, or the
        "unavailable" error it met); False when the calls must be pipelined instead: FCALL
        and EVAL check the ACL of every key they declare, so a user without permission on
        one component's key (NOPERM) is refused them all, while pipelined only that
        component's call is refused (its outage path) and the others still run."""
        if isinstance(outcome, NoPermissionError):
            return False
        if not isinstance(outcome, BaseException | list):  # not Redis (scripts.malformed)
            outcome = malformed(outcome)
        if isinstance(outcome, BaseException):
            unreachable(self.ready, outcome)
        else:
            settle(self.ready, each_result(split_flat(outcome, len(self.ready))))
        return True


def merged(ready: Sequence[PendingCall]) -> MergedCall | None:
    """The calls an attempt owes as ONE script call (the deposit, the release and the
    record cost Redis one call and one TIME instead of three), or None when they cannot
    be merged: fewer than two, another script, a script twice, or keys in more than one
    cluster slot. Each call still gets its own reply or error, as from a pipeline."""
    names = [call.script.name for call in ready]
    if len(ready) < 2 or not MERGEABLE.issuperset(names) or len(set(names)) < len(names):
        return None
    if len({hash_tag(key) for call in ready for key in call.keys}) != 1:
        return None
    plan = ",".join(f"{call.script.name}:{len(call.keys)}:{len(call.args)}" for call in ready)
    return MergedCall(load_script("finish"), [key for call in ready for key in call.keys],
                      [plan, *(arg for call in ready for arg in call.args)], ready)


def split_flat(flat: Sequence[Any], calls: int) -> list[Any]:
    """The replies in lua/finish.lua's flat array: per call its element count n >= 1,
    then n elements; or 0, then the reply itself (an integer, or a failed call's error)."""
    replies: list[Any] = []
    i = 0
    for _ in range(calls):
        n = int(flat[i])
        elements = list(flat[i + 1:i + 1 + max(n, 1)])
        if len(elements) != max(n, 1):
            raise ValueError(f"a merged call's reply ended early: {flat!r}")
        replies.append(elements[0] if n == 0 else elements)
        i += 1 + max(n, 1)
    return replies


def group_ready(owed: Sequence[Owed | None]) -> list[tuple[Any, list[PendingCall]]]:
    """Owed calls grouped by client, in order; calls whose Redis is in backoff go
    straight to their outage path (not tried). Each health is asked once."""
    groups: dict[int, tuple[Any, list[PendingCall]]] = {}
    # Components of one Redis share one health: asked once, so the one trial it lets
    # through after a backoff carries all of them (not the first alone).
    asked: dict[int, bool] = {}
    for item in owed:
        if item is None:
            continue
        client, call = item
        health = id(getattr(call.usable, "__self__", call.usable))
        usable = asked.get(health)
        if usable is None:
            usable = asked[health] = call.usable()
        if not usable:
            call.on_unavailable(None)
            continue
        groups.setdefault(id(client), (client, []))[1].append(call)
    return list(groups.values())
