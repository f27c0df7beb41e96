"""The synchronous fleet-wide bulkhead: blocking I/O, the lease renewal thread and the
per-process fallback semaphore; every decision in `bulkhead.core`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from .._runtime import forking
from .._runtime.connection import release_sync_client, shared_sync_client
from .._runtime.decorate import decorate_sync
from .._runtime.health import UNAVAILABLE_ERRORS, redis_unavailable_as
from .._runtime.keys import DEFAULT_PREFIX
from .._runtime.scripts import Owed, PendingCall, ScriptCall, run_script, send
from .config import BulkheadConfig
from .core import Acquisition, BulkheadCore, BulkheadMetrics, BulkheadPermit, blocking_cap

__all__ = ["Bulkhead", "BulkheadConfig", "BulkheadMetrics", "BulkheadPermit"]

P = ParamSpec("P")
T = TypeVar("T")
logger = logging.getLogger("distbreaker")

#: A renewal thread with nothing to renew exits after this many seconds.
_RENEWER_IDLE_EXIT = 5.0


class _Renewer:
    """One daemon thread per bulkhead that renews the leases of long calls.

    Short calls never reach their first renewal, so they cost no round trip.
    After a fork the child starts afresh (its parent's permits are not its own).
    `remove()` waits for a renewal of that permit already in flight, so a
    release never races a renewal into a false "lost".
    """

    def __init__(self, renew: Callable[[BulkheadPermit], bool], interval: float) -> None:
        self._renew = renew
        self._interval = interval
        self._pid = -1
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._due: dict[BulkheadPermit, float] = {}
        self._current: BulkheadPermit | None = None
        self._thread: threading.Thread | None = None

    def add(self, permit: BulkheadPermit) -> None:
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            self._due[permit] = time.monotonic() + self._interval
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="distbreaker-bulkhead-renewer")
                self._thread.start()
            self._cond.notify()

    def remove(self, permit: BulkheadPermit) -> None:
        if self._pid != os.getpid():
            return
        with self._cond:
            self._due.pop(permit, None)
            while self._current is permit:
                self._cond.wait()

    def _next(self) -> BulkheadPermit | None:
        """Wait for the next due permit (called holding the lock); None: exit."""
        while True:
            if not self._due:
                if not self._cond.wait(_RENEWER_IDLE_EXIT) and not self._due:
                    self._thread = None
                    return None
                continue
            permit, due = min(self._due.items(), key=lambda item: item[1])
            delay = due - time.monotonic()
            if delay <= 0:
                self._due[permit] = time.monotonic() + self._interval
                self._current = permit
                return permit
            self._cond.wait(delay)

    def _run(self) -> None:
        while True:
            with self._cond:
                permit = self._next()
            if permit is None:
                return
            keep = True
            try:
                keep = self._renew(permit)
            except Exception:
                logger.exception("bulkhead lease renewal failed")
            with self._cond:
                self._current = None
                if not keep:
                    self._due.pop(permit, None)
                self._cond.notify_all()


class Bulkhead(BulkheadCore):
    """At most `max_concurrent_calls` calls at once across every process sharing Redis.

    Use as a decorator, a context manager (``with bulkhead as permit:``), or
    ``bulkhead.call(fn, *args)``; or `acquire()` a permit and `release()` it.
    Keyword arguments override fields of `config` (a `BulkheadConfig`).

    A full bulkhead raises `BulkheadFull` at once (``max_wait_duration=0``) or
    after waiting up to ``max_wait_duration`` for a release. Every permit is a
    lease renewed while its call runs; a renewal that finds its lease gone sets
    ``permit.lost`` and logs a warning.

    While Redis is unreachable (retried with backoff), calls are limited per
    process by a local semaphore of ``config.effective_fallback_limit``
    permits: ``max(1, max_concurrent_calls // expected_workers)`` unless
    `fallback_limit` is given (0: reject while Redis is down). Leases held
    when Redis went away expire on their own within one lease.
    """

    def __init__(self, name: str, redis: Any = None, config: BulkheadConfig | None = None, *,
                 prefix: str = DEFAULT_PREFIX, **overrides: Any) -> None:
        super().__init__(name, redis, config, prefix, overrides)
        self._client = shared_sync_client(self._target, self.config.redis_timeout)
        self._blocking: Any = None
        self._blocking_cap = 0.0
        self._let_go = False
        self._lock = threading.Lock()
        self._renewer = _Renewer(self._renew, self.config.renew_interval)
        self._tls = threading.local()
        self._fallback_pid = -1
        self._fallback = threading.Semaphore(0)
        self._fallback_in_use = 0
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the renewer and the local semaphore
        notice the new pid themselves; the parent's permits are not the child's)."""
        self._lock = threading.Lock()

    # -- I/O ------------------------------------------------------------------------
    def _run(self, call: ScriptCall) -> Any:
        return run_script(self._client, self._codec.script, call.keys, call.args)

    def _waiter(self) -> tuple[Any, float]:
        """The client BLPOP runs on, and the longest one BLPOP may block on it.

        A URL-built client has a short socket timeout, so waiting gets its own
        client whose timeout outlasts the longest wait; a given client is used
        as is, each BLPOP bounded by its socket timeout.
        """
        with self._lock:
            if self._blocking is None:
                if self._owns_clients:
                    self._blocking = shared_sync_client(
                        self._target, self.config.redis_timeout,
                        read_timeout=self.config.waiting_socket_timeout)
                else:
                    self._blocking = self._client
                self._blocking_cap = blocking_cap(self._blocking)
            return self._blocking, self._blocking_cap

    def _renew(self, permit: BulkheadPermit) -> bool:
        pending = self._codec.renew_pending(permit)
        return pending is not None and send(self._client, pending)

    # -- permits ------------------------------------------------------------------------
    def acquire(self, priority: str | int | None = None) -> BulkheadPermit:
        """Take one permit (waiting up to max_wait_duration); raises BulkheadFull."""
        attempt = self._codec.begin_acquire(priority)
        if attempt.via_redis:
            for orphan in attempt.orphans:
                self._cancel(orphan)
            try:
                permit = self._acquire_redis(attempt)
            except UNAVAILABLE_ERRORS as error:
                attempt.unavailable(error)
            except BaseException as error:
                if attempt.must_cancel(error):
                    self._cancel(attempt.token)  # e.g. KeyboardInterrupt while waiting
                raise
            else:
                self._renewer.add(permit)
                return permit
        return self._acquire_local(attempt)

    def _acquire_redis(self, attempt: Acquisition) -> BulkheadPermit:
        while (permit := attempt.answer(self._run(attempt.request()))) is None:
            client, cap = self._waiter()
            client.blpop([self.keys.notify], timeout=attempt.block_for(cap))
        return permit

    def _cancel(self, token: str) -> None:
        """Undo an interrupted acquire; best effort (leases and waiters expire anyway)."""
        try:
            self._run(self._codec.cancel_call(token))
        except Exception as error:
            logger.debug("bulkhead %r: cancel failed: %r", self.name, error)

    def _fallback_semaphore(self) -> threading.Semaphore:
        """The per-process semaphore used while Redis is unreachable (fresh after a fork)."""
        if self._fallback_pid != os.getpid():
            with self._lock:
                if self._fallback_pid != os.getpid():
                    self._fallback = threading.Semaphore(self.config.effective_fallback_limit)
                    self._fallback_in_use = 0
                    self._fallback_pid = os.getpid()
        return self._fallback

    def _acquire_local(self, attempt: Acquisition) -> BulkheadPermit:
        semaphore = self._fallback_semaphore()
        remaining = attempt.remaining()
        if remaining > 0:
            acquired = semaphore.acquire(timeout=remaining)
        else:
            acquired = semaphore.acquire(blocking=False)
        if not acquired:
            raise attempt.local_full(self._fallback_in_use)
        with self._lock:
            self._fallback_in_use += 1
        return attempt.local_permit()

    def _release_pending(self, permit: BulkheadPermit,
                         error: BaseException | None = None) -> PendingCall | None:
        """The local part of a release; the script call still owed to Redis, if any."""
        if permit.local:
            if self._codec.take_release(permit):
                with self._lock:
                    self._fallback_in_use -= 1
                self._fallback.release()
            return None
        self._renewer.remove(permit)
        return self._codec.release_pending(permit, error)

    def owed_release(self, permit: BulkheadPermit,
                     error: BaseException | None = None) -> Owed | None:
        """Release locally now; the release call still owed to Redis (for a Policy to
        pipeline with others), or None. `error`: how the call ended (adaptive limits)."""
        pending = self._release_pending(permit, error)
        return None if pending is None else Owed(self._client, pending)

    def release(self, permit: BulkheadPermit, error: BaseException | None = None) -> None:
        """Give a permit back (idempotent). A lease found gone marks the permit lost.
        `error` (None: the call returned) is what an adaptive limit learns from."""
        pending = self._release_pending(permit, error)
        if pending is not None:
            send(self._client, pending)

    # -- the protected call ---------------------------------------------------------------
    def check_lease(self, permit: BulkheadPermit) -> None:
        """Call immediately before invoking the protected function: a permit whose lease
        already ended (this process was paused since `acquire`) is released and
        BulkheadFull (with a `reason`) raised instead of calling without a permit."""
        refusal = self.lease_rejection(permit)
        if refusal is not None:
            self.release(permit)
            raise refusal

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)` holding a permit."""
        permit = self.acquire()
        self.check_lease(permit)
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            self.release(permit, error)
            raise
        self.release(permit)
        return result

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        return decorate_sync(self.call, fn, "Bulkhead")

    def __enter__(self) -> BulkheadPermit:
        permit = self.acquire()
        self.check_lease(permit)
        self._tls.__dict__.setdefault("stack", []).append(permit)
        return permit

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.release(self._tls.stack.pop(), exc)

    def restart_limit(self) -> None:
        """Slow start: an adaptive limit restarts at its minimum (a Policy does this when
        its breaker closes after a recovery). Does nothing for a fixed limit."""
        if self.config.adaptive is not None:
            with redis_unavailable_as(f"bulkhead {self.name!r}"):
                self._run(self._codec.restart_call())

    # -- metrics -------------------------------------------------------------------------
    def metrics(self) -> BulkheadMetrics:
        """Fleet-wide figures read from Redis (RedisUnavailable while it cannot answer)."""
        with redis_unavailable_as(f"bulkhead {self.name!r}"):
            raw = self._run(self._codec.metrics_call())
        return self._codec.metrics(raw, self._fallback_in_use)

    def close(self) -> None:
        """Close the clients this bulkhead built from a URL (a client given to it is yours)."""
        if self._owns_clients and not self._let_go:
            self._let_go = True  # once: the clients may be shared with other components
            release_sync_client(self._client)
            if self._blocking is not None:
                release_sync_client(self._blocking)
