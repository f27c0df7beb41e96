"""The asyncio Ganesha-mode breaker: awaited I/O only, decisions in `ganesha.core`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._runtime.connection import LoopClients
from .._runtime.scripts import send_async
from .config import GaneshaConfig
from .core import GaneshaCore, GaneshaReply

T = TypeVar("T")


class GaneshaBreaker(GaneshaCore):
    """The asyncio twin of `distbreaker.GaneshaBreaker` (awaited methods, same keys)."""

    def __init__(self, service: str, redis: Any = None, config: GaneshaConfig | None = None,
                 **overrides: Any) -> None:
        super().__init__(service, config, overrides)
        self._clients = LoopClients(redis, self.config.redis_timeout)

    @property
    def _client(self) -> Any:
        """The client for the running event loop (a URL's is shared per loop)."""
        return self._clients.get()

    async def _run(self, op: str) -> GaneshaReply | None:
        return await send_async(self._client, self._pending(op))

    async def is_available(self) -> bool:
        """Ganesha's isAvailable: records a rejection when it answers False."""
        return self._available(await self._run("available"))

    async def success(self) -> None:
        await self._run("success")

    async def failure(self) -> None:
        await self._run("failure")

    async def counts(self) -> GaneshaReply | None:
        """Trimmed counts and availability, without recording anything."""
        return await self._run("counts")

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await `fn` if available (else raise CallNotPermitted); record success or failure."""
        if not await self.is_available():
            raise self._rejection()
        try:
            result = await fn(*args, **kwargs)
        except Exception:
            await self.failure()
            raise
        await self.success()
        return result

    def __call__(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("distbreaker.aio.GaneshaBreaker decorates coroutine functions; "
                            "use distbreaker.GaneshaBreaker for a plain function")

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            return await self.call(fn, *args, **kwargs)

        return wrapper

    async def aclose(self) -> None:
        """Close the client this breaker built from a URL (a client given to it is yours)."""
        await self._clients.release()
