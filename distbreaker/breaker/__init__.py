"""The fleet-wide circuit breaker: config, pure core, sync and asyncio shells, batching.

The names below are imported on first use (PEP 562), so a reader that needs only the
config or the core (the CLI's `ls`, `distbreaker.readside`) does not load the shells
and the batching machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import BreakerConfig, RecordMode, RedisErrorPolicy, WindowType
    from .core import BreakerMetrics, Metrics
    from .events import Transition
    from .state import State
    from .sync import CircuitBreaker

#: Each public name and the submodule defining it.
_WHERE = {"BreakerConfig": "config", "RecordMode": "config", "RedisErrorPolicy": "config",
          "WindowType": "config", "BreakerMetrics": "core", "Metrics": "core",
          "Transition": "events", "State": "state", "CircuitBreaker": "sync"}

__all__ = ["BreakerConfig", "BreakerMetrics", "CircuitBreaker", "Metrics", "RecordMode",
           "RedisErrorPolicy", "State", "Transition", "WindowType"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
