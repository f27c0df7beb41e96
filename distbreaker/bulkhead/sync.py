"""The synchronous fleet-wide bulkhead: blocking I/O, the lease renewal thread and the
per-process fallback semaphore; every decision in `bulkhead.core`. The permits and the
protected call are in `_shell_sync.py`, generated from `_shell_aio.py` by scripts/unasync.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .._runtime import forking
from .._runtime.blocks import ThreadBlocks
from .._runtime.connection import release_sync_client, shared_sync_client
from .._runtime.scripts import PendingCall, send
from ._shell_sync import BulkheadShell, logger
from .config import BulkheadConfig
from .core import Acquisition, BulkheadMetrics, BulkheadPermit, blocking_cap

__all__ = ["Bulkhead", "BulkheadConfig", "BulkheadMetrics", "BulkheadPermit"]


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


class Bulkhead(BulkheadShell):
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
    `fallback_limit` is given (0: reject while Redis is down). A release that
    could not reach Redis is sent again as soon as Redis answers (a lease of a
    process that died meanwhile expires on its own within one lease).
    """

    _blocks = ThreadBlocks()

    def _connect(self) -> None:
        self._client = shared_sync_client(self._target, self.config.redis_timeout)
        self._blocking: Any = None
        self._blocking_cap = 0.0
        self._let_go = False
        self._lock = threading.Lock()
        self._renewer = _Renewer(self._renew, self.config.renew_interval)
        self._fallback_pid = -1
        self._fallback = threading.Semaphore(0)
        self._fallback_in_use = 0
        self._retrier: threading.Thread | None = None
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the renewer and the local semaphore
        notice the new pid themselves; the parent's permits are not the child's)."""
        self._lock = threading.Lock()
        self._retrier = None

    def _retry_owed_later(self) -> None:
        with self._lock:
            if self._retrier is not None and self._retrier.is_alive():
                return
            self._retrier = threading.Thread(target=self._retry_owed, daemon=True,
                                             name="distbreaker-bulkhead-release-retry")
            self._retrier.start()

    def _waiter(self) -> tuple[Any, float]:
        with self._lock:
            if self._blocking is None:
                self._blocking = self._waiting_client(self._client)
                self._blocking_cap = blocking_cap(self._blocking)
            return self._blocking, self._blocking_cap

    def _renew(self, permit: BulkheadPermit) -> bool:
        pending = self._codec.renew_pending(permit)
        return pending is not None and send(self._client, pending)

    def _renew_later(self, permit: BulkheadPermit) -> None:
        self._renewer.add(permit)

    def _cancel_interrupted(self, token: str) -> None:
        self._cancel(token)

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

    def _release_local(self) -> None:
        with self._lock:
            self._fallback_in_use -= 1
        self._fallback.release()

    def _stop_renewing(self, permit: BulkheadPermit) -> None:
        self._renewer.remove(permit)

    def _send_release(self, permit: BulkheadPermit, pending: PendingCall) -> None:
        send(self._client, pending)

    def _fallback_in_use_now(self) -> int:
        return self._fallback_in_use

    def close(self) -> None:
        """Close the clients this bulkhead built from a URL (a client given to it is yours)."""
        if self._owns_clients and not self._let_go:
            self._let_go = True  # once: the clients may be shared with other components
            release_sync_client(self._client)
            if self._blocking is not None:
                release_sync_client(self._blocking)
