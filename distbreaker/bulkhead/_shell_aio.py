"""What the sync and asyncio bulkheads share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file. The front ends add
their clients, lease renewal (a thread, or loop timers), the per-process fallback
semaphore, and what a cancellation must hand back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .._runtime.blocks import TaskBlocks, ThreadBlocks
from .._runtime.connection import shared_async_client
from .._runtime.decorate import decorate_async
from .._runtime.health import UNAVAILABLE_ERRORS, redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.preflight import preflight_async
from .._runtime.scripts import Owed, PendingCall, ScriptCall, run_script_async
from .config import BulkheadConfig
from .core import Acquisition, BulkheadCore, BulkheadMetrics, BulkheadPermit

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("distbreaker")
#: How often releases an outage kept from Redis are tried again (when Redis is usable).
OWED_RETRY_EVERY = 0.02


class BulkheadShell(BulkheadCore):
    """The bulkhead's permits and protected call around the front end's own I/O."""

    #: This flavour's open ``with bulkhead:`` blocks (per thread, or per task).
    _blocks: ThreadBlocks | TaskBlocks
    #: The Redis client (asyncio: the running event loop's).
    _client: Any

    def __init__(self, name: str, redis: Any = None, config: BulkheadConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, redis, config, prefix, overrides)
        self._connect()

    # -- the front end's I/O --------------------------------------------------------
    def _connect(self) -> None:
        """Take the client of `self._target` (checking it now) and set up the rest."""
        raise NotImplementedError

    def _waiter(self) -> tuple[Any, float]:
        """The client BLPOP runs on (see `_waiting_client`), and the longest one BLPOP
        may block on it (kept per process, or per event loop)."""
        raise NotImplementedError

    def _waiting_client(self, client: Any) -> Any:
        """The client BLPOP runs on, for the commands' `client`.

        A URL-built client has a short socket timeout, so waiting gets its own
        client whose timeout outlasts the longest wait; a given client is used
        as is, each BLPOP bounded by its socket timeout.
        """
        if not self._owns_clients:
            return client
        return shared_async_client(self._target, self.config.redis_timeout,
                                   read_timeout=self.config.waiting_socket_timeout)

    def _renew_later(self, permit: BulkheadPermit) -> None:
        """Renew the lease of `permit` while its call runs (short calls never pay)."""
        raise NotImplementedError

    async def _cancel_interrupted(self, token: str) -> None:
        """Hand back the lease an interrupted acquire may have been granted."""
        raise NotImplementedError

    async def _acquire_local(self, attempt: Acquisition) -> BulkheadPermit:
        """A permit of the per-process fallback semaphore (Redis unreachable)."""
        raise NotImplementedError

    def _release_local(self) -> None:
        """Give a permit back to the fallback semaphore."""
        raise NotImplementedError

    async def _stop_renewing(self, permit: BulkheadPermit) -> None:
        """Stop renewing the lease of `permit`, after a renewal already in flight (so a
        release never races a renewal into a false "lost")."""
        raise NotImplementedError

    async def _send_release(self, permit: BulkheadPermit, pending: PendingCall) -> None:
        """Send the release script call `pending` of `permit`."""
        raise NotImplementedError

    def _fallback_in_use_now(self) -> int:
        """Permits of the fallback semaphore held now (in this process / event loop)."""
        raise NotImplementedError

    def _retry_owed_later(self) -> None:
        """Make sure `flush_owed_releases` runs every OWED_RETRY_EVERY seconds while
        releases are owed (a thread, or a task of the running loop)."""
        raise NotImplementedError

    async def _retry_owed(self) -> None:
        """Until nothing is owed: try the owed releases every OWED_RETRY_EVERY seconds."""
        while True:
            try:
                if not await self.flush_owed_releases():
                    return
            except Exception:
                logger.exception("bulkhead %r: sending an owed release failed", self.name)
            await asyncio.sleep(OWED_RETRY_EVERY)

    async def flush_owed_releases(self) -> int:
        """Send the releases an outage kept from Redis (each as soon as Redis is usable
        again); how many are still owed."""
        codec = self._codec
        for token in codec.owed_tokens():
            if not codec.health.usable():
                break
            try:
                await self._run(codec.cancel_call(token))
            except UNAVAILABLE_ERRORS as error:
                codec.health.failed(error)
                break
            codec.health.succeeded()
            codec.release_delivered(token)
        return codec.releases_owed

    async def _release_pending(self, permit: BulkheadPermit,
                               error: BaseException | None = None) -> PendingCall | None:
        """The local part of a release; the script call still owed to Redis, if any."""
        if permit.local:
            if self._codec.take_release(permit):
                self._release_local()
            return None
        await self._stop_renewing(permit)
        return self._codec.release_pending(permit, error)

    async def _run(self, call: ScriptCall) -> Any:
        return await run_script_async(self._client, self._codec.script, call.keys, call.args)

    # -- permits ------------------------------------------------------------------------
    async def acquire(self, priority: str | int | None = None) -> BulkheadPermit:
        """Take one permit (waiting up to max_wait_duration); raises BulkheadFull.

        Driving the bulkhead yourself: call ``check_lease(permit)`` immediately before
        invoking the protected function (it releases the permit and raises BulkheadFull
        when its lease ended while this process was paused, e.g. SIGSTOP or a long GC),
        then ``release(permit)``; `call()`, the decorator and ``with`` do both. The
        fleet then runs at most `max_concurrent_calls` plus the number of holders frozen
        *during* their calls past their lease (see docs/OPERATIONS.md)."""
        attempt = self._codec.begin_acquire(priority)
        if self._codec.releases_owed:  # (a Policy's pipelined release may have failed)
            self._retry_owed_later()
        if attempt.via_redis:
            try:
                await self._cancel_orphans(attempt)
                permit = await self._acquire_redis(attempt)
            except UNAVAILABLE_ERRORS as error:
                attempt.unavailable(error)
            except BaseException as error:
                if attempt.must_cancel(error):  # e.g. KeyboardInterrupt, or a cancellation
                    await self._cancel_interrupted(attempt.token)
                raise
            else:
                self._renew_later(permit)
                return permit
        return await self._acquire_local(attempt)

    async def _acquire_redis(self, attempt: Acquisition) -> BulkheadPermit:
        while (permit := attempt.answer(await self._run(attempt.request()))) is None:
            client, cap = self._waiter()
            seconds = attempt.block_for(cap)
            if seconds > 0:
                await client.blpop([self.keys.notify], timeout=seconds)
            else:  # the last stretch: Redis would end the BLPOP up to 100 ms late
                await asyncio.sleep(attempt.pause())
        return permit

    async def _cancel_orphans(self, attempt: Acquisition) -> None:
        """Cancel earlier acquires whose reply was lost. Redis failing here fails this
        acquire at once (one outage discovery per call, not one per request); the tokens
        not cancelled stay orphaned for the next acquire that reaches Redis."""
        for i, orphan in enumerate(attempt.orphans):
            try:
                await self._run(self._codec.cancel_call(orphan))
            except UNAVAILABLE_ERRORS:
                for token in attempt.orphans[i:]:
                    self._codec.orphan(token)
                raise
            except Exception as error:
                logger.debug("bulkhead %r: cancel failed: %r", self.name, error)

    async def _cancel(self, token: str) -> None:
        """Undo an interrupted acquire; best effort (leases and waiters expire anyway)."""
        try:
            await self._run(self._codec.cancel_call(token))
        except Exception as error:
            logger.debug("bulkhead %r: cancel failed: %r", self.name, error)

    async def owed_release(self, permit: BulkheadPermit,
                           error: BaseException | None = None) -> Owed | None:
        """Release locally now; the release call still owed to Redis (for a Policy to
        pipeline with others), or None. `error`: how the call ended (adaptive limits)."""
        pending = await self._release_pending(permit, error)
        return None if pending is None else Owed(self._client, pending)

    async def release(self, permit: BulkheadPermit, error: BaseException | None = None) -> None:
        """Give a permit back (idempotent). A lease found gone marks the permit lost.
        `error` (None: the call returned) is what an adaptive limit learns from."""
        pending = await self._release_pending(permit, error)
        if pending is not None:
            await self._send_release(permit, pending)
        if self._codec.releases_owed:
            self._retry_owed_later()

    # -- the protected call ---------------------------------------------------------------
    async def check_lease(self, permit: BulkheadPermit) -> None:
        """Call immediately before invoking the protected function: a permit whose lease
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
        self._blocks.push(self, permit)
        return permit

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self.release(self._blocks.pop(self), exc)

    async def restart_limit(self) -> None:
        """Slow start: an adaptive limit restarts at its minimum (a Policy does this when
        its breaker closes after a recovery). Does nothing for a fixed limit."""
        if self.config.adaptive is not None:
            with redis_unavailable_as(f"bulkhead {self.name!r}"):
                await self._run(self._codec.restart_call())

    async def check(self) -> None:
        """Raise `CheckFailed` (a `RedisUnavailable` naming the cause and its fix) unless
        Redis can serve this bulkhead: for an app that would rather fail at start-up than
        run on local fallbacks (a wrong URL, a replica, a missing ACL permission, a full
        Redis). Writes nothing; protected calls never raise it."""
        await preflight_async(self._client, f"bulkhead {self.name!r}", ("bulkhead",),
                              self.keys.leases, "")

    # -- metrics -------------------------------------------------------------------------
    async def metrics(self) -> BulkheadMetrics:
        """Fleet-wide figures read from Redis (RedisUnavailable while it cannot answer)."""
        with redis_unavailable_as(f"bulkhead {self.name!r}"):
            raw = await self._run(self._codec.metrics_call())
        return self._codec.metrics(raw, self._fallback_in_use_now())
