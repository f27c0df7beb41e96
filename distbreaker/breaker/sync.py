"""The synchronous circuit breaker front end: I/O only, decisions in `breaker.core`.

Everything it shares with the asyncio breaker is in `_shell_sync.py`, generated from
`_shell_aio.py` by scripts/unasync.py.
"""

from __future__ import annotations

from typing import Any

from .._runtime.blocks import ThreadBlocks
from .._runtime.connection import owns_client, release_sync_client, shared_sync_client
from .._runtime.scripts import PendingCall, send
from ._shell_sync import BreakerShell
from .batching import THREAD_FLUSHER
from .core import Permit
from .state import State


class CircuitBreaker(BreakerShell):
    """A circuit breaker whose state is shared by every process using the same Redis.

    Use as a decorator, a context manager, or ``breaker.call(fn, *args)``.
    Keyword arguments override fields of `config` (a `BreakerConfig`).
    """

    _flushers = THREAD_FLUSHER
    _blocks = ThreadBlocks()

    def _connect(self, redis: Any) -> Any:
        # Built from a URL: the process's client of that URL, shared with its other users.
        self._client = shared_sync_client(redis, self.config.redis_timeout)
        self._owns_client = owns_client(redis)
        return self._client

    @property
    def blocking_client(self) -> Any:
        return self._client

    def _release_client(self) -> None:
        if self._owns_client:
            self._owns_client = False  # let go once: the client may be shared
            release_sync_client(self._client)

    def _send_acquire(self, call: PendingCall, token: str) -> Permit:
        return send(self._client, call)

    @property
    def state(self) -> State:
        """`get_state()` as a property (the asyncio breaker cannot offer it: it awaits)."""
        return self.get_state()

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r})"
