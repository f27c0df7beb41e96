"""The synchronous Ganesha-mode breaker: I/O only, decisions in `ganesha.core`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from .._runtime.connection import owns_client, release_sync_client, shared_sync_client
from .._runtime.decorate import decorate_sync
from .._runtime.scripts import send
from .config import GaneshaConfig
from .core import GaneshaCore, GaneshaReply

P = ParamSpec("P")
T = TypeVar("T")


class GaneshaBreaker(GaneshaCore):
    """A breaker that shares an ackintosh/ganesha (PHP) fleet's Redis keys and decisions.

    Each operation is one Lua script, so Python workers never lose their own events to
    member collisions and "tripped" fires once per trip among them; PHP workers keep
    Ganesha's own behaviour (a half-open that lets every request through, a check-then-set
    that may fire "tripped" once per PHP process). While Redis is unreachable
    `is_available()` answers True (fail open) and outcomes are dropped.
    """

    def __init__(self, service: str, redis: Any = None, config: GaneshaConfig | None = None,
                 **overrides: Any) -> None:
        super().__init__(service, config, overrides)
        self._client = shared_sync_client(redis, self.config.redis_timeout)
        self._owns_client = owns_client(redis)

    def _run(self, op: str) -> GaneshaReply | None:
        return send(self._client, self._pending(op))

    def is_available(self) -> bool:
        """Ganesha's isAvailable: records a rejection when it answers False."""
        return self._available(self._run("available"))

    def success(self) -> None:
        self._run("success")

    def failure(self) -> None:
        self._run("failure")

    def counts(self) -> GaneshaReply | None:
        """Trimmed counts and availability, without recording anything."""
        return self._run("counts")

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn` if available (else raise CallNotPermitted); record success or failure."""
        if not self.is_available():
            raise self._rejection()
        try:
            result = fn(*args, **kwargs)
        except Exception:
            self.failure()
            raise
        self.success()
        return result

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        return decorate_sync(self.call, fn, "GaneshaBreaker")

    def close(self) -> None:
        """Close the client this breaker built from a URL (a client given to it is yours)."""
        if self._owns_client:
            self._owns_client = False  # let go once: the client may be shared
            release_sync_client(self._client)
