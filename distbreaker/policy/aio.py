"""The composed policy for asyncio (see distbreaker.policy for the semantics).

The attempt and its Redis calls are in `_shell_aio.py` (the source scripts/unasync.py
writes the sync copy from); this module adds the timeout and the shield.

`timeout` (seconds) bounds each attempt: the call is cancelled when it runs out
(its own cleanup runs), recorded by the breaker as a failure (slow too when the
timeout exceeds slow_call_duration: the recorded duration is the time it ran),
then raised as `AttemptTimeout`, a `TimeoutError`, which the retry retries like
any transient error. The timeout covers the protected call only, not the
bulkhead's wait for a permit (max_wait_duration bounds that) nor the Redis calls.

Built from a URL, the components share one ``redis.asyncio`` client, which
binds to the event loop that first uses it: give your own components to a
policy that must serve several loops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .._runtime.classify import HttpClassifier
from .._runtime.connection import async_client
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed
from ._shell_aio import PolicyShell
from .core import AttemptTimeout, Fallback, check_timeout, group_ready

T = TypeVar("T")


class Policy(PolicyShell):
    """The asyncio twin of `distbreaker.Policy` (awaited `call`, coroutine decorator)."""

    def __init__(self, name: str, redis: Any = None, *, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 rate_limiter: Any = None, fallback: Fallback | None = None,
                 fallback_on_client_error: bool = False,
                 http_classifier: HttpClassifier | None = None,
                 prefix: str = DEFAULT_PREFIX,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 redis_timeout: float = 0.25, timeout: Any = None) -> None:
        self._setup(name, async_client(redis, redis_timeout), prefix,
                    (breaker, bulkhead, retry, budget, rate_limiter), fallback,
                    fallback_on_client_error, http_classifier)
        self._sleep = sleep
        self.timeout = check_timeout(timeout)
        self._background: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _restart_limit(self) -> None:
        """Called from the reply handling (in the loop) or the events thread: the restart
        runs as a task of the loop the policy last ran in."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def start() -> None:
            task = asyncio.ensure_future(self._restart_now())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        loop.call_soon_threadsafe(start)

    async def _flush(self, owed: Sequence[Owed | None]) -> None:
        """Send owed calls, shielded: a cancellation (e.g. a timeout around the call)
        that lands here still releases the bulkhead permit, hands back a half-open
        probe and records the outcome, in the background, then is raised."""
        groups = group_ready(owed)
        if not groups:
            return
        task = asyncio.ensure_future(self._send(groups))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            raise

    async def _within(self, awaitable: Awaitable[T], attempt: int) -> T:
        """Await `awaitable`, cancelled after `timeout` seconds (AttemptTimeout)."""
        timeout = self.timeout
        if timeout is None:
            return await awaitable
        scope_factory = getattr(asyncio, "timeout", None)
        if scope_factory is None:  # Python 3.10: its asyncio.TimeoutError is its own class
            try:
                return await asyncio.wait_for(awaitable, timeout)
            except asyncio.TimeoutError as expired:
                raise AttemptTimeout(self.name, timeout, attempt) from expired
        try:
            async with scope_factory(timeout) as scope:
                return await awaitable
        except TimeoutError as expired:
            if scope.expired():  # ours, not a TimeoutError the call raised itself
                raise AttemptTimeout(self.name, timeout, attempt) from expired
            raise

    def _started(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def _fall_back(self, error: Exception) -> Any:
        result = self.fallback(error)  # type: ignore[misc]
        return await result if asyncio.iscoroutine(result) else result
