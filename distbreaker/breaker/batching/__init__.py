"""Batched record mode: CLOSED outcomes counted per process, flushed as counts.

A protected call adds its outcome to the process's `Accumulator`; a flusher (one
thread for sync breakers, one task per event loop for asyncio ones) sends the counts
every ``flush_interval``, or at once after ``max_batch``, one pipeline per client.
"""

from __future__ import annotations

import atexit
import logging
import sys

from .aio import LoopFlushers
from .sync import ThreadFlusher

__all__ = ["LOOP_FLUSHERS", "THREAD_FLUSHER", "flush"]

logger = logging.getLogger("distbreaker")


def _flush_at_exit() -> None:
    """Send what is pending at interpreter exit (sync breakers', then asyncio ones')."""
    try:
        THREAD_FLUSHER.flush()
        for flusher in LOOP_FLUSHERS.leftovers():
            flusher.flush_blocking()
    except Exception:
        logger.exception("distbreaker: flushing batched outcomes at exit failed")


def _register_exit_finalizer() -> None:
    """multiprocessing's fork children leave with os._exit (no atexit): flush through
    multiprocessing's own exit finalizers instead (registered once per process)."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    registry = getattr(util, "_finalizer_registry", None)
    if registry is not None and any(
            getattr(f, "_callback", None) is _flush_at_exit for f in registry.values()):
        return
    util.Finalize(None, _flush_at_exit, exitpriority=100)


#: The process-wide flushers (sync: one thread; asyncio: one per loop).
THREAD_FLUSHER = ThreadFlusher(on_start=_register_exit_finalizer)
LOOP_FLUSHERS = LoopFlushers()


def flush() -> None:
    """Send every sync breaker's pending outcomes now (blocking)."""
    THREAD_FLUSHER.flush()


atexit.register(_flush_at_exit)
