"""The composed policy for asyncio (see distbreaker.policy for the semantics).

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
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

from .._runtime.classify import HttpClassifier, Outcome
from .._runtime.connection import async_client
from .._runtime.decorate import decorate_async
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed, PendingCall, run_script_async, run_scripts_each_async
from ..breaker.aio import CircuitBreaker
from ..budget.aio import RetryBudget
from ..bulkhead.aio import Bulkhead
from ..retry.aio import Retry, run_flow
from .core import (
    AttemptTimeout,
    Fallback,
    PolicyCore,
    Ran,
    check_timeout,
    group_ready,
    merged,
    settle,
    unreachable,
)

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("distbreaker")


class Policy(PolicyCore):
    """The asyncio twin of `distbreaker.Policy` (awaited `call`, coroutine decorator)."""

    _kinds = (CircuitBreaker, Bulkhead, Retry, RetryBudget)

    def __init__(self, name: str, redis: Any = None, *, breaker: Any = True,
                 bulkhead: Any = None, retry: Any = None, budget: Any = None,
                 fallback: Fallback | None = None, fallback_on_client_error: bool = False,
                 http_classifier: HttpClassifier | None = None,
                 prefix: str = DEFAULT_PREFIX,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 redis_timeout: float = 0.25, timeout: Any = None) -> None:
        self._setup(name, async_client(redis, redis_timeout), prefix,
                    (breaker, bulkhead, retry, budget), fallback, fallback_on_client_error,
                    http_classifier)
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

        async def restart() -> None:
            try:
                await self.bulkhead.restart_limit()
            except UNAVAILABLE_ERRORS as failure:
                logger.warning("policy %s: could not restart the adaptive limit: %s",
                               self.name, failure)

        def start() -> None:
            task = asyncio.ensure_future(restart())
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

    async def _send(self, groups: Sequence[tuple[Any, list[PendingCall]]]) -> None:
        """Per Redis client (one in all when shared): one merged call, else one pipeline."""
        first_error: Exception | None = None
        for client, ready in groups:
            try:
                await self._send_group(client, ready)
            except Exception as error:  # (foreign data) the other clients' calls still go
                first_error = first_error or error
        if first_error is not None:
            raise first_error

    @staticmethod
    async def _send_group(client: Any, ready: Sequence[PendingCall]) -> None:
        one = merged(ready)
        if one is not None:
            try:
                outcome: Any = await run_script_async(client, one.script, one.keys, one.args)
            except UNAVAILABLE_ERRORS as error:
                outcome = error
            if one.answered(outcome):
                return
        try:
            results = await run_scripts_each_async(client, [call.spec for call in ready])
        except UNAVAILABLE_ERRORS as error:
            unreachable(ready, error)
        else:
            settle(ready, results)

    async def _trip(self, reason: str) -> None:
        try:
            await self.breaker.trip(reason)
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not trip the breaker: %s", self.name, failure)

    async def _attempt(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any,
                       attempt: int) -> T:
        breaker, bulkhead = self.breaker, self.bulkhead
        permit = await breaker.acquire() if breaker is not None else None
        try:
            slot = await bulkhead.acquire(self.priority) if bulkhead is not None else None
        except BaseException as refused:  # BulkheadFull, or no answer: hand the probe back
            if breaker is not None:
                await breaker.record(permit, refused, 0.0, Outcome.IGNORED)
            raise
        refusal = self.lease_refusal(permit, slot)
        if refusal is not None:  # paused since acquiring: hand both back, do not call
            release = await bulkhead.owed_release(slot) if slot is not None else None
            record = None if breaker is None else breaker.owed_record(
                permit, refusal, 0.0, Outcome.IGNORED)
            await self._flush([release, record])
            raise refusal
        ran = Ran()
        try:
            ran.ended(await self._within(fn(*args, **kwargs), attempt), None)
        except BaseException as error:
            ran.ended(None, error)
        error = self.settle_response(ran)
        release = await bulkhead.owed_release(slot, error) if slot is not None else None
        await self._flush(self.owed_after(ran, attempt, permit, release))
        reason = self.trip_reason(ran)
        if reason is not None:
            await self._trip(reason)
        return ran.unwrap()  # type: ignore[no-any-return]

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

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)` under the whole policy."""
        self._loop = asyncio.get_running_loop()
        try:
            return await run_flow(self._flow(), functools.partial(self._attempt, fn, args, kwargs),
                                  self.budget, self._sleep)
        except Exception as error:
            if self.uses_fallback(error):
                result = self.fallback(error)  # type: ignore[misc]
                return await result if asyncio.iscoroutine(result) else result  # type: ignore[no-any-return]
            raise

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "Policy")

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"
