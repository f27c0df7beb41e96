"""Whether Redis may be tried now, and which errors mean "Redis cannot serve us".

After a failure Redis is skipped for an exponential backoff with jitter; when
it ends only *one* caller per process tries (the trial), so a dead or hung Redis
costs each process about one attempt per backoff period. Fork-aware.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Iterator

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
        with self._guard():
            if self._failures == 0:
                return True
            if now < self._retry_at:
                self.skipped += 1
                return False
            self.trials += 1
            self._retry_at = now + max(self._backoff, _TRIAL_HOLD)
            return True

    def retry_in(self, now: float | None = None) -> float:
        """Seconds until Redis will be tried again (0 when healthy)."""
        if self._failures == 0:
            return 0.0
        return max(0.0, self._retry_at - (now if now is not None else time.monotonic()))

    def failed(self, error: BaseException, now: float | None = None) -> None:
        """A Redis call failed: back off exponentially (full jitter on the upper half)."""
        with self._guard():
            self._failures += 1
            first = self._failures == 1
            self.last_error = error
            ceiling = min(self._max_backoff, _FIRST_BACKOFF * 2 ** min(self._failures - 1, 16))
            self._backoff = ceiling
            backoff = ceiling / 2 + random.random() * ceiling / 2
            self._retry_at = (now if now is not None else time.monotonic()) + backoff
        if log_once(error):  # a refusal or misdirection: its cause and fix, once, at ERROR
            pass
        elif first:
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
                self.last_error = None
            if was_down:
                logger.info("distbreaker: Redis reachable again; the fleet state governs")


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
