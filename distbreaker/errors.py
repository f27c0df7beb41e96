"""Exceptions raised by distbreaker.

On its own account (besides whatever the protected function raised) a protected
call raises only rejections: `CallNotPermitted` (the breaker; also a Redis outage
under fail_closed), `BulkheadFull` (the bulkhead) and `RequestNotPermitted` (the rate
limiter); an operator's fault injection raises `InjectedFault` or `InjectedRejection`
(a `CallNotPermitted`) in workers that allow it. `RetryBudgetExhausted` is raised only
by `RetryBudget.withdraw()`, for callers driving the budget themselves (`Retry` and
`Policy` re-raise the original error instead). `SchemaError` means foreign data in
Redis; misuse raises ValueError or TypeError.

Reads and operator actions, which go to Redis only (`breaker.state`, `get_state()`,
`metrics()`, `reset()`, `trip()`, the `transition_to_*` methods, `Bulkhead.metrics()`,
`RetryBudget.reset()`), raise `RedisUnavailable` while Redis cannot serve them. It is
also a ``redis.exceptions.ConnectionError``, so ``except redis.ConnectionError`` code
keeps working; the Redis error is its ``__cause__``.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError


class DistbreakerError(Exception):
    """Base class of every error raised by distbreaker itself.

    Subclasses name their constructor arguments in `_fields`, so they pickle
    (multiprocessing, Celery's result backend) with every attribute intact.
    """

    _fields: tuple[str, ...] = ()

    def __reduce__(self) -> Any:
        if not self._fields:
            return super().__reduce__()
        return (type(self), tuple(getattr(self, field) for field in self._fields))


class CallNotPermitted(DistbreakerError):
    """The breaker rejected the call without running it.

    `state` is the breaker's `State` (a `str`), or "UNKNOWN" while Redis is unreachable.

    `retry_after` is the number of seconds until trying again makes sense: the
    rest of the OPEN wait; for FORCED_OPEN the breaker's `revalidate_interval`
    (when this process asks Redis again); during a fail-closed Redis outage the
    time until Redis is tried again. `reason` and `actor` say why the breaker is
    in this state and who put it there (an operator's action: "alice@host").
    """

    _fields = ("name", "state", "retry_after", "reason", "actor")

    def __init__(self, name: str, state: str, retry_after: float = 0.0,
                 reason: str = "", actor: str = "") -> None:
        # No message built here: a rejection is raised on the hot path of an OPEN
        # breaker (hundreds of thousands a second) and most are caught unread; the
        # message is made when shown (__str__).
        self.name = name
        self.state = state
        self.retry_after = retry_after if retry_after > 0.0 else 0.0
        self.reason = reason
        self.actor = actor

    def __str__(self) -> str:
        reason, actor = self.reason, self.actor
        detail = f" ({reason}{', by ' + actor if actor else ''})" if reason else ""
        return (f"circuit breaker {self.name!r} is {self.state}{detail}; "
                f"retry after {self.retry_after:.3f}s")


class SchemaError(DistbreakerError):
    """A key holds data distbreaker did not write (wrong type, garbage, other schema)."""

    _fields = ("message", "key")

    def __init__(self, message: str, key: str = "") -> None:
        self.message = message
        self.key = key
        super().__init__(message)


class ConfigDriftWarning(UserWarning):
    """Two workers configured the same breaker name differently."""


class BulkheadFull(DistbreakerError):
    """The bulkhead had no free permit (within `max_wait_duration`); the call did not run.

    `in_use` is the number of permits held fleet-wide when the call was refused
    (the local count while Redis is unreachable and the local limit applies; -1 when
    unknown). `reason` is set when the refusal is not a full bulkhead: a permit whose
    lease ended before its call started (the holder was paused).
    """

    _fields = ("name", "limit", "in_use", "waited", "local", "reason")

    def __init__(self, name: str, limit: int, in_use: int, waited: float = 0.0,
                 local: bool = False, reason: str = "") -> None:
        self.name = name
        self.limit = limit
        self.in_use = in_use
        self.waited = waited
        self.local = local
        self.reason = reason
        if reason:
            super().__init__(f"bulkhead {name!r} refused the call: {reason}")
            return
        scope = "local fallback limit" if local else "fleet-wide limit"
        detail = f" after waiting {waited:.3f}s" if waited > 0 else ""
        super().__init__(f"bulkhead {name!r} is full ({in_use}/{limit} permits in use, "
                         f"{scope}){detail}")


class RequestNotPermitted(DistbreakerError):
    """The rate limiter gave no permit within `timeout_duration`; the call did not run.

    `permits` is what the call asked for, `retry_after` the seconds after which that
    many would have been granted (0 when unknown: more permits than the burst, or Redis
    unavailable under fail_closed), `local` True when this process's fallback limiter
    refused (Redis unreachable), `reason` what refused (Resilience4j's name).
    """

    _fields = ("name", "permits", "retry_after", "local", "reason")

    def __init__(self, name: str, permits: int = 1, retry_after: float = 0.0,
                 local: bool = False, reason: str = "") -> None:
        self.name = name
        self.permits = permits
        self.retry_after = max(0.0, retry_after)
        self.local = local
        self.reason = reason or ("local fallback limit" if local else "fleet-wide limit")
        super().__init__(f"rate limiter {name!r} refused {permits} permit(s) ({self.reason}); "
                         f"retry after {self.retry_after:.3f}s")


class NoPoolMember(DistbreakerError, LookupError):
    """`Pool.pick()` found no member to choose: the pool has none (in Redis, and none in
    this process's config or `set_members()`), or every one was avoided."""

    _fields = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"pool {name!r} has no member to pick")


class RedisUnavailable(DistbreakerError, RedisConnectionError):
    """Redis could not serve a read or an operator action of `component` (e.g.
    "circuit breaker 'payments'"); the Redis error is the ``__cause__``.

    Protected calls never raise it (they follow ``on_redis_error``). A subclass of
    ``redis.exceptions.ConnectionError`` too, whatever the Redis error was (a timeout,
    READONLY, NOPERM...), so existing ``except redis.ConnectionError`` code keeps working.
    """

    _fields = ("component", "detail")

    def __init__(self, component: str, detail: str = "") -> None:
        self.component = component
        self.detail = detail
        super().__init__(f"Redis is unavailable to {component}" + (f": {detail}" if detail else ""))


class CheckFailed(RedisUnavailable):
    """`check()` (and ``Registry(strict=True)``): Redis cannot serve `component`. The
    message names the cause and its fix; `cause` is the cause's description (kind, what,
    fix), None for a Redis that is just unreachable."""

    _fields = ("component", "detail")

    def __init__(self, component: str, detail: str = "", cause: Any = None) -> None:
        super().__init__(component, detail)
        self.cause = cause


class RetryBudgetExhausted(DistbreakerError):
    """The fleet-wide retry budget had no retry left for `name`.

    `RetryBudget.withdraw()` raises it. `Retry` does not: when the budget says
    no it re-raises the original error, marked `retry_budget_exhausted = True`
    (see distbreaker.retry), so callers' ``except`` clauses keep working.
    """

    _fields = ("name", "balance", "deposits", "withdrawals")

    def __init__(self, name: str, balance: int = 0, deposits: int = 0,
                 withdrawals: int = 0) -> None:
        self.name = name
        self.balance = balance
        self.deposits = deposits
        self.withdrawals = withdrawals
        super().__init__(f"retry budget {name!r} is exhausted (balance {balance}, "
                         f"{deposits} requests and {withdrawals} retries in the window)")


class Overloaded(DistbreakerError):
    """Raise it from a protected call when the dependency answered "overloaded" (an
    HTTP 429, or 503 with Retry-After): an adaptive bulkhead cuts its limit and pauses
    increases for `retry_after` seconds; anything else treats it as a failure."""

    def __init__(self, message: str = "the dependency is overloaded",
                 retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = max(0.0, float(retry_after))


class InjectedFault(DistbreakerError):
    """A fault an operator injected (``distbreaker inject NAME --error 503``): raised in
    place of the protected call, and counted by the breaker like the failure it stands
    for, so fallbacks, retries and trips can be rehearsed. It carries the injected HTTP
    status as `status_code` (HTTP classification and retries treat it as that status);
    `isinstance(error, InjectedFault)` tells it from a real failure."""

    _fields = ("name", "status_code", "reason", "actor")

    def __init__(self, name: str, status_code: int = 503, reason: str = "",
                 actor: str = "") -> None:
        self.name = name
        self.status_code = status_code
        self.reason = reason
        self.actor = actor
        super().__init__(name, status_code, reason, actor)

    def __str__(self) -> str:
        by = f", by {self.actor}" if self.actor else ""
        why = f" ({self.reason}{by})" if self.reason or by else ""
        return f"injected fault on {self.name!r}: HTTP {self.status_code}{why}"


class InjectedRejection(CallNotPermitted):
    """A rejection an operator injected (``distbreaker inject NAME --reject``): the call
    is refused as if the breaker were OPEN (a `CallNotPermitted`, so every fallback
    path runs), while the fleet's breaker state is untouched."""
