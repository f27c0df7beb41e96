"""Transition events of a breaker.

A transition is reported exactly once fleet-wide, by the script call that made
it: that process calls its local listeners; the script itself publishes it on
the pub/sub channel and appends it to the breaker's history stream.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

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


def log_transition(event: Transition) -> None:
    """The INFO log line of a transition, with its fields as structured extras."""
    logger.info("circuit breaker %s: %s -> %s (%s)", event.name, event.from_state.value,
                event.to_state.value, event.reason, extra=log_extra(event))
