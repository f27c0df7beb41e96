"""Per-process event listeners, shared by every component (thread-safe, fork-safe).

Each listener subscribes to some event kinds. `kind in wanted` is one frozenset
lookup, so a component checks it before building an event: with no listener
for a kind, its events cost nothing but that check.

Listeners are plain callables, called inline in the thread (or task) that made
the event; an exception in a listener is logged, never raised into the protected
call. A listener may also be a coroutine function (or return an awaitable): it is
then scheduled as a task on the running event loop (asyncio components), never
awaited by the call; with no running loop the awaitable is closed and an error
logged. Keep listeners quick: they run on the call's path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import forking

Listener = Callable[[Any], Any]

logger = logging.getLogger("distbreaker")

#: Any kind: ``add_listener(fn, kinds=ALL)``.
ALL = "*"


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing that happened to one component in this process.

    `kind` names it (see each component's `EVENT_KINDS`); the other fields are set
    where they mean something for that kind: `duration` (seconds) of a finished
    call, `error` it raised, `reason` of a rejection or exhaustion, `attempt` and
    `delay` of a retry, `rate` (percent) of a threshold exceeded. `at` is the
    wall clock (epoch seconds) when it was emitted, for display only.
    """

    kind: str
    component: str
    name: str
    duration: float | None = None
    error: BaseException | None = None
    reason: str = ""
    attempt: int = 0
    delay: float = 0.0
    rate: float = -1.0
    state: Any = None
    at: float = dataclasses.field(default_factory=time.time)


_new_object, _wall_clock = object.__new__, time.time


def rejection_event(kind: str, component: str, name: str, error: BaseException,
                    reason: str, state: Any) -> Event:
    """An `Event` of a rejection, the same as ``Event(kind, component, name, error=error,
    reason=reason, state=state)``, built with one dict update instead of the frozen
    dataclass's object.__setattr__ per field (half the cost: it runs per rejection,
    hundreds of thousands a second, when somebody listens)."""
    event = _new_object(Event)
    event.__dict__.update(kind=kind, component=component, name=name, duration=None,
                          error=error, reason=reason, attempt=0, delay=0.0, rate=-1.0,
                          state=state, at=_wall_clock())
    return event


class Listeners:
    """Thread-safe list of (callback, kinds); a failing listener is logged, never raised.

    `kinds` lists the kinds this component emits; `default` are the kinds a
    listener added without `kinds` gets (a breaker's: transitions only, as before).
    """

    def __init__(self, kinds: Iterable[str] = ("transition",),
                 default: Iterable[str] = ("transition",)) -> None:
        self.kinds = frozenset(kinds)
        self._default = frozenset(default)
        self._lock = threading.Lock()
        self._items: list[tuple[Listener, frozenset[str]]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The kinds somebody listens to (read without the lock: a frozenset is replaced).
        self.wanted: frozenset[str] = frozenset()
        #: The listeners of each wanted kind (read without the lock: the dict is replaced),
        #: so an emit (per call, per rejection) takes no lock and builds no list.
        self._by_kind: dict[str, tuple[Listener, ...]] = {}
        forking.register(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another parent thread may have held it at fork time
        self._tasks = set()

    def _kinds_of(self, kinds: str | Iterable[str] | None) -> frozenset[str]:
        if kinds is None:
            return self._default
        chosen = frozenset((kinds,) if isinstance(kinds, str) else kinds)
        if ALL in chosen:
            return self.kinds
        unknown = chosen - self.kinds
        if unknown or not chosen:
            raise ValueError(f"kinds must be among {sorted(self.kinds)} (or {ALL!r}), "
                             f"got {sorted(unknown) or 'none'}")
        return chosen

    def add(self, listener: Listener, kinds: str | Iterable[str] | None = None) -> None:
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {listener!r}")
        chosen = self._kinds_of(kinds)
        with self._lock:
            self._items.append((listener, chosen))
            self._refresh()

    def remove(self, listener: Listener) -> None:
        """Remove `listener` (every subscription of it); ValueError when absent."""
        with self._lock:
            kept = [item for item in self._items if item[0] != listener]
            if len(kept) == len(self._items):
                raise ValueError(f"listener {listener!r} is not registered")
            self._items = kept
            self._refresh()

    def _refresh(self) -> None:
        wanted: set[str] = set()
        for _, kinds in self._items:
            wanted |= kinds
        self._by_kind = {kind: tuple(fn for fn, kinds in self._items if kind in kinds)
                         for kind in wanted}
        self.wanted = frozenset(wanted)

    def emit(self, event: Any, kind: str | None = None) -> None:
        """Call every listener of `kind` (default: the event's own `kind`)."""
        kind = kind or getattr(event, "kind", "transition")
        items = self._by_kind.get(kind)
        if not items:
            return
        for listener in items:
            try:
                result = listener(event)
                if result is not None and inspect.isawaitable(result):
                    self._schedule(listener, result)
            except Exception:  # a listener must not break the protected call
                logger.exception("distbreaker listener %r failed", listener)

    def _schedule(self, listener: Listener, awaitable: Any) -> None:
        """A coroutine listener runs as a task on the running loop (a reference is kept
        until it ends, and its exception is logged)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            logger.error("distbreaker listener %r is a coroutine but no event loop runs "
                         "here (a sync component?): not called", listener)
            return
        task = loop.create_task(awaitable)
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._done(listener, done))

    def _done(self, listener: Listener, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("distbreaker listener %r failed", listener,
                         exc_info=task.exception())
