"""What the sync and asyncio policies share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file. The front ends add their
options (the asyncio `timeout`), how an adaptive limit restarts, the asyncio
shield around the owed Redis calls and what awaiting the fallback needs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

from .._runtime.classify import Outcome
from .._runtime.decorate import decorate_async
from .._runtime.health import UNAVAILABLE_ERRORS, one_discovery
from .._runtime.scripts import Owed, PendingCall, run_script_async, run_scripts_each_async
from ..breaker.aio import CircuitBreaker
from ..budget.aio import RetryBudget
from ..bulkhead.aio import Bulkhead
from ..ratelimiter.aio import RateLimiter
from ..retry.aio import Retry, run_flow
from .core import PolicyCore, Ran, group_ready, merged, settle, unreachable

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("distbreaker")


class PolicyShell(PolicyCore):
    """The policy's attempt and its Redis calls, around the front end's own I/O."""

    _kinds = (CircuitBreaker, Bulkhead, Retry, RetryBudget, RateLimiter)
    _sleep: Callable[[float], Awaitable[Any]]

    async def _within(self, awaitable: Awaitable[T], attempt: int) -> T:
        """The protected call's result (asyncio: cancelled after `timeout` seconds)."""
        raise NotImplementedError

    async def _fall_back(self, error: Exception) -> Any:
        """The fallback's answer to `error` (asyncio: a coroutine it returns is run first)."""
        raise NotImplementedError

    def _started(self) -> None:
        """A call starts (the asyncio policy remembers its event loop)."""

    # -- Redis -------------------------------------------------------------------------
    async def _flush(self, owed: Sequence[Owed | None]) -> None:
        """Send owed calls (see `_send`)."""
        await self._send(group_ready(owed))

    async def _send(self, groups: Sequence[tuple[Any, list[PendingCall]]]) -> None:
        """Per Redis client (one in all when shared): one merged call (lua/finish.lua),
        else one pipeline."""
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

    async def _restart_now(self) -> None:
        """Restart the adaptive limit low (see `_restart_limit`); Redis errors are logged."""
        try:
            await self.bulkhead.restart_limit()
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not restart the adaptive limit: %s", self.name,
                           failure)

    async def _trip(self, reason: str, for_: float | None = None) -> None:
        try:
            await self.breaker.trip(reason, for_=for_)
        except UNAVAILABLE_ERRORS as failure:
            logger.warning("policy %s: could not trip the breaker: %s", self.name, failure)

    # -- one attempt, then the protected call -------------------------------------------
    async def _attempt(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any,
                       attempt: int) -> T:
        with one_discovery():  # breaker, bulkhead and budget: one outage discovery
            return await self._attempt_once(fn, args, kwargs, attempt)

    async def _attempt_once(self, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any,
                            attempt: int) -> T:
        breaker, bulkhead, limiter = self.breaker, self.bulkhead, self.rate_limiter
        permit = await breaker.acquire() if breaker is not None else None
        try:  # Resilience4j's order: CircuitBreaker( RateLimiter( Bulkhead( call ) ) )
            if limiter is not None:
                await limiter.acquire(self.permits)
            slot = await bulkhead.acquire(self.priority) if bulkhead is not None else None
        except BaseException as refused:  # a rejection, or no answer: hand the probe back
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
            if breaker is not None:  # an operator's injected latency or error, if allowed
                await breaker.disturb()
            ran.ended(await self._within(fn(*args, **kwargs), attempt), None)
        except BaseException as error:
            ran.ended(None, error)
        error = self.settle_response(ran)
        release = await bulkhead.owed_release(slot, error) if slot is not None else None
        await self._flush(self.owed_after(ran, attempt, permit, release))
        reason = self.trip_reason(ran)
        if reason is not None:
            await self._trip(reason, self.trip_for(ran))
        return ran.unwrap()  # type: ignore[no-any-return]

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)` under the whole policy."""
        self._started()
        try:
            return await run_flow(self._flow(), functools.partial(self._attempt, fn, args, kwargs),
                                  self.budget, self._sleep)
        except Exception as error:
            if self.uses_fallback(error):
                return await self._fall_back(error)  # type: ignore[no-any-return]
            raise

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "Policy")

    async def aclose(self) -> None:
        """Close the components this policy built itself (batched outcomes sent,
        subscriptions and fault-injection feeds ended, goodbyes said); components given
        to it as instances are yours to close. The Redis client is shared: never closed
        here."""
        for component in self.owned:
            await component.aclose()

    async def check(self) -> None:
        """Each component's `check()`: raise `CheckFailed` (naming the cause and its fix)
        unless Redis can serve them all; for an app that would rather fail at start-up."""
        for part in (self.breaker, self.bulkhead, self.budget):
            if part is not None:
                await part.check()

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"
