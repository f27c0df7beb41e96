"""What the sync and asyncio Ganesha-mode breakers share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; the front ends add
only their docstrings.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .._runtime.connection import LoopClients
from .._runtime.decorate import decorate_async
from .._runtime.scripts import send_async
from .config import GaneshaConfig
from .core import GaneshaCore, GaneshaReply

P = ParamSpec("P")
T = TypeVar("T")


class GaneshaShell(GaneshaCore):
    """The Ganesha-mode breaker's methods around its I/O."""

    def __init__(self, service: str, redis: Any = None, config: GaneshaConfig | None = None,
                 **overrides: Any) -> None:
        super().__init__(service, config, overrides)
        self._clients = LoopClients(redis, self.config.redis_timeout)

    @property
    def _client(self) -> Any:
        """The client (asyncio: the running event loop's; a URL's is shared)."""
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

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
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

    def __call__(self, fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        return decorate_async(self.call, fn, "GaneshaBreaker")

    async def aclose(self) -> None:
        """Close the client this breaker built from a URL (a client given to it is yours)."""
        await self._clients.release()
