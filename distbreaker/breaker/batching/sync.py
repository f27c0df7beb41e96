"""The sync breakers' flusher: one daemon thread per process, started lazily."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._runtime import forking
from ..._runtime.scripts import run_scripts_each
from ..core import Counts
from .accumulator import Added
from .flush_core import Batch, FlushCore, reset_if_forked

if TYPE_CHECKING:
    from ..core import BreakerCore

logger = logging.getLogger("distbreaker")


class ThreadFlusher(FlushCore):
    """The process's flusher for sync breakers. `on_start` runs when its thread starts
    (the exit flush registers itself there)."""

    def __init__(self, on_start: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self._on_start = on_start
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._pid = os.getpid()
        forking.register(self)

    def add(self, core: BreakerCore, counts: Counts) -> None:
        """The hot path: O(1), no I/O; wakes the flusher when it has work."""
        if self._pid != os.getpid():
            reset_if_forked(self)  # a fork that skipped Python's fork hooks
        if self.acc.add(core, counts) is not Added.NOTHING:
            if self._thread is None:
                self._start()
            self._wake.set()

    def current(self) -> ThreadFlusher:
        """The flusher serving the caller: the process's one (as `LoopFlushers.current`)."""
        return self

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="distbreaker-flusher", daemon=True)
            self._thread = thread
            thread.start()
            self._on_start()

    def _run(self) -> None:
        acc, wake = self.acc, self._wake
        while True:
            wake.wait()
            wake.clear()
            delay = acc.due_in()
            while delay > 0:  # let outcomes accumulate; FULL cuts it short
                wake.wait(delay)
                wake.clear()
                delay = acc.due_in()
            try:
                self.flush()
            except Exception:  # never let the flusher die
                logger.exception("distbreaker: batched flush failed")
            if acc:  # counts kept while Redis is unreachable: try again after an interval
                wake.set()

    def flush(self) -> None:
        """Send everything pending now (blocking); returns when it is in Redis (or kept)."""
        with self._flush_lock:
            for client, batches in self.take_plan():
                self._send(client, batches)

    def _send(self, client: Any, batches: list[Batch]) -> None:
        try:
            results = run_scripts_each(client, [batch.call.spec for batch in batches])
        except Exception as error:
            self.pipeline_failed(batches, error)
        else:
            self.settled(batches, results)

    def _after_fork(self) -> None:
        """In a forked child: an empty accumulator and no thread (started on first use)."""
        self.acc.reset()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._thread = None
        self._pid = os.getpid()
