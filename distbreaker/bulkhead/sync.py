"""The synchronous fleet-wide bulkhead: a Redis semaphore of leases.

Decisions and arguments come from `distbreaker.bulkhead_codec`; the semaphore
itself is ``lua/bulkhead.lua``. This module only does the blocking I/O, the
lease renewal thread and the per-process fallback semaphore.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .._runtime import forking
from .._runtime.connection import DEFAULT_URL, sync_client, waiting_client
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.keys import DEFAULT_PREFIX, BulkheadKeys
from .._runtime.scripts import Owed, PendingCall, run_script
from ..breaker.core import ScriptCall
from ..errors import BulkheadFull
from .config import BulkheadConfig, build_bulkhead_config
from .core import (
    BulkheadCodec,
    BulkheadMetrics,
    BulkheadPermit,
    BulkheadReply,
    blocking_cap,
    decode_reply,
)

__all__ = ["Bulkhead", "BulkheadConfig", "BulkheadMetrics", "BulkheadPermit"]

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


class Bulkhead:
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
        self.config = build_bulkhead_config(config, overrides)
        self._codec = BulkheadCodec(name, self.config, prefix)
        self._target = DEFAULT_URL if redis is None else redis
        self._client = sync_client(self._target, self.config.redis_timeout)
        self._blocking: Any = None
        self._blocking_cap = 0.0
        self._lock = threading.Lock()
        self._renewer = _Renewer(self._renew, self.config.renew_interval)
        self._tls = threading.local()
        self._local_pid = -1
        self._local_sem = threading.Semaphore(0)
        self._local_in_use = 0
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the renewer and the local semaphore
        notice the new pid themselves; the parent's permits are not the child's)."""
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._codec.name

    @property
    def keys(self) -> BulkheadKeys:
        """The Redis keys of this bulkhead (see lua/bulkhead.lua)."""
        return self._codec.keys

    @property
    def local_fallback_active(self) -> bool:
        """True while Redis is marked unreachable and the local limit governs this process."""
        return self._codec.health.down

    # -- I/O ------------------------------------------------------------------------
    def _run(self, call: ScriptCall) -> BulkheadReply:
        return decode_reply(run_script(self._client, self._codec.script, call.keys, call.args))

    def _waiter(self) -> tuple[Any, float]:
        """The client BLPOP runs on, and the longest one BLPOP may block on it.

        A URL-built client has a short socket timeout, so waiting gets its own
        client whose timeout outlasts the longest wait; a given client is used
        as is, each BLPOP bounded by its socket timeout.
        """
        with self._lock:
            if self._blocking is None:
                if isinstance(self._target, str):
                    self._blocking = waiting_client(
                        self._target, self.config.redis_timeout,
                        self.config.waiting_socket_timeout)
                else:
                    self._blocking = self._client
                self._blocking_cap = blocking_cap(self._blocking)
            return self._blocking, self._blocking_cap

    def _renew(self, permit: BulkheadPermit) -> bool:
        codec = self._codec
        if permit.released or not codec.health.usable():
            return not permit.released
        try:
            reply = self._run(codec.renew_call(permit.token))
        except UNAVAILABLE_ERRORS as error:
            codec.health.failed(error)
            return True
        codec.health.succeeded()
        return codec.after_renew(permit, reply)

    # -- permits ------------------------------------------------------------------------
    def acquire(self) -> BulkheadPermit:
        """Take one permit (waiting up to max_wait_duration); raises BulkheadFull."""
        codec = self._codec
        started = time.monotonic()
        deadline = started + self.config.max_wait_duration
        if codec.health.usable():
            for orphan in codec.take_orphans():
                self._cancel(orphan)
            token = codec.new_token()
            try:
                permit = self._acquire_redis(token, started, deadline)
            except UNAVAILABLE_ERRORS as error:
                codec.health.failed(error)
                codec.orphan(token)  # Redis may have granted it before the reply was lost
            except BaseException as error:
                if not isinstance(error, BulkheadFull):
                    self._cancel(token)  # e.g. KeyboardInterrupt while waiting
                raise
            else:
                self._renewer.add(permit)
                return permit
        return self._acquire_local(started, deadline)

    def _acquire_redis(self, token: str, started: float, deadline: float) -> BulkheadPermit:
        codec = self._codec
        cap = 0.0
        while True:
            remaining = deadline - time.monotonic()
            reply = self._run(codec.acquire_call(token, remaining))
            codec.health.succeeded()
            step = codec.after_acquire(reply, token, remaining, started, time.monotonic(), cap)
            if isinstance(step, BulkheadPermit):
                return step
            client, cap = self._waiter()
            client.blpop([codec.keys.notify], timeout=codec.block_for(remaining, reply, cap))

    def _cancel(self, token: str) -> None:
        """Undo an interrupted acquire; best effort (leases and waiters expire anyway)."""
        try:
            self._run(self._codec.cancel_call(token))
        except Exception as error:
            logger.debug("bulkhead %r: cancel failed: %r", self.name, error)

    def _local(self) -> threading.Semaphore:
        if self._local_pid != os.getpid():
            with self._lock:
                if self._local_pid != os.getpid():
                    self._local_sem = threading.Semaphore(self.config.effective_fallback_limit)
                    self._local_in_use = 0
                    self._local_pid = os.getpid()
        return self._local_sem

    def _acquire_local(self, started: float, deadline: float) -> BulkheadPermit:
        sem = self._local()
        remaining = deadline - time.monotonic()
        ok = sem.acquire(timeout=remaining) if remaining > 0 else sem.acquire(blocking=False)
        now = time.monotonic()
        if not ok:
            waited = now - started if self.config.max_wait_duration else 0.0
            raise self._codec.full(self._local_in_use, waited, local=True)
        with self._lock:
            self._local_in_use += 1
        return BulkheadPermit("", local=True, acquired_at=now)

    def _release_pending(self, permit: BulkheadPermit) -> PendingCall | None:
        """The local part of a release; the script call still owed to Redis, if any."""
        codec = self._codec
        if permit.local:
            if not permit.released:
                permit.released = True
                with self._lock:
                    self._local_in_use -= 1
                self._local_sem.release()
            return None
        self._renewer.remove(permit)
        if not codec.needs_release_call(permit):
            return None
        return codec.release_pending(permit)

    def owed_release(self, permit: BulkheadPermit) -> Owed | None:
        """Release locally now; the release call still owed to Redis (for a Policy to
        pipeline with others), or None."""
        pending = self._release_pending(permit)
        return None if pending is None else Owed(self._client, pending)

    def release(self, permit: BulkheadPermit) -> None:
        """Give a permit back (idempotent). A lease found gone marks the permit lost."""
        pending = self._release_pending(permit)
        if pending is None:
            return
        try:
            raw = run_script(self._client, *pending.spec)
        except UNAVAILABLE_ERRORS as error:
            pending.on_unavailable(error)
            return
        pending.on_reply(raw)

    # -- the protected call ---------------------------------------------------------------
    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` holding a permit."""
        permit = self.acquire()
        try:
            return fn(*args, **kwargs)
        finally:
            self.release(permit)

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError("use distbreaker.aio.Bulkhead to decorate a coroutine function")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper

    def __enter__(self) -> BulkheadPermit:
        permit = self.acquire()
        self._tls.__dict__.setdefault("stack", []).append(permit)
        return permit

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.release(self._tls.stack.pop())

    # -- metrics -------------------------------------------------------------------------
    def metrics(self) -> BulkheadMetrics:
        """Fleet-wide figures read from Redis (Redis errors are raised)."""
        return self._codec.metrics(self._run(self._codec.metrics_call()), self._local_in_use)

    def close(self) -> None:
        """Close the clients this bulkhead created from a URL."""
        if isinstance(self._target, str):
            self._client.close()
            if self._blocking is not None:
                self._blocking.close()

    def __repr__(self) -> str:
        return f"Bulkhead({self.name!r}, max_concurrent_calls={self.config.max_concurrent_calls})"
