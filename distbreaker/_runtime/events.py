"""A thread-safe, fork-safe list of event listeners, shared by every component."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from . import forking

Listener = Callable[[Any], None]

logger = logging.getLogger("distbreaker")


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

    def emit(self, event: Any) -> None:
        with self._lock:
            items = list(self._items)
        for listener in items:
            try:
                listener(event)
            except Exception:  # a listener must not break the protected call
                logger.exception("distbreaker listener %r failed", listener)
