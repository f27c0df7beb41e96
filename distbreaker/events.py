"""Transition events and the per-breaker listener list.

A transition is reported exactly once fleet-wide, by the script call that made
it: that process calls its local listeners; the script itself publishes it on
the pub/sub channel and appends it to the breaker's history stream.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from . import forking
from .state import State

logger = logging.getLogger("distbreaker")


@dataclasses.dataclass(frozen=True)
class Transition:
    """One state change of one breaker.

    `source` is "redis" for a fleet-wide transition, "local" for one made by
    the in-process fallback breaker while Redis was unreachable.
    """

    name: str
    from_state: State
    to_state: State
    reason: str
    at_ms: int
    source: str = "redis"
    #: Rates (percent) of the window the transition was decided on (the probes'
    #: for a half-open verdict), as in the history stream; -1: no calls, or unknown.
    failure_rate: float = -1.0
    slow_rate: float = -1.0


Listener = Callable[[Transition], None]


def log_extra(event: Transition) -> dict[str, object]:
    """The structured fields of a transition's log record (``name`` is taken by
    logging itself, so the breaker's name is ``breaker``)."""
    return {"breaker": event.name, "from_state": event.from_state.value,
            "to_state": event.to_state.value, "reason": event.reason,
            "failure_rate": event.failure_rate, "slow_rate": event.slow_rate,
            "at_ms": event.at_ms, "source": event.source}


class Listeners:
    """Thread-safe list of callbacks; a failing listener is logged, never raised."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Listener] = []
        forking.register(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another parent thread may have held it at fork time

    def add(self, listener: Listener) -> None:
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {listener!r}")
        with self._lock:
            self._items.append(listener)

    def remove(self, listener: Listener) -> None:
        with self._lock:
            self._items.remove(listener)

    def emit(self, event: Transition) -> None:
        logger.info("circuit breaker %s: %s -> %s (%s)", event.name, event.from_state.value,
                    event.to_state.value, event.reason, extra=log_extra(event))
        with self._lock:
            items = list(self._items)
        for listener in items:
            try:
                listener(event)
            except Exception:  # a listener must not break the protected call
                logger.exception("distbreaker listener %r failed", listener)
