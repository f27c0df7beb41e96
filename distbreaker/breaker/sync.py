"""The synchronous circuit breaker front end: I/O only, decisions in `breaker.core`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from .._runtime.classify import Outcome
from .._runtime.connection import owns_client, release_sync_client, shared_sync_client
from .._runtime.decorate import decorate_sync
from .._runtime.health import redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.options import Seconds
from .._runtime.scripts import run_script, send
from .batching import THREAD_FLUSHER
from .config import BreakerConfig
from .core import BreakerCore, BreakerMetrics, Permit, Reply, ScriptCall, Until, hold_args
from .state import State

P = ParamSpec("P")
T = TypeVar("T")


class CircuitBreaker(BreakerCore):
    """A circuit breaker whose state is shared by every process using the same Redis.

    Use as a decorator, a context manager, or ``breaker.call(fn, *args)``.
    Keyword arguments override fields of `config` (a `BreakerConfig`).
    """

    def __init__(self, name: str, redis: Any = None, config: BreakerConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, config, prefix, overrides, redis)
        self._owns_client = owns_client(redis)
        self._tls = threading.local()
        if self.config.batched:
            self._flusher = THREAD_FLUSHER
            THREAD_FLUSHER.attach(self)

    def _connect(self, redis: Any) -> Any:
        # Built from a URL: the process's client of that URL, shared with its other users.
        self._client = shared_sync_client(redis, self.config.redis_timeout)
        return self._client

    @property
    def blocking_client(self) -> Any:
        return self._client

    def close(self) -> None:
        """Send this process's batched outcomes, then close the client this breaker built
        from a URL (a client given to it is yours)."""
        self.flush()
        self._stop_watching()
        if self._owns_client:
            self._owns_client = False  # let go once: the client may be shared
            release_sync_client(self._client)

    def _admin(self, call: ScriptCall) -> Reply:
        """Operator actions and reads go to Redis only: their errors are raised."""
        with redis_unavailable_as(f"circuit breaker {self.name!r}"):
            raw = run_script(self._client, self._script, call.keys, call.args)
        return self._admin_reply(raw, call)

    # -- the protected call -------------------------------------------------------
    def acquire(self) -> Permit:
        """Ask for permission to make one call; raises CallNotPermitted."""
        step = self._acquire_step()
        if step.call is None:
            return Permit()
        return send(self._client, step.call)

    def record(self, permit: Permit, error: BaseException | None, duration: float,
               outcome: Outcome | None = None) -> None:
        """Report how a permitted call ended (error None: it returned normally).

        `outcome` overrides the breaker's own classification of `error`.
        """
        pending = self._record_pending(permit, error, duration, outcome)
        if pending is not None:
            with self._recording(error):
                send(self._client, pending)

    def check_lease(self, permit: Permit) -> None:
        """Call immediately before invoking the protected function: a probe whose lease
        already ended (this process was paused since `acquire`) is handed back, counted
        nowhere, and CallNotPermitted is raised instead of calling without a lease."""
        rejection = self.lease_rejection(permit)
        if rejection is not None:
            self.record(permit, rejection, 0.0, Outcome.IGNORED)
            raise rejection

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)` under the breaker."""
        permit = self.acquire()
        self.check_lease(permit)
        started = time.monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            self.record(permit, error, time.monotonic() - started)
            raise
        self.record(permit, None, time.monotonic() - started, self.result_outcome(result))
        return result

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        return decorate_sync(self.call, fn, "CircuitBreaker")

    def __enter__(self) -> CircuitBreaker:
        stack = self._tls.__dict__.setdefault("stack", [])
        permit = self.acquire()
        self.check_lease(permit)
        stack.append((permit, time.monotonic()))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        permit, started = self._tls.stack.pop()
        self.record(permit, exc, time.monotonic() - started)

    def flush(self) -> None:
        """Batched mode: send this process's pending outcomes now (all sync breakers').

        Returns once they are recorded in Redis (or kept, Redis being unreachable).
        A no-op in exact mode, where every outcome is recorded by its call.
        """
        if self._flusher is not None:
            self._flusher.flush()

    # -- state, metrics, operator actions --------------------------------------------
    def _read(self) -> Reply:
        return self._admin(self._codec.state_call())

    @property
    def state(self) -> State:
        """The fleet-wide state, read from Redis (OPEN becomes HALF_OPEN by time here too)."""
        return self._read().state

    def get_state(self) -> State:
        """The same as `state`; the spelling the asyncio breaker must use (awaited)."""
        return self._read().state

    def metrics(self) -> BreakerMetrics:
        return self._codec.metrics(self._read())

    def _set(self, target: str, reason: str, actor: str, for_: Seconds | None = None,
             until: Until | None = None) -> State:
        call = self._codec.set_call(target, reason, actor, hold_args(for_, until))
        return self._admin(call).state

    def reset(self, reason: str = "reset", actor: str = "") -> State:
        """Back to CLOSED with an empty window; this process's config becomes the stored one."""
        return self._set("RESET", reason, actor)

    def trip(self, reason: str = "tripped", actor: str = "", *, for_: Seconds | None = None,
             until: Until | None = None) -> State:
        """Force OPEN now; probes start after the wait, or after ``for_`` seconds / at
        ``until`` (Resilience4j's transitionToOpenStateFor / Until). On an OPEN breaker
        the wait restarts (a `restart` history entry, not a transition)."""
        return self._set("TRIP", reason, actor, for_, until)

    def transition_to_closed(self, reason: str = "closed by operator", actor: str = "", *,
                             for_: Seconds | None = None, until: Until | None = None) -> State:
        """CLOSED; with ``for_`` / ``until`` held CLOSED (it does not trip) until then."""
        return self._set(State.CLOSED.value, reason, actor, for_, until)

    def transition_to_forced_open(self, reason: str = "forced open", actor: str = "", *,
                                  for_: Seconds | None = None,
                                  until: Until | None = None) -> State:
        """FORCED_OPEN; with ``for_`` / ``until`` it ends then, in HALF_OPEN (probes)."""
        return self._set(State.FORCED_OPEN.value, reason, actor, for_, until)

    def transition_to_disabled(self, reason: str = "disabled", actor: str = "", *,
                               for_: Seconds | None = None, until: Until | None = None) -> State:
        """DISABLED; with ``for_`` / ``until`` back to CLOSED then."""
        return self._set(State.DISABLED.value, reason, actor, for_, until)

    def transition_to_metrics_only(self, reason: str = "metrics only", actor: str = "", *,
                                   for_: Seconds | None = None,
                                   until: Until | None = None) -> State:
        """METRICS_ONLY; with ``for_`` / ``until`` back to CLOSED then."""
        return self._set(State.METRICS_ONLY.value, reason, actor, for_, until)

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r})"
