"""What the thread and the asyncio flushers share, without I/O: grouping drained counts
into one pipeline per Redis client, and handling each breaker's reply or failure.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._runtime import forking
from ..._runtime.health import UNAVAILABLE_ERRORS
from ..._runtime.scripts import PendingCall
from ..._runtime.subscriber import SUBSCRIBERS
from ..core import Counts
from .accumulator import Accumulator

if TYPE_CHECKING:
    from ..core import BreakerCore

logger = logging.getLogger("distbreaker")


def outcome_count(counts: Counts) -> int:
    """Calls counted in `counts` (successes and failures; slow ones are among them)."""
    return counts[0] + counts[1]


class Batch(NamedTuple):
    """One breaker's drained counts and the record call carrying them."""

    core: BreakerCore
    counts: Counts
    call: PendingCall


def watch_transitions(core: BreakerCore) -> None:
    """Have transitions other processes make drop `core`'s view (if it subscribes)."""
    if core.config.subscribe:
        SUBSCRIBERS.watch(core)


class FlushCore:
    """Planning a flush and settling its replies; counts what it sent and dropped."""

    def __init__(self) -> None:
        self.acc = Accumulator()
        #: Flushes that sent something, pipelines sent, outcomes sent and dropped.
        self.flushes = 0
        self.pipelines = 0
        self.sent = 0
        self.dropped = 0

    def attach(self, core: BreakerCore) -> None:
        """A new batched breaker: listen for transitions made elsewhere from the start."""
        watch_transitions(core)

    def take_plan(self) -> list[tuple[Any, list[Batch]]]:
        """Take everything pending and `plan` its flush (nothing pending: no pipelines)."""
        drained = self.acc.drain()
        if not drained:
            return []
        self.flushes += 1
        return self.plan(drained)

    def plan(self, drained: dict[BreakerCore, Counts]) -> list[tuple[Any, list[Batch]]]:
        """Group the drained counts by Redis client (one pipeline each); breakers whose
        Redis is in backoff are not tried (their counts go back, see `unreachable`)."""
        groups: dict[int, tuple[Any, list[Batch]]] = {}
        for core, counts in drained.items():
            watch_transitions(core)  # (again: a forked child starts its own subscriber)
            client, call = core.owed_batch(counts)
            batch = Batch(core, counts, call)
            if not call.usable():
                self.unreachable(batch, None)
                continue
            groups.setdefault(id(client), (client, []))[1].append(batch)
        return list(groups.values())

    def settled(self, batches: Sequence[Batch], results: Sequence[Any]) -> None:
        """Each breaker's reply refreshes its view and reports its transitions; a
        breaker whose call met an error is handled alone (a pipeline is not a
        transaction: the others' counts are recorded, and must not be sent again)."""
        self.pipelines += 1
        for batch, result in zip(batches, results, strict=True):
            if isinstance(result, UNAVAILABLE_ERRORS):
                self.unreachable(batch, result)
            elif isinstance(result, Exception):
                self.failed_call(batch.core, batch.counts, result)
            else:
                self.sent += outcome_count(batch.counts)
                batch.call.reply(result)

    def pipeline_failed(self, batches: Sequence[Batch], error: Exception) -> None:
        """The whole pipeline failed: Redis unavailable (keep the counts), or anything
        else (whether the scripts ran is unknown: drop them rather than count twice)."""
        for batch in batches:
            if isinstance(error, UNAVAILABLE_ERRORS):
                self.unreachable(batch, error)
            else:
                self.failed_call(batch.core, batch.counts, error)

    def unreachable(self, batch: Batch, error: BaseException | None) -> None:
        """Redis could not take these counts: keep them, up to the breaker's bound;
        beyond it the breaker's on_redis_error policy takes them."""
        core = batch.core
        batch.call.on_unavailable(error)
        if self.acc.restore(core, batch.counts) <= core.config.max_pending:
            return
        spilled = self.acc.take(core)
        if spilled is None or core.spill_batch(spilled):
            return
        self.dropped += outcome_count(spilled)
        logger.warning("circuit breaker %s: Redis unreachable, dropped %d batched outcomes "
                       "(fail_closed, max_pending %d)", core.name, outcome_count(spilled),
                       core.config.max_pending)

    def failed_call(self, core: BreakerCore, counts: Counts, error: BaseException) -> None:
        """A reply that is an error other than "unavailable" (foreign data, bad config):
        the counts cannot ever be recorded; exact mode would raise it in the call."""
        self.dropped += outcome_count(counts)
        logger.error("circuit breaker %s: batched record failed, %d outcomes dropped: %s",
                     core.name, outcome_count(counts), error)


def reset_if_forked(flusher: Any) -> None:
    """After a fork that skipped Python's fork hooks: reset everything fork-aware (once
    per process), and `flusher` in any case."""
    forking.after_fork()
    if flusher._pid != os.getpid():  # reach-in: a helper of the flushers' own check
        flusher._after_fork()
