"""What the sync and asyncio circuit breakers share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; each front end adds
only its own I/O: clients, the acquire's send, `with` blocks, batching's flusher.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .._runtime.blocks import TaskBlocks, ThreadBlocks
from .._runtime.classify import Outcome
from .._runtime.decorate import decorate_async
from .._runtime.health import UNAVAILABLE_ERRORS, redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.options import Seconds
from .._runtime.preflight import preflight_async
from .._runtime.scripts import PendingCall, run_function_async, run_script_async, send_async
from ..errors import InjectedFault
from .config import BreakerConfig
from .core import (
    BreakerCore,
    BreakerMetrics,
    Permit,
    Reply,
    ScriptCall,
    Until,
    hold_args,
    logger,
)
from .state import State

P = ParamSpec("P")
T = TypeVar("T")


B = TypeVar("B", bound="BreakerShell")


class BreakerShell(BreakerCore):
    """The breaker's methods around its I/O (the front end supplies the rest)."""

    #: This flavour's batching flushers (`batching.THREAD_FLUSHER` or `LOOP_FLUSHERS`).
    _flushers: Any
    #: This flavour's open ``with breaker:`` blocks (per thread, or per task).
    _blocks: ThreadBlocks | TaskBlocks

    def __init__(self, name: str, redis: Any = None, config: BreakerConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, config, prefix, overrides, redis)
        if self.config.batched:
            self._flusher = self._flushers
            self._flushers.attach(self)
        if self.config.allow_fault_injection:
            self._allow_faults(prefix)

    def _connect(self, redis: Any) -> Any:
        """Take the client of `redis` (a URL, a client or None), checking it now, and
        return it (the keys name its database)."""
        raise NotImplementedError

    async def _send_acquire(self, call: PendingCall, token: str) -> Permit:
        """Send the acquire script `call` asking for probe lease `token` (the asyncio
        breaker hands back a probe granted to a cancelled call)."""
        raise NotImplementedError

    async def _release_client(self) -> None:
        """Let go of the client this breaker built from a URL (not a given one)."""
        raise NotImplementedError

    async def _admin(self, call: ScriptCall) -> Reply:
        """Operator actions and reads go to Redis only: their errors are raised."""
        with redis_unavailable_as(f"circuit breaker {self.name!r}"):
            raw = await run_script_async(self._client, self._script, call.keys, call.args)
        return self._admin_reply(raw, call)

    async def check(self) -> None:
        """Raise `CheckFailed` (a `RedisUnavailable` naming the cause and its fix) unless
        Redis can serve this breaker: for an app that would rather fail at start-up than
        run on local fallbacks (a wrong URL, a replica, a missing ACL permission, a full
        Redis). Writes nothing; protected calls never raise it."""
        await preflight_async(self._client, f"circuit breaker {self.name!r}", ("breaker",),
                              self.keys.state, self.keys.channel)

    async def aclose(self) -> None:
        """Send the batched outcomes (asyncio: the running loop's), then close the client
        this breaker built from a URL (a client given to it is yours)."""
        await self.flush()
        self._stop_watching()
        self._leave_faults()
        await self._goodbye()
        await self._release_client()

    async def _goodbye(self) -> None:
        """Leave the rollout hash (best effort: a worker that cannot say goodbye counts
        as running its config for a minute after its last hello)."""
        if not self._codec.said_hello:
            return
        call = self._codec.goodbye_call()
        try:
            await run_script_async(self._client, self._script, call.keys, call.args)
        except Exception:  # a goodbye must never fail a close
            logger.debug("circuit breaker %s: goodbye not sent", self.name, exc_info=True)

    async def flush(self) -> None:
        """Batched mode: send the pending outcomes now (all breakers' of this flavour:
        the process's sync ones, or the running loop's asyncio ones).

        Returns once they are recorded in Redis (or kept, Redis being unreachable).
        A no-op in exact mode, where every outcome is recorded by its call.
        """
        if self._flusher is not None:
            await self._flusher.current().flush()

    # -- the protected call -------------------------------------------------------
    async def acquire(self) -> Permit:
        """Ask for permission to make one call; raises CallNotPermitted.

        Driving the breaker yourself: call ``check_lease(permit)`` immediately before
        invoking the protected function (it raises CallNotPermitted when a half-open
        probe's lease ended while this process was paused, e.g. SIGSTOP or a long GC),
        then ``record(permit, error, duration)``; `call()` and the decorator do both.
        Without the check, a process paused past its lease may probe beside the probe
        that took its slot: more than `permitted_calls_in_half_open` at once."""
        feed = self._fault_feed
        if feed is not None:
            injected = self._injected_rejection(feed)
            if injected is not None:
                raise injected
        step = self._acquire_step()
        if step.call is None:
            return Permit()
        return await self._send_acquire(step.call, step.token)

    async def record(self, permit: Permit, error: BaseException | None, duration: float,
                     outcome: Outcome | None = None) -> None:
        """Report how a permitted call ended (error None: it returned normally).

        `outcome` overrides the breaker's own classification of `error`.
        """
        compact = self._compact_args(permit, error, duration, outcome)
        if compact is not None:  # the usual success: ARGV {fingerprint, ms}
            try:
                raw = await run_function_async(self._client, self._script,
                                               (self._codec.keys.state,), compact)
            except UNAVAILABLE_ERRORS as unavailable:
                self._compact_unavailable(permit, duration, unavailable)
                return
            if self._compact_done(raw):
                return
        pending = self._record_pending(permit, error, duration, outcome)
        if pending is not None:
            with self._recording(error):
                await send_async(self._client, pending)

    async def check_lease(self, permit: Permit) -> None:
        """Call immediately before invoking the protected function: a probe whose lease
        already ended (this process was paused since `acquire`) is handed back, counted
        nowhere, and CallNotPermitted is raised instead of calling without a lease."""
        rejection = self.lease_rejection(permit)
        if rejection is not None:
            await self.record(permit, rejection, 0.0, Outcome.IGNORED)
            raise rejection
        if self._fault_feed is not None:
            try:
                await self.disturb()
            except InjectedFault as fault:
                await self.record(permit, fault, 0.0)
                raise

    async def disturb(self) -> None:
        """Apply an operator's injected latency, then error, to the call about to run
        (`distbreaker inject`; only with allow_fault_injection): sleeps, raises
        `InjectedFault`. `check_lease` does it; a caller recording outcomes itself (a
        Policy) calls it where the protected function would start."""
        disturbance = self._disturbance()
        if disturbance.latency:
            await asyncio.sleep(disturbance.latency)
        if disturbance.error is not None:
            raise self._injected_error(disturbance.error)

    async def __aenter__(self: B) -> B:
        permit = await self.acquire()
        await self.check_lease(permit)
        self._blocks.push(self, (permit, time.monotonic()))
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        permit, started = self._blocks.pop(self)
        await self.record(permit, exc, time.monotonic() - started)

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)` under the breaker.

        A cancelled call (asyncio's CancelledError) counts nowhere; its half-open probe,
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

    # -- state, metrics, operator actions --------------------------------------------
    async def _read(self) -> Reply:
        return await self._admin(self._codec.state_call())

    async def get_state(self) -> State:
        """The fleet-wide state, read from Redis (OPEN becomes HALF_OPEN by time here too)."""
        return (await self._read()).state

    async def metrics(self) -> BreakerMetrics:
        return self._codec.metrics(await self._read())

    async def _set(self, target: str, reason: str, actor: str, for_: Seconds | None = None,
                   until: Until | None = None) -> State:
        call = self._codec.set_call(target, reason, actor, hold_args(for_, until))
        return (await self._admin(call)).state

    async def reset(self, reason: str = "reset", actor: str = "") -> State:
        """Back to CLOSED with an empty window; this process's config becomes the stored one."""
        return await self._set("RESET", reason, actor)

    async def adopt_config(self, reason: str = "config adopted", actor: str = "") -> State:
        """Make this object's config the one in force (an operator's `distbreaker config
        adopt`): it counts as the newest deployment; the window is kept unless the
        window's shape changes; the state is kept."""
        return await self._set("ADOPT", reason, actor)

    async def trip(self, reason: str = "tripped", actor: str = "", *,
                   for_: Seconds | None = None, until: Until | None = None) -> State:
        """Force OPEN now; probes start after the wait, or after ``for_`` seconds / at
        ``until`` (Resilience4j's transitionToOpenStateFor / Until). On an OPEN breaker
        the wait restarts (a `restart` history entry, not a transition)."""
        return await self._set("TRIP", reason, actor, for_, until)

    async def transition_to_closed(self, reason: str = "closed by operator", actor: str = "",
                                   *, for_: Seconds | None = None,
                                   until: Until | None = None) -> State:
        """CLOSED; with ``for_`` / ``until`` held CLOSED (it does not trip) until then."""
        return await self._set(State.CLOSED.value, reason, actor, for_, until)

    async def transition_to_forced_open(self, reason: str = "forced open", actor: str = "", *,
                                        for_: Seconds | None = None,
                                        until: Until | None = None) -> State:
        """FORCED_OPEN; with ``for_`` / ``until`` it ends then, in HALF_OPEN (probes)."""
        return await self._set(State.FORCED_OPEN.value, reason, actor, for_, until)

    async def transition_to_disabled(self, reason: str = "disabled", actor: str = "", *,
                                     for_: Seconds | None = None,
                                     until: Until | None = None) -> State:
        """DISABLED; with ``for_`` / ``until`` back to CLOSED then."""
        return await self._set(State.DISABLED.value, reason, actor, for_, until)

    async def transition_to_metrics_only(self, reason: str = "metrics only", actor: str = "",
                                         *, for_: Seconds | None = None,
                                         until: Until | None = None) -> State:
        """METRICS_ONLY; with ``for_`` / ``until`` back to CLOSED then."""
        return await self._set(State.METRICS_ONLY.value, reason, actor, for_, until)
