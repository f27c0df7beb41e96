"""The asyncio registry: `distbreaker.Registry` with the asyncio components.

asyncio connections belong to the event loop that opened them, and a registry
is typically built at import time and may serve several loops (one
``asyncio.run`` or one pytest-asyncio loop per test). Its one client is a
`LoopBoundClient`: one redis.asyncio client per running loop behind a single
object, so every component still shares one client (and one pipeline).
`health` and `aclose` are in `_shell_aio.py` (the sync copy is generated from it).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from .._runtime.connection import async_client
from ._shell_aio import CLASSES, RegistryShell

__all__ = ["CLASSES", "LoopBoundClient", "Registry"]


class LoopBoundClient:
    """A redis.asyncio client per running event loop, used as one client.

    Built from a URL (or None: localhost). Attribute access goes to the running
    loop's client, built on first use; nothing connects before a command.
    """

    def __init__(self, target: Any, timeout: float) -> None:
        async_client(target, timeout)  # validates the URL now
        self._target = target
        self._timeout = timeout
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary())

    def database_index(self) -> int:
        """The database the URL names (without building a client: no loop needed)."""
        if not isinstance(self._target, str) or "://" not in self._target:
            return 0
        from redis.connection import parse_url

        try:
            return int(parse_url(self._target).get("db", 0) or 0)
        except (ValueError, TypeError):
            return 0

    def current(self) -> Any:
        """The running loop's client."""
        loop = asyncio.get_running_loop()
        client = self._per_loop.get(loop)
        if client is None:
            client = self._per_loop[loop] = async_client(self._target, self._timeout)
        return client

    # The methods the components call, defined so a component checking for them
    # (outside a running loop) finds them; the rest goes through __getattr__.
    def evalsha(self, *args: Any) -> Any:
        return self.current().evalsha(*args)

    def eval(self, *args: Any) -> Any:
        return self.current().eval(*args)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        return self.current().pipeline(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.current(), name)

    async def aclose(self) -> None:
        """Close the running loop's client."""
        client = self._per_loop.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def __repr__(self) -> str:
        return f"LoopBoundClient({self._target!r})"


def _loop_bound(target: Any, timeout: float) -> Any:
    if target is None or isinstance(target, str):
        return LoopBoundClient(target, timeout)
    return async_client(target, timeout)  # a given client: used as is (checked)


class Registry(RegistryShell):
    """The asyncio twin of `distbreaker.Registry` (same configuration, asyncio components).

    A given `redis` client is used as is (its loop binding is yours); a URL gets
    one client per event loop (`LoopBoundClient`). Building is not awaited, so
    ``strict=True`` is refused: ``await registry.check()`` at start-up instead.
    """

    make_client = staticmethod(_loop_bound)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.strict:
            raise ValueError("strict: the asyncio Registry cannot check Redis while it is "
                             "built; `await registry.check()` at start-up instead")

    def __repr__(self) -> str:
        return f"aio.Registry({self.source!r})"
