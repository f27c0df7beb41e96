"""Whether Redis may be tried now, and which errors mean "Redis cannot serve us".

After a failure Redis is skipped for an exponential backoff with jitter; when
it ends only *one* caller per process tries (the trial), so a dead or hung Redis
costs each process about one attempt per backoff period. The backoff grows per
failed trial, not per failed call: calls already in flight when Redis stopped
answering are the same outage. Components of one process that talk to the same
Redis (one URL, or one given client) share one `RedisHealth` (`shared_health`), so
a call that crosses a breaker, a bulkhead and a budget discovers an outage once.
Fork-aware.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from redis.connection import parse_url
from redis.exceptions import (
    ClusterDownError,
    InvalidResponse,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import RedisUnavailable
from .outages import as_outage, log_once

logger = logging.getLogger("distbreaker")

#: Errors that mean "Redis cannot serve us now", as opposed to a bug or foreign data.
#: (redis-py's BusyLoadingError, AuthenticationError and MaxConnectionsError are
#: ConnectionErrors; MasterDownError is a ClusterDownError. A RedisCluster client raises
#: a bare RedisClusterException when no node answers; distbreaker's own keys never
#: raise its other cases, e.g. keys in different slots.)
#: An ACL refusal (NOPERM) or a full Redis (OOM) counts too: the documented
#: on_redis_error policy applies, never a raw error out of a protected call; so does
#: a port that does not speak Redis (InvalidResponse). Refusals redis-py leaves a plain
#: ResponseError (a db out of range, SENTINEL unknown, an ACL refusal inside a script)
#: are turned into one of these by `outages.as_outage` where scripts are run.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, ReadOnlyError, OutOfMemoryError,
    NoPermissionError, ClusterDownError, TryAgainError, RedisClusterException, OSError,
    InvalidResponse)

#: The healths (by id) found unavailable within the current `one_discovery` scope.
_SEEN: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar(
    "distbreaker_outages_seen", default=None)

_FIRST_BACKOFF = 0.05
#: How long other callers keep skipping Redis while one caller's trial is in flight
#: (the trial normally reports well before: it is bounded by the Redis timeouts).
_TRIAL_HOLD = 1.0


class RedisHealth:
    """Backoff bookkeeping: after a failure Redis is skipped until the backoff ends.

    Callers ask `usable()` before each Redis call and must then report
    `failed(error)` or `succeeded()`.
    """

    def __init__(self, max_backoff: float) -> None:
        self._max_backoff = max_backoff
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._failures = 0
        self._backoff = 0.0
        self._retry_at = 0.0
        #: A trial was let through since the last failure: its failure grows the backoff.
        self._trial_out = False
        self.last_error: BaseException | None = None
        #: Redis calls skipped because of the backoff (since this object was made).
        self.skipped = 0
        #: Trials of Redis made after a failure (since this object was made).
        self.trials = 0

    def _guard(self) -> threading.Lock:
        if self._pid != os.getpid():  # forked: the parent's lock may be held forever
            self._pid = os.getpid()
            self._lock = threading.Lock()
        return self._lock

    @property
    def down(self) -> bool:
        """True between a failure and the next success."""
        return self._failures > 0

    def usable(self, now: float | None = None) -> bool:
        """May the caller try Redis now?

        Always while Redis is healthy. While it is down: False until the
        backoff ends, then True for exactly one caller (the trial) and False
        for the others until that trial reports.
        """
        if self._failures == 0:
            return True
        now = now if now is not None else time.monotonic()
        seen = _SEEN.get()
        with self._guard():
            if self._failures == 0:
                return True
            if now < self._retry_at or (seen is not None and id(self) in seen):
                self.skipped += 1
                return False
            self.trials += 1
            self._trial_out = True
            self._retry_at = now + max(self._backoff, _TRIAL_HOLD)
            return True

    def retry_in(self, now: float | None = None) -> float:
        """Seconds until Redis will be tried again (0 when healthy)."""
        if self._failures == 0:
            return 0.0
        return max(0.0, self._retry_at - (now if now is not None else time.monotonic()))

    def failed(self, error: BaseException, now: float | None = None) -> None:
        """A Redis call failed: back off exponentially (full jitter on the upper half).

        Only the first failure and the failure of a trial move the backoff: the other
        calls that were in flight when Redis stopped answering report the same outage
        (16 callers of a frozen Redis are one failed attempt, not 16), so a process is
        back on the shared state about one backoff step after Redis answers again."""
        seen = _SEEN.get()
        if seen is not None:
            seen.add(id(self))
        with self._guard():
            first = self._failures == 0
            self.last_error = error
            if first or self._trial_out:
                self._trial_out = False
                self._failures += 1
                ceiling = min(self._max_backoff,
                              _FIRST_BACKOFF * 2 ** min(self._failures - 1, 16))
                self._backoff = ceiling
                backoff = ceiling / 2 + random.random() * ceiling / 2
                self._retry_at = (now if now is not None else time.monotonic()) + backoff
        # A refusal or misdirection is logged (its cause and fix) once, at ERROR.
        if not log_once(error) and first:
            logger.warning("distbreaker: Redis unavailable (%s: %s); using the on_redis_error "
                           "policy and retrying Redis with backoff", type(error).__name__, error)

    def succeeded(self) -> None:
        """A Redis call succeeded: Redis is used on every call again."""
        if self._failures:
            with self._guard():
                was_down = self._failures > 0
                self._failures = 0
                self._backoff = 0.0
                self._retry_at = 0.0
                self._trial_out = False
                self.last_error = None
            if was_down:
                logger.info("distbreaker: Redis reachable again; the fleet state governs")


    def share_with(self, max_backoff: float) -> None:
        """Another component uses this health: the shortest longest backoff governs (no
        component waits longer for Redis than its own config allows)."""
        self._max_backoff = min(self._max_backoff, max_backoff)


#: The health of each Redis server of this process (see `_target_key`; a client known
#: only by id is kept alive by its components). Entries go when no component holds them.
_SHARED: weakref.WeakValueDictionary[tuple[Any, ...], RedisHealth] = (
    weakref.WeakValueDictionary())
_shared_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()  # the parent's may have been held by another thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_in_child)


def _target_key(target: Any) -> tuple[Any, ...]:
    """Where `target` connects: host, port, database (or socket path) for a redis://
    URL and for a client of one, so a Policy's client and a breaker's URL of the same
    server share a health; the URL itself for other schemes; else the client's id."""
    kwargs: Any = None
    if target is None or isinstance(target, str):
        url = target or "redis://localhost:6379/0"
        if not url.startswith(("redis://", "rediss://", "unix://")):
            return ("url", url)
        try:
            kwargs = parse_url(url)
        except ValueError:
            return ("url", url)
    else:
        try:  # (a wrapper's __getattr__ may need a running event loop: its id, then)
            kwargs = target.connection_pool.connection_kwargs
        except Exception:
            kwargs = None
        if not isinstance(kwargs, dict) or type(target).__module__.startswith("fakeredis") \
                or ("host" not in kwargs and "path" not in kwargs):
            return ("client", id(target))
    return ("server", kwargs.get("host", "localhost"), int(kwargs.get("port") or 6379),
            kwargs.get("path"), int(kwargs.get("db") or 0))


def shared_health(target: Any, max_backoff: float) -> RedisHealth:
    """The one `RedisHealth` of the components of this process that talk to `target`
    (a URL, None for the default URL, or a client): one outage discovery and one trial
    per backoff period for all of them (a Policy's breaker, bulkhead and budget)."""
    key = _target_key(target)
    with _shared_lock:
        health = _SHARED.get(key)
        if health is None:
            health = RedisHealth(max_backoff)
            _SHARED[key] = health
        else:
            health.share_with(max_backoff)
        return health


@contextlib.contextmanager
def one_discovery() -> Iterator[None]:
    """Within (one Policy attempt, per thread or task): a Redis found unavailable is not
    tried again, even when its backoff ends meanwhile (the local fallback's first use
    can take longer than the first backoff step): one outage discovery per call."""
    token = _SEEN.set(set())
    try:
        yield
    finally:
        _SEEN.reset(token)


@contextlib.contextmanager
def redis_unavailable_as(component: str) -> Iterator[None]:
    """Raise every "Redis cannot serve us" error inside as `RedisUnavailable`."""
    try:
        yield
    except RedisUnavailable:
        raise
    except ResponseError as error:
        outage = as_outage(error)
        if outage is error and not isinstance(error, UNAVAILABLE_ERRORS):
            raise
        raise RedisUnavailable(component, f"{type(outage).__name__}: {error}") from error
    except UNAVAILABLE_ERRORS as error:
        raise RedisUnavailable(component, f"{type(error).__name__}: {error}") from error
