"""The asyncio circuit breaker front end: awaited I/O only, decisions in `breaker.core`.

The in-process fallback used while Redis is unreachable (fakeredis, microseconds,
no network) runs inline.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, NoReturn, ParamSpec, TypeVar

from .._runtime.classify import Outcome
from .._runtime.connection import (
    DEFAULT_URL,
    async_client,
    owns_client,
    release_async_client,
    shared_async_client,
)
from .._runtime.decorate import decorate_async
from .._runtime.health import redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.options import Seconds
from .._runtime.scripts import run_script_async, send_async
from .batching import LOOP_FLUSHERS
from .config import BreakerConfig
from .core import BreakerCore, BreakerMetrics, Permit, Reply, ScriptCall, Until, hold_args
from .state import State

P = ParamSpec("P")
T = TypeVar("T")

# Permits of the `async with breaker:` blocks open in the current task, innermost last.
# One module-level variable (ContextVars must not be created per instance: contexts keep
# them alive) holding an immutable tuple, so tasks spawned inside a block, which copy
# the context, can never pop their parent's permit.
_open_blocks: ContextVar[tuple[tuple[CircuitBreaker, Permit, float], ...]] = ContextVar(
    "distbreaker_aio_open_blocks", default=())


class CircuitBreaker(BreakerCore):
    """The asyncio twin of `distbreaker.CircuitBreaker`, sharing its state in Redis.

    Use as a decorator of coroutine functions, ``async with breaker:``, or
    ``await breaker.call(coro_fn, *args)``. `redis` is a URL or a
    ``redis.asyncio.Redis``; keyword arguments override fields of `config`.
    """

    def __init__(self, name: str, redis: Any = None, config: BreakerConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, config, prefix, overrides, redis)
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary())
        if self.config.batched:
            self._flusher = LOOP_FLUSHERS
            LOOP_FLUSHERS.attach(self)

    def _connect(self, redis: Any) -> Any:
        client = async_client(redis, self.config.redis_timeout)  # validates `redis` now
        self._given = None if owns_client(redis) else client
        self._url = DEFAULT_URL if redis is None else redis
        return client

    @property
    def client_url(self) -> str | None:
        return None if self._given is not None else self._url

    @property
    def given_async_client(self) -> Any:
        return self._given

    @property
    def _client(self) -> Any:
        """The Redis client for the running event loop.

        asyncio connections belong to the loop that opened them, and a breaker is
        typically created at import time (a decorator) and may serve several loops
        (one ``asyncio.run`` per test): a client built from a URL is kept per loop.
        A client passed in is used as given (the caller owns its loop binding).
        """
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        client = self._per_loop.get(loop)
        if client is None:
            client = self._per_loop[loop] = shared_async_client(
                self._url, self.config.redis_timeout)
        return client

    async def aclose(self) -> None:
        """Send the running loop's batched outcomes, then close its client if this breaker
        built it (a client given to it is yours)."""
        await self.flush()
        self._stop_watching()
        if self._given is None:
            client = self._per_loop.pop(asyncio.get_running_loop(), None)
            if client is not None:
                await release_async_client(client)

    async def _admin(self, call: ScriptCall) -> Reply:
        """Operator actions and reads go to Redis only: their errors are raised."""
        with redis_unavailable_as(f"circuit breaker {self.name!r}"):
            raw = await run_script_async(self._client, self._script, call.keys, call.args)
        return self._admin_reply(raw, call)

    # -- the protected call -------------------------------------------------------
    async def acquire(self) -> Permit:
        """Ask for permission to make one call; raises CallNotPermitted."""
        step = self._acquire_step()
        if step.call is None:
            return Permit()
        try:
            return await send_async(self._client, step.call)
        except asyncio.CancelledError as cancelled:
            # Redis may have granted a half-open probe before the reply was lost to the
            # cancellation (a timeout around the call): hand it back rather than leave the
            # slot taken until its lease expires. Outside HALF_OPEN this is a no-op.
            await self.record(Permit(step.token), cancelled, 0.0)
            raise

    async def record(self, permit: Permit, error: BaseException | None, duration: float,
                     outcome: Outcome | None = None) -> None:
        """Report how a permitted call ended (error None: it returned normally), awaiting
        the record; `outcome` overrides the breaker's own classification of `error`."""
        pending = self._record_pending(permit, error, duration, outcome)
        if pending is not None:
            with self._recording(error):
                await send_async(self._client, pending)

    async def check_lease(self, permit: Permit) -> None:
        """Await immediately before invoking the protected function: a probe whose lease
        already ended (this process was paused since `acquire`) is handed back, counted
        nowhere, and CallNotPermitted is raised instead of calling without a lease."""
        rejection = self.lease_rejection(permit)
        if rejection is not None:
            await self.record(permit, rejection, 0.0, Outcome.IGNORED)
            raise rejection

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)` under the breaker.

        A cancelled call (CancelledError) counts nowhere; its half-open probe,
        if it held one, is handed back.
        """
        permit = await self.acquire()
        await self.check_lease(permit)
        started = time.monotonic()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as error:
            await self.record(permit, error, time.monotonic() - started)
            raise
        await self.record(permit, None, time.monotonic() - started, self.result_outcome(result))
        return result

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "CircuitBreaker")

    async def __aenter__(self) -> CircuitBreaker:
        permit = await self.acquire()
        await self.check_lease(permit)
        _open_blocks.set((*_open_blocks.get(), (self, permit, time.monotonic())))
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        blocks = _open_blocks.get()
        index = max(i for i, block in enumerate(blocks) if block[0] is self)
        _, permit, started = blocks[index]
        _open_blocks.set(blocks[:index] + blocks[index + 1:])
        await self.record(permit, exc, time.monotonic() - started)

    async def flush(self) -> None:
        """Batched mode: send the running loop's pending outcomes now (all its breakers').

        Returns once they are recorded in Redis (or kept, Redis being unreachable).
        A no-op in exact mode, where every outcome is recorded by its call.
        """
        if self._flusher is not None:
            await LOOP_FLUSHERS.current().flush()

    # -- state, metrics, operator actions --------------------------------------------
    async def _read(self) -> Reply:
        return await self._admin(self._codec.state_call())

    async def get_state(self) -> State:
        """The fleet-wide state, read from Redis (OPEN becomes HALF_OPEN by time here too)."""
        return (await self._read()).state

    @property
    def state(self) -> NoReturn:
        """Not available here: a property cannot await Redis."""
        raise AttributeError("the asyncio breaker reads its state with `await breaker.get_state()`")

    async def metrics(self) -> BreakerMetrics:
        return self._codec.metrics(await self._read())

    async def _set(self, target: str, reason: str, actor: str, for_: Seconds | None = None,
             until: Until | None = None) -> State:
        call = self._codec.set_call(target, reason, actor, hold_args(for_, until))
        return (await self._admin(call)).state

    async def reset(self, reason: str = "reset", actor: str = "") -> State:
        """Back to CLOSED with an empty window; this process's config becomes the stored one."""
        return await self._set("RESET", reason, actor)

    async def trip(self, reason: str = "tripped", actor: str = "", *, for_: Seconds | None = None,
             until: Until | None = None) -> State:
        """Force OPEN now; probes start after the wait, or after ``for_`` seconds / at
        ``until`` (Resilience4j's transitionToOpenStateFor / Until). On an OPEN breaker
        the wait restarts (a `restart` history entry, not a transition)."""
        return await self._set("TRIP", reason, actor, for_, until)

    async def transition_to_closed(self, reason: str = "closed by operator", actor: str = "", *,
                             for_: Seconds | None = None, until: Until | None = None) -> State:
        """CLOSED; with ``for_`` / ``until`` held CLOSED (it does not trip) until then."""
        return await self._set(State.CLOSED.value, reason, actor, for_, until)

    async def transition_to_forced_open(self, reason: str = "forced open", actor: str = "", *,
                                  for_: Seconds | None = None,
                                  until: Until | None = None) -> State:
        """FORCED_OPEN; with ``for_`` / ``until`` it ends then, in HALF_OPEN (probes)."""
        return await self._set(State.FORCED_OPEN.value, reason, actor, for_, until)

    async def transition_to_disabled(self, reason: str = "disabled", actor: str = "", *,
                               for_: Seconds | None = None, until: Until | None = None) -> State:
        """DISABLED; with ``for_`` / ``until`` back to CLOSED then."""
        return await self._set(State.DISABLED.value, reason, actor, for_, until)

    async def transition_to_metrics_only(self, reason: str = "metrics only", actor: str = "", *,
                                   for_: Seconds | None = None,
                                   until: Until | None = None) -> State:
        """METRICS_ONLY; with ``for_`` / ``until`` back to CLOSED then."""
        return await self._set(State.METRICS_ONLY.value, reason, actor, for_, until)

    def __repr__(self) -> str:
        return f"aio.CircuitBreaker({self.name!r})"
