"""What the sync and asyncio flushers share, written once for asyncio.

scripts/unasync.py writes `_shell_sync.py` from this file; the front ends add how
the flusher runs (a daemon thread, or a task per event loop) and waits.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..._runtime.scripts import run_scripts_each_async
from ..core import Counts
from .accumulator import Added
from .flush_core import Batch, FlushCore

if TYPE_CHECKING:
    from ..core import BreakerCore

logger = logging.getLogger("distbreaker")


class FlusherShell(FlushCore):
    """A flusher's rounds: wait for outcomes, let them accumulate, send them."""

    #: Set when there is work (threading.Event, or asyncio.Event).
    _wake: Any

    def _start_if_idle(self) -> None:
        """Start the flusher's thread or task unless it runs."""
        raise NotImplementedError

    async def _doze(self, delay: float) -> None:
        """Wait up to `delay` seconds, or until woken."""
        raise NotImplementedError

    def _flush_lock_now(self) -> Any:
        """The lock one flush holds (flushes never overlap)."""
        raise NotImplementedError

    def add(self, core: BreakerCore, counts: Counts) -> None:
        """The hot path: O(1), no I/O; wakes the flusher when it has work."""
        if self.acc.add(core, counts) is not Added.NOTHING:
            self._start_if_idle()
            self._wake.set()

    async def _round(self) -> None:
        """One round of the flusher's loop; never raises but what stops the loop."""
        acc, wake = self.acc, self._wake
        await wake.wait()
        wake.clear()
        delay = acc.due_in()
        while delay > 0:  # let outcomes accumulate; FULL cuts it short
            await self._doze(delay)
            wake.clear()
            delay = acc.due_in()
        try:
            await self.flush()
        except Exception:  # never let the flusher die
            logger.exception("distbreaker: batched flush failed")
        if acc:  # counts kept while Redis is unreachable: try again after an interval
            wake.set()

    async def flush(self) -> None:
        """Send everything pending now; returns when it is in Redis (or kept)."""
        async with self._flush_lock_now():
            for client, batches in self.take_plan():
                await self._send(client, batches)

    async def _send(self, client: Any, batches: list[Batch]) -> None:
        try:
            results = await run_scripts_each_async(client, [b.call.spec for b in batches])
        except Exception as error:
            self.pipeline_failed(batches, error)
        else:
            self.settled(batches, results)
