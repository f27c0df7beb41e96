"""The asyncio fleet-wide bulkhead: awaited I/O, lease renewal timers and one fallback
semaphore per event loop; every decision in `bulkhead.core`. The permits and the
protected call are in `_shell_aio.py` (the source scripts/unasync.py writes the sync
copy from).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from typing import Any

from .._runtime.blocks import TaskBlocks
from .._runtime.connection import async_client, release_async_client, shared_async_client
from .._runtime.scripts import PendingCall, send_async
from ._shell_aio import BulkheadShell, logger
from .core import Acquisition, BulkheadPermit, blocking_cap

__all__ = ["Bulkhead"]



class _PerLoop:
    """What belongs to one event loop: clients and the fallback semaphore."""

    def __init__(self, client: Any, fallback_limit: int) -> None:
        self.client = client
        self.blocking: Any = None
        self.blocking_cap = 0.0
        self.fallback = asyncio.Semaphore(fallback_limit)
        self.fallback_in_use = 0
        self.retrier: asyncio.Task[None] | None = None


class Bulkhead(BulkheadShell):
    """The asyncio twin of `distbreaker.Bulkhead`, sharing its permits in Redis.

    Use as a decorator of coroutine functions, ``async with bulkhead as permit:``,
    or ``await bulkhead.call(coro_fn, *args)``; or `acquire()` / `release()`.
    While Redis is unreachable the per-process fallback limit is enforced with
    an ``asyncio.Semaphore`` of ``config.effective_fallback_limit`` permits
    (one per event loop). Waiting never polls: it blocks on BLPOP of the
    notify list on a client whose socket timeout outlasts the wait.
    """

    # Permits of the `async with bulkhead:` blocks open in the current task.
    _blocks = TaskBlocks("distbreaker_aio_bulkhead_blocks", "async with bulkhead")

    def _connect(self) -> None:
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

    @property
    def _client(self) -> Any:
        return self._loop().client

    def _waiter(self) -> tuple[Any, float]:
        state = self._loop()
        if state.blocking is None:
            state.blocking = self._waiting_client(state.client)
            state.blocking_cap = blocking_cap(state.blocking)
        return state.blocking, state.blocking_cap

    async def _cancel_interrupted(self, token: str) -> None:
        # Cancelled (e.g. a timeout around the call): Redis may have granted the lease
        # before the reply was lost; hand it back now.
        await asyncio.shield(self._cancel(token))

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

    def _renew_later(self, permit: BulkheadPermit) -> None:
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
                keep = await send_async(self._client, pending)
            except Exception:
                logger.exception("bulkhead %r: lease renewal failed", self.name)
                keep = True
        if keep and permit in self._renewals:
            self._renew_later(permit)
        else:
            self._renewals.pop(permit, None)

    def _release_local(self) -> None:
        state = self._loop()
        state.fallback_in_use -= 1
        state.fallback.release()

    async def _stop_renewing(self, permit: BulkheadPermit) -> None:
        renewal = self._renewals.pop(permit, None)
        if renewal is not None:
            renewal.cancel()
            if isinstance(renewal, asyncio.Task):
                try:  # a renewal in flight ends first (no false "lost"); never swallow
                    await asyncio.wait([renewal])  # a cancellation of our own task
                except asyncio.CancelledError:
                    codec = self._codec
                    if codec.take_release(permit) and codec.health.usable():
                        self._in_background(self._cancel(permit.token))
                    raise

    def _retry_owed_later(self) -> None:
        """One task per event loop tries the owed releases until none is left."""
        state = self._loop()
        if state.retrier is None or state.retrier.done():
            state.retrier = asyncio.get_running_loop().create_task(self._retry_owed())

    def _in_background(self, work: Awaitable[None]) -> None:
        """Finish `work` (a release cut short by a cancellation) in a kept task."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_release(self, permit: BulkheadPermit, pending: PendingCall) -> None:
        try:
            await send_async(self._client, pending)
        except asyncio.CancelledError:
            # Cancelled mid-release: finish it in the background (cancel is idempotent
            # and counts nothing) rather than leave the permit taken until its lease ends.
            self._in_background(self._cancel(permit.token))
            raise

    def _fallback_in_use_now(self) -> int:
        return self._loop().fallback_in_use

    async def aclose(self) -> None:
        """Close the running loop's clients if this bulkhead built them (a client given
        to it is yours)."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is None or self._given is not None:
            return
        await release_async_client(state.client)
        if state.blocking is not None:
            await release_async_client(state.blocking)
