"""The rate limiter's pure core, shared by the sync and asyncio front ends (no I/O).

It builds the ``lua/ratelimiter.lua`` calls, decodes the replies and decides what
each means: run now, run after a wait, or `RequestNotPermitted`; and what a Redis
outage means (``on_redis_error``). The front ends only send the calls and sleep.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .._runtime import forking
from .._runtime.events import Event, Listeners
from .._runtime.health import shared_health
from .._runtime.keys import DEFAULT_PREFIX, RateLimiterKeys, validate_name
from .._runtime.local import LocalScriptRunner
from .._runtime.options import RedisErrorPolicy, check_int, to_ms, to_seconds
from .._runtime.scripts import PendingCall, load_script
from ..errors import RequestNotPermitted
from .config import RateLimiterConfig, build_ratelimiter_config

SCRIPT_NAME = "ratelimiter"

#: The event kinds a rate limiter's listeners get (per process): permitted (`duration`:
#: the wait, `attempt`: the permits), rejected (`error`: the RequestNotPermitted).
EVENT_KINDS = ("permitted", "rejected")

#: Keyed instances whose keys are kept built (an LRU; rebuilding one only costs a format).
_MAX_KEYS_KEPT = 1024


@dataclasses.dataclass(frozen=True)
class Grant:
    """A decoded acquire reply: `ok`, the wait before running (seconds; -1: more permits
    than the burst), the limit in force, the server time (ms) the reply was made at;
    `source` "redis", "local" (the fallback limiter), "none" (no accounting: the
    fallback is still loading) or "closed" (fail_closed)."""

    ok: bool
    wait: float
    limit: int
    source: str = "redis"
    now_ms: int = 0


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Permits reserved by `reserve()`: use them after `wait` seconds (from the reply).

    `run_at_ms` is the server time (ms, Redis's clock; ``now + wait``) from which they
    are usable; `source` "redis", or "local" / "none" when the fallback granted them
    (Redis unreachable; `run_at_ms` is then the fallback's clock, or 0).
    """

    permits: int
    wait: float
    run_at_ms: int
    source: str


@dataclasses.dataclass(frozen=True)
class RateLimiterMetrics:
    """Fleet-wide figures from Redis, plus this process's own.

    `available_permissions` may be negative: permits already reserved by waiting calls
    (as in Resilience4j). `limit_for_period`, `limit_refresh_period` (seconds) and
    `burst` are the ones in force (an operator's, when `overridden`). `calls`,
    `permits`, `waited` and `rejected` are fleet-wide totals since the key was created
    (it expires after `key_ttl` idle); `waiting_here` counts this process's calls
    waiting now for their reserved permits, `rejected_here` the calls it refused.
    """

    available_permissions: int
    limit_for_period: int
    limit_refresh_period: float
    burst: int
    calls: int
    permits: int
    waited: int
    rejected: int
    overridden: bool
    waiting_here: int = 0
    rejected_here: int = 0


def decode_grant(raw: Sequence[Any], source: str = "redis") -> Grant:
    ok, wait_ms, now_ms, limit = (int(x) for x in raw[:4])
    return Grant(bool(ok), wait_ms / 1000.0 if wait_ms >= 0 else -1.0, limit, source, now_ms)


def decode_metrics(raw: Sequence[Any]) -> RateLimiterMetrics:
    v = [int(x) for x in raw]
    return RateLimiterMetrics(available_permissions=v[0], limit_for_period=v[1],
                              limit_refresh_period=v[2] / 1000.0, burst=v[3], calls=v[4],
                              permits=v[5], waited=v[6], rejected=v[7], overridden=bool(v[9]))


class RateLimiterCore:
    """Everything about one rate limiter that is neither I/O nor a front end."""

    #: The Redis client (set by the front end).
    _client: Any

    def __init__(self, name: str, config: RateLimiterConfig | None, prefix: str,
                 overrides: dict[str, Any], redis: Any = None) -> None:
        self.name = validate_name(name)
        self.config = build_ratelimiter_config(config, overrides)
        self.prefix = prefix or DEFAULT_PREFIX
        self.keys = RateLimiterKeys.build(name, self.prefix)
        self._script = load_script(SCRIPT_NAME)
        # one health per Redis server of this process: a Policy's parts discover an
        # outage once
        self._health = shared_health(redis, self.config.redis_retry_max_backoff)
        self._local = LocalScriptRunner()
        self._local_keys: set[str] = set()  # the buckets the local fallback decided
        self._timeout = self.config.timeout_duration
        self._keyed: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.waiting_here = 0
        self.rejected_here = 0
        self.listeners = Listeners(EVENT_KINDS, default=EVENT_KINDS)
        cfg = self.config
        self._geometry = (str(cfg.limit_for_period), str(cfg.period_ms),
                          str(cfg.effective_burst), str(to_ms(cfg.effective_key_ttl)))
        self._local_geometry = (str(cfg.fallback_limit), str(cfg.period_ms),
                                str(cfg.fallback_burst), str(to_ms(cfg.effective_key_ttl)))
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock and this process's own (zero) counts."""
        self._lock = threading.Lock()
        self.waiting_here = 0
        self.rejected_here = 0

    # -- keys and arguments ---------------------------------------------------------
    def bucket_key(self, key: Any = None) -> str:
        """The Redis key of this limiter, or of its instance for `key` (named
        ``<name>:<key>``, its own hash tag, the same config)."""
        if key is None:
            return self.keys.bucket
        text = str(key)
        found = self._keyed.get(text)
        if found is None:
            if not text:
                raise ValueError(f"key of rate limiter {self.name!r} must not be empty")
            found = RateLimiterKeys.build(f"{self.name}:{text}", self.prefix).bucket
            with self._lock:
                self._keyed[text] = found
                if len(self._keyed) > _MAX_KEYS_KEPT:
                    self._keyed.popitem(last=False)
        return found

    @property
    def timeout_duration(self) -> float:
        """The longest a call waits for its permits (this process; see
        `change_timeout_duration`)."""
        return self._timeout

    def change_timeout_duration(self, seconds: float) -> None:
        """Resilience4j's changeTimeoutDuration: this process's calls from now on."""
        self._timeout = to_seconds(seconds, "timeout_duration")

    def check_permits(self, permits: int) -> int:
        return check_int(permits, "permits", 1, 1_000_000_000)

    def acquire_pending(self, permits: int, timeout: float | None, key: Any = None) -> PendingCall:
        """The acquire call; its result is a `Grant` (from Redis, or while Redis is
        unavailable from the fallback the config chooses)."""
        self.check_permits(permits)
        wait = self._timeout if timeout is None else max(0.0, timeout)
        args = ["acquire", *self._geometry, str(permits), str(to_ms(wait))]
        keys = [self.bucket_key(key)]

        def answered(raw: Any) -> Grant:
            self._redis_ok()
            return decode_grant(raw)

        def unavailable(error: BaseException | None) -> Grant:
            if error is not None:
                self._health.failed(error)
            if self.config.on_redis_error is RedisErrorPolicy.FAIL_CLOSED:
                return Grant(False, -1.0, self.config.limit_for_period, "closed")
            local_args = ["acquire", *self._local_geometry, *args[5:]]
            with self._lock:
                self._local_keys.add(keys[0])
            raw = self._local.run(self._script, keys, local_args)
            if raw is None:  # the fallback is still loading: pass, unaccounted
                return Grant(True, 0.0, self.config.fallback_limit, "none")
            return decode_grant(raw, "local")

        return PendingCall(self._script, keys, args, self._health.usable, answered, unavailable)

    def admin_args(self, op: str, *extra: Any) -> list[str]:
        return [op, *self._geometry, *(str(x) for x in extra)]

    def set_args(self, limit_for_period: int | None, limit_refresh_period: float | None,
                 burst: int | None, current: RateLimiterMetrics | None) -> list[str]:
        """The `set` call of `change_limit`: unnamed fields keep the limit in force."""
        base = current
        limit = limit_for_period if limit_for_period is not None else (
            base.limit_for_period if base else self.config.limit_for_period)
        period = limit_refresh_period if limit_refresh_period is not None else (
            base.limit_refresh_period if base else self.config.limit_refresh_period)
        if burst is None:
            # a burst that followed the limit keeps following it
            followed = base is None or base.burst == base.limit_for_period
            burst = limit if followed else base.burst  # type: ignore[union-attr]
        changed = self.config.replace(limit_for_period=limit, limit_refresh_period=period,
                                      burst=burst, key_ttl=None)  # validated as a config
        return self.admin_args("set", changed.limit_for_period, changed.period_ms,
                               changed.effective_burst)

    # -- decisions -------------------------------------------------------------------
    def decide(self, grant: Grant, permits: int, started: float) -> Reservation:
        """The reservation granted, or raise `RequestNotPermitted` (`retry_after`: the
        wait those permits would have needed; 0 for more permits than the burst)."""
        if grant.ok:
            if "permitted" in self.listeners.wanted:
                self.event("permitted", duration=grant.wait + time.monotonic() - started,
                           attempt=permits, reason="" if grant.source == "redis" else
                           "local fallback")
            run_at = grant.now_ms + round(grant.wait * 1000) if grant.now_ms else 0
            return Reservation(permits, grant.wait, run_at, grant.source)
        local = grant.source != "redis"
        if grant.source == "closed":
            refusal = RequestNotPermitted(self.name, permits, self._health.retry_in(),
                                          reason="Redis unavailable (fail_closed)")
        elif grant.wait < 0:
            refusal = RequestNotPermitted(self.name, permits, 0.0, local,
                                          reason=f"{permits} permits exceed the burst")
        else:
            refusal = RequestNotPermitted(self.name, permits, grant.wait, local)
        with self._lock:
            self.rejected_here += 1
        if "rejected" in self.listeners.wanted:
            self.event("rejected", error=refusal, reason=refusal.reason, attempt=permits)
        raise refusal

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    def waiting(self, delta: int) -> None:
        with self._lock:
            self.waiting_here += delta

    def event(self, kind: str, **fields: Any) -> None:
        self.listeners.emit(Event(kind, "ratelimiter", self.name, **fields))

    def metrics_of(self, raw: Sequence[Any]) -> RateLimiterMetrics:
        return dataclasses.replace(decode_metrics(raw), waiting_here=self.waiting_here,
                                   rejected_here=self.rejected_here)

    def _redis_ok(self) -> None:
        if self._local_keys:  # Redis answers again: the fleet's bucket governs
            with self._lock:
                used, self._local_keys = sorted(self._local_keys), set()
            self._local.reset(used)
        self._health.succeeded()

    @property
    def local_fallback_active(self) -> bool:
        """True while Redis is marked unreachable and the fallback decides."""
        return self._health.down

    def add_listener(self, listener: Any, kinds: Any = None) -> None:
        """Call `listener(Event)` for this process's rate limiter events of `kinds`
        (default all of `EVENT_KINDS`: permitted, rejected)."""
        self.listeners.add(listener, kinds)

    def remove_listener(self, listener: Any) -> None:
        self.listeners.remove(listener)

    def __repr__(self) -> str:
        cfg = self.config
        return (f"RateLimiter({self.name!r}, limit_for_period={cfg.limit_for_period}, "
                f"limit_refresh_period={cfg.limit_refresh_period:g})")
