"""The asyncio circuit breaker front end: awaited I/O only, decisions in `breaker.core`.

Everything it shares with the sync breaker is in `_shell_aio.py` (the source
scripts/unasync.py writes the sync copy from). The in-process fallback used while
Redis is unreachable (fakeredis, microseconds, no network) runs inline.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, NoReturn

from .._runtime.blocks import TaskBlocks
from .._runtime.connection import (
    DEFAULT_URL,
    async_client,
    owns_client,
    release_async_client,
    shared_async_client,
)
from .._runtime.scripts import PendingCall, send_async
from ._shell_aio import BreakerShell
from .batching import LOOP_FLUSHERS
from .core import Permit


class CircuitBreaker(BreakerShell):
    """The asyncio twin of `distbreaker.CircuitBreaker`, sharing its state in Redis.

    Use as a decorator of coroutine functions, ``async with breaker:``, or
    ``await breaker.call(coro_fn, *args)``. `redis` is a URL or a
    ``redis.asyncio.Redis``; keyword arguments override fields of `config`.
    """

    _flushers = LOOP_FLUSHERS
    # Permits of the `async with breaker:` blocks open in the current task.
    _blocks = TaskBlocks("distbreaker_aio_open_blocks", "async with breaker")

    def _connect(self, redis: Any) -> Any:
        client = async_client(redis, self.config.redis_timeout)  # validates `redis` now
        self._given = None if owns_client(redis) else client
        self._url = DEFAULT_URL if redis is None else redis
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary())
        return client

    @property
    def client_url(self) -> str | None:
        return None if self._given is not None else self._url

    @property
    def given_async_client(self) -> Any:
        return self._given

    @property
    def _client(self) -> Any:
        """The Redis client for the running event loop.

        asyncio connections belong to the loop that opened them, and a breaker is
        typically created at import time (a decorator) and may serve several loops
        (one ``asyncio.run`` per test): a client built from a URL is kept per loop.
        A client passed in is used as given (the caller owns its loop binding).
        """
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        client = self._per_loop.get(loop)
        if client is None:
            client = self._per_loop[loop] = shared_async_client(
                self._url, self.config.redis_timeout)
        return client

    async def _release_client(self) -> None:
        if self._given is None:
            client = self._per_loop.pop(asyncio.get_running_loop(), None)
            if client is not None:
                await release_async_client(client)

    async def _send_acquire(self, call: PendingCall, token: str) -> Permit:
        try:
            return await send_async(self._client, call)
        except asyncio.CancelledError as cancelled:
            # Redis may have granted a half-open probe before the reply was lost to the
            # cancellation (a timeout around the call): hand it back rather than leave the
            # slot taken until its lease expires. Outside HALF_OPEN this is a no-op.
            await self.record(Permit(token), cancelled, 0.0)
            raise

    @property
    def state(self) -> NoReturn:
        """Not available here: a property cannot await Redis."""
        raise AttributeError("the asyncio breaker reads its state with `await breaker.get_state()`")

    def __repr__(self) -> str:
        return f"aio.CircuitBreaker({self.name!r})"
