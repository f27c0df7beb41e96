"""Ganesha-compatible mode for asyncio (see distbreaker.ganesha)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._runtime.connection import async_client
from .._runtime.health import UNAVAILABLE_ERRORS
from .._runtime.scripts import run_script_async
from .config import GaneshaConfig
from .core import GaneshaCore, GaneshaReply

T = TypeVar("T")


class GaneshaBreaker(GaneshaCore):
    """The asyncio twin of distbreaker.ganesha.GaneshaBreaker (awaited methods)."""

    def __init__(self, service: str, redis: Any = None, config: GaneshaConfig | None = None,
                 **overrides: Any) -> None:
        super().__init__(service, config, overrides)
        self._client = async_client(redis, self.config.redis_timeout)

    async def _run(self, op: str) -> GaneshaReply | None:
        prepared = self._prepare(op)
        if prepared is None:
            return None
        try:
            raw = await run_script_async(self._client, self._script, *prepared)
        except UNAVAILABLE_ERRORS as error:
            self._unavailable(error)
            return None
        return self._handle(raw)

    async def is_available(self) -> bool:
        reply = await self._run("available")
        return True if reply is None else reply.available

    async def success(self) -> None:
        await self._run("success")

    async def failure(self) -> None:
        await self._run("failure")

    async def counts(self) -> GaneshaReply | None:
        return await self._run("counts")

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
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
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            return await self.call(fn, *args, **kwargs)

        return wrapper
