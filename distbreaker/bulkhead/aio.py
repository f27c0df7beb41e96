"""The asyncio fleet-wide bulkhead: awaited I/O, lease renewal timers and one fallback
semaphore per event loop; every decision in `bulkhead.core`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from .._runtime.connection import async_client, release_async_client, shared_async_client
from .._runtime.decorate import decorate_async
from .._runtime.health import UNAVAILABLE_ERRORS, redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed, PendingCall, ScriptCall, run_script_async, send_async
from .config import BulkheadConfig
from .core import Acquisition, BulkheadCore, BulkheadMetrics, BulkheadPermit, blocking_cap

__all__ = ["Bulkhead"]

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("distbreaker")

# Permits of the `async with bulkhead:` blocks open in the current task, innermost last
# (one module-level variable holding an immutable tuple, as in breaker/aio.py).
_open_blocks: ContextVar[tuple[tuple[Bulkhead, BulkheadPermit], ...]] = ContextVar(
    "distbreaker_aio_bulkhead_blocks", default=())


class _PerLoop:
    """What belongs to one event loop: clients and the fallback semaphore."""

    def __init__(self, client: Any, fallback_limit: int) -> None:
        self.client = client
        self.blocking: Any = None
        self.blocking_cap = 0.0
        self.fallback = asyncio.Semaphore(fallback_limit)
        self.fallback_in_use = 0


class Bulkhead(BulkheadCore):
    """The asyncio twin of `distbreaker.Bulkhead`, sharing its permits in Redis.

    Use as a decorator of coroutine functions, ``async with bulkhead as permit:``,
    or ``await bulkhead.call(coro_fn, *args)``; or `acquire()` / `release()`.
    While Redis is unreachable the per-process fallback limit is enforced with
    an ``asyncio.Semaphore`` of ``config.effective_fallback_limit`` permits
    (one per event loop). Waiting never polls: it blocks on BLPOP of the
    notify list on a client whose socket timeout outlasts the wait.
    """

    def __init__(self, name: str, redis: Any = None, config: BulkheadConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, redis, config, prefix, overrides)
        client = async_client(self._target, self.config.redis_timeout)  # validates `redis`
        self._given = None if self._owns_clients else client
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _PerLoop] = (
            weakref.WeakKeyDictionary())
        # Per held permit: the timer of its next renewal, or the renewal in flight.
        self._renewals: dict[BulkheadPermit, asyncio.TimerHandle | asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    def _loop(self) -> _PerLoop:
        """Clients are bound to the loop that opened them: keep one set per running loop."""
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            client = self._given or shared_async_client(self._target, self.config.redis_timeout)
            state = self._loops[loop] = _PerLoop(client, self.config.effective_fallback_limit)
        return state

    def _waiter(self, state: _PerLoop) -> tuple[Any, float]:
        """The client BLPOP runs on (see `distbreaker.Bulkhead._waiter`) and its bound."""
        if state.blocking is None:
            if self._owns_clients:
                state.blocking = shared_async_client(
                    self._target, self.config.redis_timeout,
                    read_timeout=self.config.waiting_socket_timeout)
            else:
                state.blocking = state.client
            state.blocking_cap = blocking_cap(state.blocking)
        return state.blocking, state.blocking_cap

    async def _run(self, call: ScriptCall) -> Any:
        return await run_script_async(self._loop().client, self._codec.script, call.keys,
                                      call.args)

    # -- permits ------------------------------------------------------------------------
    async def acquire(self, priority: str | int | None = None) -> BulkheadPermit:
        """Take one permit (waiting up to max_wait_duration); raises BulkheadFull."""
        attempt = self._codec.begin_acquire(priority)
        if attempt.via_redis:
            for orphan in attempt.orphans:
                await self._cancel(orphan)
            try:
                permit = await self._acquire_redis(attempt)
            except UNAVAILABLE_ERRORS as error:
                attempt.unavailable(error)
            except BaseException as error:
                if attempt.must_cancel(error):
                    # Cancelled (e.g. a timeout around the call): Redis may have granted
                    # the lease before the reply was lost; hand it back now.
                    await asyncio.shield(self._cancel(attempt.token))
                raise
            else:
                self._schedule_renewal(permit)
                return permit
        return await self._acquire_local(attempt)

    async def _acquire_redis(self, attempt: Acquisition) -> BulkheadPermit:
        while (permit := attempt.answer(await self._run(attempt.request()))) is None:
            client, cap = self._waiter(self._loop())
            await client.blpop([self.keys.notify], timeout=attempt.block_for(cap))
        return permit

    async def _cancel(self, token: str) -> None:
        """Undo an interrupted acquire; best effort (leases and waiters expire anyway)."""
        try:
            await self._run(self._codec.cancel_call(token))
        except Exception as error:
            logger.debug("bulkhead %r: cancel failed: %r", self.name, error)

    async def _acquire_local(self, attempt: Acquisition) -> BulkheadPermit:
        state = self._loop()
        remaining = attempt.remaining()
        try:
            if remaining <= 0:
                if state.fallback.locked():
                    raise asyncio.TimeoutError
                await state.fallback.acquire()
            else:
                await asyncio.wait_for(state.fallback.acquire(), remaining)
        except asyncio.TimeoutError:
            raise attempt.local_full(state.fallback_in_use) from None
        state.fallback_in_use += 1
        return attempt.local_permit()

    def _schedule_renewal(self, permit: BulkheadPermit) -> None:
        """A timer, not a task: short calls never pay for their renewal."""
        self._renewals[permit] = asyncio.get_running_loop().call_later(
            self.config.renew_interval, self._start_renewal, permit)

    def _start_renewal(self, permit: BulkheadPermit) -> None:
        if permit in self._renewals:
            self._renewals[permit] = asyncio.get_running_loop().create_task(self._renew(permit))

    async def _renew(self, permit: BulkheadPermit) -> None:
        keep = False
        pending = self._codec.renew_pending(permit)
        if pending is not None:
            try:
                keep = await send_async(self._loop().client, pending)
            except Exception:
                logger.exception("bulkhead %r: lease renewal failed", self.name)
                keep = True
        if keep and permit in self._renewals:
            self._schedule_renewal(permit)
        else:
            self._renewals.pop(permit, None)

    async def _release_pending(self, permit: BulkheadPermit,
                               error: BaseException | None = None) -> PendingCall | None:
        """The local part of a release; the script call still owed to Redis, if any."""
        codec = self._codec
        if permit.local:
            if codec.take_release(permit):
                state = self._loop()
                state.fallback_in_use -= 1
                state.fallback.release()
            return None
        renewal = self._renewals.pop(permit, None)
        if renewal is not None:
            renewal.cancel()
            if isinstance(renewal, asyncio.Task):
                try:  # a renewal in flight ends first (no false "lost"); never swallow
                    await asyncio.wait([renewal])  # a cancellation of our own task
                except asyncio.CancelledError:
                    if codec.take_release(permit) and codec.health.usable():
                        self._in_background(self._cancel(permit.token))
                    raise
        return codec.release_pending(permit, error)

    def _in_background(self, work: Awaitable[None]) -> None:
        """Finish `work` (a release cut short by a cancellation) in a kept task."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def owed_release(self, permit: BulkheadPermit,
                           error: BaseException | None = None) -> Owed | None:
        """Release locally now; the release call still owed to Redis (for a Policy to
        pipeline with others), or None. `error`: how the call ended (adaptive limits)."""
        pending = await self._release_pending(permit, error)
        return None if pending is None else Owed(self._loop().client, pending)

    async def release(self, permit: BulkheadPermit,
                      error: BaseException | None = None) -> None:
        """Give a permit back (idempotent). A lease found gone marks the permit lost.
        `error` (None: the call returned) is what an adaptive limit learns from."""
        pending = await self._release_pending(permit, error)
        if pending is None:
            return
        try:
            await send_async(self._loop().client, pending)
        except asyncio.CancelledError:
            # Cancelled mid-release: finish it in the background (cancel is idempotent
            # and counts nothing) rather than leave the permit taken until its lease ends.
            self._in_background(self._cancel(permit.token))
            raise

    # -- the protected call ---------------------------------------------------------------
    async def check_lease(self, permit: BulkheadPermit) -> None:
        """Await immediately before invoking the protected function: a permit whose lease
        already ended (this process was paused since `acquire`) is released and
        BulkheadFull (with a `reason`) raised instead of calling without a permit."""
        refusal = self.lease_rejection(permit)
        if refusal is not None:
            await self.release(permit)
            raise refusal

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)` holding a permit."""
        permit = await self.acquire()
        await self.check_lease(permit)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as error:
            await self.release(permit, error)
            raise
        await self.release(permit)
        return result

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "Bulkhead")

    async def __aenter__(self) -> BulkheadPermit:
        permit = await self.acquire()
        await self.check_lease(permit)
        _open_blocks.set((*_open_blocks.get(), (self, permit)))
        return permit

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        blocks = _open_blocks.get()
        for i in range(len(blocks) - 1, -1, -1):
            if blocks[i][0] is self:
                _open_blocks.set(blocks[:i] + blocks[i + 1:])
                await self.release(blocks[i][1], exc)
                return
        raise RuntimeError("async with bulkhead: exit without a matching enter in this task")

    async def restart_limit(self) -> None:
        """Slow start: an adaptive limit restarts at its minimum (a Policy does this when
        its breaker closes after a recovery). Does nothing for a fixed limit."""
        if self.config.adaptive is not None:
            with redis_unavailable_as(f"bulkhead {self.name!r}"):
                await self._run(self._codec.restart_call())

    # -- metrics -------------------------------------------------------------------------
    async def metrics(self) -> BulkheadMetrics:
        """Fleet-wide figures read from Redis (RedisUnavailable while it cannot answer)."""
        with redis_unavailable_as(f"bulkhead {self.name!r}"):
            raw = await self._run(self._codec.metrics_call())
        return self._codec.metrics(raw, self._loop().fallback_in_use)

    async def aclose(self) -> None:
        """Close the running loop's clients if this bulkhead built them (a client given
        to it is yours)."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is None or self._given is not None:
            return
        await release_async_client(state.client)
        if state.blocking is not None:
            await release_async_client(state.blocking)
