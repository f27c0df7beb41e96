"""The asyncio breakers' flushers: one task per event loop, started lazily.

Their rounds and sends are in `_shell_aio.py` (the sync copy is generated from it).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import TYPE_CHECKING, Any

from ..._runtime import forking
from ..._runtime.scripts import run_script
from ..core import Counts
from ._shell_aio import FlusherShell
from .flush_core import reset_if_forked, watch_transitions

if TYPE_CHECKING:
    from ..core import BreakerCore


class LoopFlusher(FlusherShell):
    """One event loop's flusher: a task that flushes what is due, and what is pending
    when the loop shuts down (``asyncio.run`` cancels it)."""

    def __init__(self) -> None:
        super().__init__()
        self._wake: asyncio.Event | None = None  # (set with the task)
        self._task: asyncio.Task[None] | None = None
        self._flush_lock: asyncio.Lock | None = None

    def _start_if_idle(self) -> None:
        if self._task is None or self._task.done():  # (a task that died: start anew)
            self._wake = asyncio.Event()
            self._flush_lock = asyncio.Lock()
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="distbreaker-flusher")

    async def _run(self) -> None:
        try:
            while True:
                await self._round()
        except asyncio.CancelledError:
            # The loop is shutting down (asyncio.run cancels its tasks): send what is
            # pending while the loop and its connections still run.
            try:
                await self.flush()
            finally:
                self._task = None
            raise

    async def _doze(self, delay: float) -> None:
        assert self._wake is not None
        try:
            await asyncio.wait_for(self._wake.wait(), delay)
        except asyncio.TimeoutError:  # not the builtin one before Python 3.11
            pass

    def _flush_lock_now(self) -> asyncio.Lock:
        return self._flush_lock or asyncio.Lock()

    def flush_blocking(self) -> None:
        """At interpreter exit, with the loop gone: send what URL-built breakers hold
        with a blocking client (a breaker given an asyncio client loses its counts)."""
        import redis

        clients: dict[str, Any] = {}
        for core, counts in self.acc.drain().items():
            url = core.client_url
            if url is None:
                self.failed_call(core, counts, RuntimeError("event loop closed before flush"))
                continue
            client = clients.get(url)
            if client is None:
                client = clients[url] = redis.Redis.from_url(
                    url, socket_timeout=core.config.redis_timeout,
                    socket_connect_timeout=core.config.redis_timeout)
            pending = core.batch_pending(counts)
            try:
                pending.reply(run_script(client, *pending.spec))
            except Exception as error:
                self.failed_call(core, counts, error)

    def _after_fork(self) -> None:
        self.acc.reset()


class LoopFlushers:
    """The asyncio flushers, one per running event loop."""

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopFlusher] = (
            weakref.WeakKeyDictionary())
        self._all: weakref.WeakSet[LoopFlusher] = weakref.WeakSet()
        self._pid = os.getpid()
        forking.register(self)

    def current(self) -> LoopFlusher:
        loop = asyncio.get_running_loop()
        flusher = self._by_loop.get(loop)
        if flusher is None:
            flusher = self._by_loop[loop] = LoopFlusher()
            self._all.add(flusher)
        return flusher

    def add(self, core: BreakerCore, counts: Counts) -> None:
        if self._pid != os.getpid():
            reset_if_forked(self)
        self.current().add(core, counts)

    def attach(self, core: BreakerCore) -> None:
        """A new batched breaker: listen for transitions made elsewhere from the start."""
        watch_transitions(core)

    def leftovers(self) -> list[LoopFlusher]:
        """Flushers still holding counts (at exit, their loops may be gone)."""
        return [flusher for flusher in list(self._all) if flusher.acc]

    def _after_fork(self) -> None:
        # The parent's loops do not run in the child: start over, nothing pending.
        for flusher in list(self._all):
            flusher.acc.reset()
        self._by_loop = weakref.WeakKeyDictionary()
        self._all = weakref.WeakSet()
        self._pid = os.getpid()
