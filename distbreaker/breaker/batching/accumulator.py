"""Pending batched outcome counts per breaker: thread-safe, O(1) per outcome, no I/O.

`add` tells the flusher whether to wake up (`Added`); `drain` hands it everything
pending, `restore` takes back what Redis could not take.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from enum import IntEnum
from typing import TYPE_CHECKING

from ..core import Counts

if TYPE_CHECKING:
    from ..core import BreakerCore


class Added(IntEnum):
    """What adding one call's counts means for the flusher."""

    NOTHING = 0  # more of the same: the flusher is already due
    FIRST = 1    # the first pending outcome: start the interval
    FULL = 2     # one breaker has max_batch outcomes pending: flush now


@dataclasses.dataclass(slots=True)
class Tally:
    """One breaker's pending counts, as the record script takes them."""

    successes: int = 0
    failures: int = 0
    slow: int = 0
    total_ms: int = 0

    def add(self, counts: Counts) -> None:
        successes, failures, slow, total_ms = counts
        self.successes += successes
        self.failures += failures
        self.slow += slow
        self.total_ms += total_ms

    @property
    def outcomes(self) -> int:
        """Calls counted (the slow ones are among them)."""
        return self.successes + self.failures

    def counts(self) -> Counts:
        return (self.successes, self.failures, self.slow, self.total_ms)


class Accumulator:
    """Pending outcome counts per breaker, and when they are due."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[BreakerCore, Tally] = {}
        self.full = False
        self.interval = float("inf")
        self.since = 0.0  # monotonic time the oldest pending outcome arrived

    def _tally(self, core: BreakerCore) -> Tally:
        """`core`'s tally, created empty if need be (called holding the lock)."""
        tally = self._pending.get(core)
        if tally is None:
            if not self._pending:
                self.since = time.monotonic()
            tally = self._pending[core] = Tally()
            self.interval = min(self.interval, core.config.flush_interval)
        return tally

    def add(self, core: BreakerCore, counts: Counts) -> Added:
        """Add one call's counts."""
        with self._lock:
            first = not self._pending
            tally = self._tally(core)
            tally.add(counts)
            if tally.outcomes >= core.config.max_batch:
                self.full = True
                return Added.FULL
        return Added.FIRST if first else Added.NOTHING

    def drain(self) -> dict[BreakerCore, Counts]:
        """Take everything pending (the flusher now owns it)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self.full = False
            self.interval = float("inf")
        return {core: tally.counts() for core, tally in pending.items()}

    def restore(self, core: BreakerCore, counts: Counts) -> int:
        """Put counts that could not be sent back; returns the outcomes now pending."""
        with self._lock:
            tally = self._tally(core)
            tally.add(counts)
            return tally.outcomes

    def take(self, core: BreakerCore) -> Counts | None:
        """Remove and return one breaker's pending counts."""
        with self._lock:
            tally = self._pending.pop(core, None)
        return None if tally is None else tally.counts()

    def pending(self, core: BreakerCore | None = None) -> int:
        """Outcomes pending (for one breaker, or in all)."""
        with self._lock:
            tallies = [self._pending.get(core)] if core is not None else self._pending.values()
            return sum(tally.outcomes for tally in tallies if tally is not None)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def due_in(self) -> float:
        """Seconds until the pending outcomes are due (<= 0: flush now). Under the lock: a
        drain between reading `_pending` and `interval` (an explicit flush from another
        thread) made this infinite once, which killed the flusher thread."""
        with self._lock:
            if self.full or not self._pending:
                return 0.0
            return self.since + self.interval - time.monotonic()

    def reset(self) -> None:
        """In a forked child: nothing pending (the parent sends its own), a fresh lock."""
        self._lock = threading.Lock()
        self._pending = {}
        self.full = False
        self.interval = float("inf")
