"""What happens while Redis is unreachable.

`RedisHealth` decides when Redis may be tried again (exponential backoff with
jitter, so a dead Redis is not hammered on every call). `LocalScriptRunner`
is the in-process fallback breaker: the very same Lua scripts run on an
in-process fakeredis, so the local breaker has exactly the fleet semantics,
only scoped to this process (principle 1: no second state machine).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .scripts import LuaScript, run_script

#: Errors that mean "Redis is unavailable", as opposed to a bug or foreign data.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)

_FIRST_BACKOFF = 0.05


class RedisHealth:
    """Backoff bookkeeping: after a failure Redis is skipped until the backoff ends."""

    def __init__(self, max_backoff: float) -> None:
        self._max_backoff = max_backoff
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self.last_error: BaseException | None = None

    def usable(self, now: float | None = None) -> bool:
        if self._failures == 0:
            return True
        return (now if now is not None else time.monotonic()) >= self._retry_at

    def retry_in(self, now: float | None = None) -> float:
        return max(0.0, self._retry_at - (now if now is not None else time.monotonic()))

    def failed(self, error: BaseException, now: float | None = None) -> None:
        with self._lock:
            self._failures += 1
            self.last_error = error
            ceiling = min(self._max_backoff, _FIRST_BACKOFF * 2 ** min(self._failures - 1, 16))
            backoff = ceiling / 2 + random.random() * ceiling / 2
            self._retry_at = (now if now is not None else time.monotonic()) + backoff

    def succeeded(self) -> None:
        if self._failures:
            with self._lock:
                self._failures = 0
                self._retry_at = 0.0
                self.last_error = None


class LocalScriptRunner:
    """Runs distbreaker's scripts on a private in-process fakeredis (created lazily)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None

    def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with self._lock:
            if self._client is None:
                import fakeredis  # imported only when Redis first fails

                self._client = fakeredis.FakeStrictRedis()
            return run_script(self._client, script, keys, args)

    def reset(self) -> None:
        """Forget local state (Redis is back: the fleet's state governs again)."""
        with self._lock:
            if self._client is not None:
                self._client.flushall()
