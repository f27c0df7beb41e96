"""The synchronous Ganesha-mode breaker: I/O only, decisions in `ganesha.core`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .._runtime.connection import sync_client
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.scripts import run_script
from .core import GaneshaConfig, GaneshaCore, GaneshaReply

T = TypeVar("T")


class GaneshaBreaker(GaneshaCore):
    """A breaker that speaks Ganesha's Redis layout (see the module docstring).

    While Redis is unreachable `is_available()` answers True (fail-open, as a
    breaker must not become the outage) and outcomes are dropped; Redis is
    retried with backoff.
    """

    def __init__(self, service: str, redis: Any = None, config: GaneshaConfig | None = None,
                 **overrides: Any) -> None:
        super().__init__(service, config, overrides)
        self._client = sync_client(redis, self.config.redis_timeout)

    def _run(self, op: str) -> GaneshaReply | None:
        prepared = self._prepare(op)
        if prepared is None:
            return None
        try:
            raw = run_script(self._client, self._script, *prepared)
        except UNAVAILABLE_ERRORS as error:
            self._unavailable(error)
            return None
        return self._handle(raw)

    def is_available(self) -> bool:
        """Ganesha's isAvailable: records a rejection when it answers False."""
        reply = self._run("available")
        return True if reply is None else reply.available

    def success(self) -> None:
        self._run("success")

    def failure(self) -> None:
        self._run("failure")

    def counts(self) -> GaneshaReply | None:
        """Trimmed counts and availability, without recording anything."""
        return self._run("counts")

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
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

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError("use distbreaker.aio.GaneshaBreaker for coroutine functions")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper
