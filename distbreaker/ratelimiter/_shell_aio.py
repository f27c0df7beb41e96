"""What the sync and asyncio rate limiters share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; the front ends add only
their docstrings. The local fallback is an in-memory fakeredis: it runs inline,
nothing to await.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .._runtime.connection import LoopClients
from .._runtime.decorate import decorate_async
from .._runtime.health import redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import run_script_async, send_async
from ..errors import RequestNotPermitted
from .config import RateLimiterConfig
from .core import RateLimiterCore, RateLimiterMetrics, Reservation

P = ParamSpec("P")
T = TypeVar("T")


class RateLimiterShell(RateLimiterCore):
    """The rate limiter's permits and protected call around its I/O."""

    def __init__(self, name: str, redis: Any = None, config: RateLimiterConfig | None = None,
                 *, prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, config, prefix, overrides, redis)
        self._clients = LoopClients(redis, self.config.redis_timeout)

    @property
    def _client(self) -> Any:
        """The client (asyncio: the running event loop's; a URL's is shared)."""
        return self._clients.get()

    # -- permits ------------------------------------------------------------------------
    async def reserve(self, permits: int = 1, *, key: Any = None,
                      timeout: float | None = None) -> Reservation:
        """Reserve `permits` (Resilience4j's reservePermission): use them after the
        reservation's `wait` seconds; `RequestNotPermitted` when that would exceed
        `timeout` (default `timeout_duration`). The permits are spent whether or not
        they are used."""
        started = self.clock()
        grant = await send_async(self._client, self.acquire_pending(permits, timeout, key))
        return self.decide(grant, permits, started)

    async def acquire(self, permits: int = 1, *, key: Any = None,
                      timeout: float | None = None) -> None:
        """Take `permits` (waiting up to `timeout`, default `timeout_duration`, for them);
        raises `RequestNotPermitted`. `key`: the limiter's instance for that key."""
        wait = (await self.reserve(permits, key=key, timeout=timeout)).wait
        if wait > 0:
            self.waiting(1)
            try:
                await asyncio.sleep(wait)
            finally:
                self.waiting(-1)

    async def try_acquire(self, permits: int = 1, *, key: Any = None,
                          timeout: float | None = None) -> bool:
        """`acquire`, answering False instead of raising (Resilience4j's
        acquirePermission)."""
        try:
            await self.acquire(permits, key=key, timeout=timeout)
        except RequestNotPermitted:
            return False
        return True

    # -- the protected call ---------------------------------------------------------------
    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)` after taking one permit."""
        await self.acquire()
        return await fn(*args, **kwargs)

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "RateLimiter")

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        return None

    # -- operator actions and reads (Redis only: RedisUnavailable while it cannot answer) --
    async def _admin(self, args: list[str], key: Any = None) -> RateLimiterMetrics:
        with redis_unavailable_as(f"rate limiter {self.name!r}"):
            raw = await run_script_async(self._client, self._script, [self.bucket_key(key)],
                                         args)
        return self.metrics_of(raw)

    async def metrics(self, *, key: Any = None) -> RateLimiterMetrics:
        """Fleet-wide figures read from Redis, with this process's own."""
        return await self._admin(self.admin_args("metrics"), key)

    async def drain(self, *, key: Any = None) -> RateLimiterMetrics:
        """Spend every permit the bucket holds now, fleet-wide (Resilience4j's
        drainPermissions): the next ones come at the refill rate."""
        return await self._admin(self.admin_args("drain"), key)

    async def change_limit(self, limit_for_period: int | None = None,
                           limit_refresh_period: float | None = None,
                           burst: int | None = None, *, key: Any = None) -> RateLimiterMetrics:
        """Change the limit fleet-wide, at once: stored in Redis, it governs every worker
        (whatever its own config) until `reset_limit()` or the key expires. Fields left
        None keep the limit in force; a burst that equalled the limit follows it."""
        current = await self.metrics(key=key)
        return await self._admin(self.set_args(limit_for_period, limit_refresh_period, burst,
                                               current), key)

    async def change_limit_for_period(self, limit_for_period: int, *,
                                      key: Any = None) -> RateLimiterMetrics:
        """Resilience4j's changeLimitForPeriod, fleet-wide (see `change_limit`)."""
        return await self.change_limit(limit_for_period, key=key)

    async def reset_limit(self, *, key: Any = None) -> RateLimiterMetrics:
        """Drop an operator's limit: each worker's own config governs again."""
        return await self._admin(self.admin_args("unset"), key)

    async def reset(self, *, key: Any = None) -> None:
        """Forget the limiter in Redis: a full bucket, no counters, no operator limit."""
        with redis_unavailable_as(f"rate limiter {self.name!r}"):
            await self._client.delete(self.bucket_key(key))

    async def aclose(self) -> None:
        """Close the client this limiter built from a URL (a client given to it is yours)."""
        await self._clients.release()
