"""Health reports of components and registries: what a readiness probe needs to know.

A report says, per component, whether it lets calls through now (`ok`), whether
*this process* can serve it (`serving`: Redis answered, or the local fallback
is in charge; false e.g. for Redis unreachable under ``fail_closed``), the
fleet-wide state, whether this process's local fallback is in charge and
whether an operator override is in force.

A registry's report is *ready* unless a component declared ``critical`` is not
`serving`. An OPEN or FORCED_OPEN breaker is a fleet-wide state: every pod
sees it at the same moment, so failing readiness on it would take every
endpoint out of the load balancer at once and replace the app's own fast 503 +
Retry-After with load-balancer errors. It fails readiness only for a component
declared ``fail_readiness_when_open`` (opt-in). Liveness never depends on a
dependency or on Redis at all.

The probes (`plan`) and the verdicts are pure; `run_sync` / `run_async` (and
the registries) do the reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from .._runtime.health import UNAVAILABLE_ERRORS
from ..breaker.core import BreakerCore
from ..breaker.state import State
from ..budget.core import BudgetCore
from ..policy.core import PolicyCore
from ..pool.core import PoolCore
from ..ratelimiter.core import RateLimiterCore

#: States an operator holds a breaker in (see `distbreaker.CircuitBreaker.transition_to_*`).
OVERRIDES = (State.FORCED_OPEN, State.DISABLED, State.METRICS_ONLY)
#: States in which a breaker rejects every call.
REJECTING = (State.OPEN, State.FORCED_OPEN)


@dataclasses.dataclass(frozen=True)
class ComponentHealth:
    """One component's health; `parts` are a policy's components."""

    kind: str
    name: str
    ok: bool
    critical: bool = False
    redis_reachable: bool = True
    local_fallback_active: bool = False
    state: str | None = None
    override: str | None = None
    error: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    parts: tuple[ComponentHealth, ...] = ()
    #: This process can serve the component (its own ability; the fleet state aside).
    serving: bool = True
    #: Opt-in: readiness also fails while the component is not `ok` (OPEN, FORCED_OPEN).
    fail_readiness_when_open: bool = False

    @property
    def fails_readiness(self) -> bool:
        """Whether this component takes the process out of rotation."""
        if not self.critical:
            return False
        return not (self.ok if self.fail_readiness_when_open else self.serving)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (what the framework integrations serve)."""
        out: dict[str, Any] = {
            "kind": self.kind, "name": self.name, "status": "UP" if self.ok else "DOWN",
            "critical": self.critical, "serving": self.serving,
            "fail_readiness_when_open": self.fail_readiness_when_open,
            "redis_reachable": self.redis_reachable,
            "local_fallback_active": self.local_fallback_active, "state": self.state,
            "override": self.override, "details": dict(self.details)}
        if self.error is not None:
            out["error"] = self.error
        if self.parts:
            out["parts"] = [part.to_dict() for part in self.parts]
        return out


@dataclasses.dataclass(frozen=True)
class RegistryHealth:
    """Every component of a registry; `ready` fails only for critical components this
    process cannot serve (or, opted in, that are OPEN)."""

    redis_reachable: bool
    components: tuple[ComponentHealth, ...]
    live: bool = True

    @property
    def ready(self) -> bool:
        return not self.failing

    @property
    def failing(self) -> tuple[ComponentHealth, ...]:
        """The critical components that take this process out of rotation now."""
        return tuple(c for c in self.components if c.fails_readiness)

    def to_dict(self) -> dict[str, Any]:
        return {"status": "UP" if self.ready else "DOWN", "ready": self.ready,
                "live": self.live, "redis_reachable": self.redis_reachable,
                "failing": [f"{c.kind}:{c.name}" for c in self.failing],
                "components": {f"{c.kind}:{c.name}": c.to_dict() for c in self.components}}


# -- verdicts (pure) ------------------------------------------------------------------------
def _unreachable(error: BaseException | None) -> bool:
    return isinstance(error, UNAVAILABLE_ERRORS)


def _error_text(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


def judge_breaker(breaker: Any, metrics: Any, error: BaseException | None,
                  critical: bool, when_open: bool = False) -> ComponentHealth:
    """OPEN / FORCED_OPEN let nothing through (`ok` false) but the process still serves
    (its own 503s); Redis unreachable under fail_closed (or foreign data) is this
    process's own inability (`serving` false)."""
    reachable = not _unreachable(error)
    fallback = bool(breaker.local_fallback_active)
    if metrics is None:
        ok = not reachable and not breaker.fail_closed
        return ComponentHealth("breaker", breaker.name, ok, critical, reachable, fallback,
                               error=_error_text(error), serving=ok,
                               fail_readiness_when_open=when_open)
    state = State(metrics.state)
    return ComponentHealth(
        "breaker", breaker.name, state not in REJECTING, critical, True, fallback,
        state.value, state.value if state in OVERRIDES else None,
        details={"failure_rate": metrics.failure_rate, "slow_call_rate": metrics.slow_call_rate,
                 "calls": metrics.calls, "not_permitted": metrics.not_permitted,
                 "config_drift": breaker.config_drift is not None},
        fail_readiness_when_open=when_open)


def judge_bulkhead(bulkhead: Any, metrics: Any, error: BaseException | None,
                   critical: bool) -> ComponentHealth:
    """A full bulkhead still serves (a slot frees soon); one rejecting everything while
    Redis is unreachable (``fallback_limit=0``) does not."""
    reachable = not _unreachable(error)
    fallback = bool(bulkhead.local_fallback_active)
    limit = bulkhead.config.effective_fallback_limit
    if metrics is None:
        ok = not reachable and limit > 0
        return ComponentHealth("bulkhead", bulkhead.name, ok, critical, reachable, fallback,
                               error=_error_text(error), details={"fallback_limit": limit},
                               serving=ok)
    ok = not (fallback and limit == 0)
    return ComponentHealth(
        "bulkhead", bulkhead.name, ok, critical, True, fallback,
        details={"in_use": metrics.in_use, "max_concurrent_calls": metrics.max_concurrent_calls,
                 "limit": metrics.limit, "waiting": metrics.waiting,
                 "rejected": metrics.rejected}, serving=ok)


def judge_budget(budget: Any, balance: Any, error: BaseException | None,
                 critical: bool) -> ComponentHealth:
    """An exhausted budget is healthy: it only makes failures final."""
    reachable = error is None and budget.last_source == "redis"
    ok = error is None or _unreachable(error)
    return ComponentHealth("budget", budget.name, ok,
                           critical, reachable, bool(budget.local_fallback_active),
                           error=_error_text(error),
                           details={} if balance is None else {"balance": balance}, serving=ok)


def judge_rate_limiter(limiter: Any, metrics: Any, error: BaseException | None,
                       critical: bool) -> ComponentHealth:
    """A limiter with no permit now still serves (they refill); one refusing everything
    while Redis is unreachable (fail_closed) does not."""
    reachable = not _unreachable(error)
    fallback = bool(limiter.local_fallback_active)
    if metrics is None:
        ok = not reachable and limiter.config.on_redis_error.value == "fail_open"
        return ComponentHealth("rate_limiter", limiter.name, ok, critical, reachable, fallback,
                               error=_error_text(error))
    return ComponentHealth(
        "rate_limiter", limiter.name, True, critical, True, fallback,
        override="LIMIT_CHANGED" if metrics.overridden else None,
        details={"available_permissions": metrics.available_permissions,
                 "limit_for_period": metrics.limit_for_period,
                 "limit_refresh_period": metrics.limit_refresh_period,
                 "calls": metrics.calls, "rejected": metrics.rejected})


def judge_pool(pool: Any, status: Any, error: BaseException | None,
               critical: bool) -> ComponentHealth:
    """A pool serves while it has members (picks go on locally while Redis is unreachable);
    it is not `ok` while a pick would panic (too few healthy members: every member is a
    candidate again)."""
    reachable = not _unreachable(error)
    if status is None:
        return ComponentHealth("pool", pool.name, not reachable, critical, reachable,
                               bool(pool.local_fallback_active), error=_error_text(error))
    # members this process puts in at its first pick count too (a pool not used yet)
    members = len(status.members) or len(pool.members_to_restore)
    return ComponentHealth(
        "pool", pool.name, bool(members) and not status.panic, critical, True,
        bool(pool.local_fallback_active), state="PANIC" if status.panic else None,
        serving=bool(members),
        details={"members": members, "ejected": status.ejected, "panic": status.panic})


def judge_policy(name: str, parts: list[ComponentHealth], critical: bool,
                 when_open: bool = False) -> ComponentHealth:
    """A policy lets calls through (serves) when each of its parts does."""
    breaker = next((p for p in parts if p.kind == "breaker"), None)
    return ComponentHealth(
        "policy", name, all(p.ok for p in parts), critical,
        all(p.redis_reachable for p in parts), any(p.local_fallback_active for p in parts),
        breaker.state if breaker else None, breaker.override if breaker else None,
        parts=tuple(parts), serving=all(p.serving for p in parts),
        fail_readiness_when_open=when_open)


# -- probes ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Probe:
    """One read (`read()`, sync or awaitable) and the verdict on its result or error."""

    read: Callable[[], Any]
    judge: Callable[[Any, BaseException | None], ComponentHealth]


@dataclasses.dataclass(frozen=True)
class PolicyProbe:
    name: str
    parts: tuple[tuple[int, Any], ...]   # (id, probe) per component
    critical: bool
    when_open: bool = False


def kind_of(component: Any) -> str:
    """"breaker", "bulkhead", "budget", "rate_limiter", "policy" or "pool"; TypeError for
    anything else."""
    if isinstance(component, BreakerCore):
        return "breaker"
    if isinstance(component, RateLimiterCore):
        return "rate_limiter"
    if isinstance(component, BudgetCore):
        return "budget"
    if isinstance(component, PolicyCore):
        return "policy"
    if isinstance(component, PoolCore):
        return "pool"
    if hasattr(component, "local_fallback_active") and hasattr(component, "metrics"):
        return "bulkhead"
    raise TypeError(f"cannot report the health of {component!r}: expected a breaker, "
                    "bulkhead, retry budget, rate limiter or policy")


def plan(component: Any, critical: bool = False,
         critical_of: Callable[[str, str], tuple[bool, bool]] | None = None,
         when_open: bool = False) -> Probe | PolicyProbe:
    """The read a component's health needs, and its verdict. A policy's parts are
    (critical, fail_readiness_when_open) as `critical_of(kind, name)` says (default: not)."""
    kind = kind_of(component)
    if kind == "policy":
        parts = [p for p in (component.breaker, component.rate_limiter, component.bulkhead,
                             component.budget) if p is not None]
        return PolicyProbe(component.name, tuple(
            (id(p), plan(p, *(critical_of(kind_of(p), p.name) if critical_of
                              else (False, False))))
            for p in parts), critical, when_open)
    if kind == "breaker":
        return Probe(component.metrics, lambda value, error: judge_breaker(
            component, value, error, critical, when_open))
    if kind == "bulkhead":
        return Probe(component.metrics,
                     lambda value, error: judge_bulkhead(component, value, error, critical))
    if kind == "rate_limiter":
        return Probe(component.metrics,
                     lambda value, error: judge_rate_limiter(component, value, error, critical))
    if kind == "pool":
        return Probe(component.status,
                     lambda value, error: judge_pool(component, value, error, critical))
    return Probe(component.balance,
                 lambda value, error: judge_budget(component, value, error, critical))


def run_sync(probe: Probe | PolicyProbe, seen: dict[int, ComponentHealth] | None = None,
             key: int | None = None) -> ComponentHealth:
    """Run a probe with sync reads (`seen` reuses reports within one registry report)."""
    seen = {} if seen is None else seen
    if key is not None and key in seen:
        return seen[key]
    if isinstance(probe, PolicyProbe):
        report = judge_policy(probe.name, [run_sync(p, seen, k) for k, p in probe.parts],
                              probe.critical, probe.when_open)
    else:
        try:
            value, error = probe.read(), None
        except Exception as raised:
            value, error = None, raised
        report = probe.judge(value, error)
    if key is not None:
        seen[key] = report
    return report


async def run_async(probe: Probe | PolicyProbe, seen: dict[int, ComponentHealth] | None = None,
                    key: int | None = None) -> ComponentHealth:
    """`run_sync` with awaited reads."""
    seen = {} if seen is None else seen
    if key is not None and key in seen:
        return seen[key]
    if isinstance(probe, PolicyProbe):
        report = judge_policy(probe.name, [await run_async(p, seen, k) for k, p in probe.parts],
                              probe.critical, probe.when_open)
    else:
        try:
            value, error = await _awaited(probe.read), None
        except Exception as raised:
            value, error = None, raised
        report = probe.judge(value, error)
    if key is not None:
        seen[key] = report
    return report


async def _awaited(read: Callable[[], Awaitable[Any]]) -> Any:
    return await read()


def health(component: Any, *, critical: bool = False,
           fail_readiness_when_open: bool = False) -> ComponentHealth:
    """The health of one sync breaker, bulkhead, retry budget or policy (reads Redis once
    per component). For a registry use ``registry.health()``."""
    return run_sync(plan(component, critical, when_open=fail_readiness_when_open))


async def ahealth(component: Any, *, critical: bool = False,
                  fail_readiness_when_open: bool = False) -> ComponentHealth:
    """The health of one asyncio component (`distbreaker.aio.health`)."""
    return await run_async(plan(component, critical, when_open=fail_readiness_when_open))
