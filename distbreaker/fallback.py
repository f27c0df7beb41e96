"""What happens while Redis is unreachable.

`RedisHealth` decides when Redis may be tried again: after a failure, Redis is
skipped for an exponential backoff with jitter, and when the backoff ends only
*one* caller per process gets to try (the trial), so a dead or hung Redis
costs each process about one connection attempt (or one `redis_timeout`) per
backoff period, however many calls and threads are running.

`LocalScriptRunner` is the in-process fallback breaker: the very same Lua
scripts run on a private in-process fakeredis, so the local breaker has exactly
the fleet semantics, only scoped to this process (principle 1: no second state
machine). It starts empty when Redis first fails and is wiped when Redis
answers again (the fleet's state governs from then on).

Both are fork-aware: a child process gets fresh locks (a lock held by another
thread at fork time would otherwise stay held forever) and its own fallback.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .scripts import LuaScript, run_script

logger = logging.getLogger("distbreaker")

#: Errors that mean "Redis cannot serve us now", as opposed to a bug or foreign data.
#: (redis-py's BusyLoadingError, AuthenticationError and MaxConnectionsError are
#: ConnectionErrors; MasterDownError is a ClusterDownError. A RedisCluster client raises
#: a bare RedisClusterException when no node answers; distbreaker's own keys never
#: raise its other cases, e.g. keys in different slots.)
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, ReadOnlyError, OutOfMemoryError,
    ClusterDownError, TryAgainError, RedisClusterException, OSError)

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
        if first:
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


class _LocalRuntime:
    """Loads fakeredis (and its Lua runtime) once per process, in the background.

    Loading takes a few hundred milliseconds; a protected call must not wait
    for it, so until it is ready the fallback lets calls through unrecorded
    (fail-open without local accounting, logged once).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loader_pid = -1

    def _load(self) -> None:
        try:
            import fakeredis  # noqa: F401  (the import is the point)
        except Exception:  # pragma: no cover - a broken install: no local breaker
            logger.exception("distbreaker: cannot load the local fallback runtime")
            return
        self._ready.set()

    def ready(self) -> bool:
        """True when fakeredis is importable now; else start loading it (once per process)."""
        if self._ready.is_set() or ("fakeredis" in sys.modules and \
                hasattr(sys.modules["fakeredis"], "FakeStrictRedis")):
            self._ready.set()
            return True
        with self._lock:
            if self._loader_pid != os.getpid():
                self._loader_pid = os.getpid()
                logger.warning("distbreaker: loading the local fallback breaker; calls pass "
                               "unrecorded until it is ready")
                threading.Thread(target=self._load, name="distbreaker-fallback-loader",
                                 daemon=True).start()
        return False

    def wait(self, timeout: float) -> bool:
        """Block until the runtime is loaded (tests, or warming up before serving)."""
        self.ready()
        return self._ready.wait(timeout)


LOCAL_RUNTIME = _LocalRuntime()


class LocalScriptRunner:
    """Runs distbreaker's scripts on a private in-process fakeredis (created lazily).

    `run` returns None while the fakeredis runtime is still loading (see
    `_LocalRuntime`); callers then fail open without local accounting.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._client: Any = None

    def _guard(self) -> threading.Lock:
        if self._pid != os.getpid():  # forked: fresh lock, and a fallback of our own
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._client = None
        return self._lock

    def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self._client is None and not LOCAL_RUNTIME.ready():
            return None
        with self._guard():
            if self._client is None:
                import fakeredis

                self._client = fakeredis.FakeStrictRedis(server=fakeredis.FakeServer())
            return run_script(self._client, script, keys, args)

    def reset(self) -> None:
        """Forget local state (Redis is back: the fleet's state governs again)."""
        with self._guard():
            if self._client is not None:
                self._client.flushall()
