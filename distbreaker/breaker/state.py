"""Breaker states, as stored in Redis (the enum value is the wire value)."""

from __future__ import annotations

from enum import Enum


class State(str, Enum):
    """Fleet-wide breaker state; `str`-valued so it compares with the wire form."""

    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"
    FORCED_OPEN = "FORCED_OPEN"
    DISABLED = "DISABLED"
    METRICS_ONLY = "METRICS_ONLY"

    def __str__(self) -> str:
        return self.value

