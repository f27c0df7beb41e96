"""Batched record mode: CLOSED outcomes accumulated per process, flushed as counts.

In ``record_mode="batched"`` a protected call in CLOSED makes no Redis round
trip at all: its outcome is added to this process's `Accumulator` (per breaker:
successes, failures, slow calls, total ms; ignored calls are not counted) and a
flusher sends the counts to the record script, one pipeline per Redis client
carrying every breaker with pending outcomes:

* at most every ``flush_interval`` (the shortest of the pending breakers'),
  counted from the first outcome pending since the last flush, and
* at once when one breaker has ``max_batch`` outcomes pending.

Each reply goes through the breaker's normal reply path, which refreshes its
local view (so OPEN is seen by the flush that follows the trip, and a known
OPEN wait then costs 0 round trips) and reports the transitions that flush made
(once, fleet-wide, as in exact mode). HALF_OPEN probes never go through here:
they carry a lease token and are recorded at once.

The sync front end shares one daemon thread per process (`ThreadFlusher`);
the asyncio front end one task per event loop (`LoopFlusher`), both over the
same pure `Accumulator` and `FlushCore` (planning and reply handling).

Fork safety: a child starts with an empty accumulator (what was pending at the
fork belongs to, and is sent by, the parent) and starts its own flusher on its
first batched outcome. What is pending at exit is flushed by ``atexit`` (and by
a multiprocessing finalizer in fork children, which leave with ``os._exit``);
an asyncio flusher flushes when its task is cancelled (``asyncio.run`` does so
at the end), and what is still pending at exit on a URL-built asyncio breaker
is sent by a blocking client.

Redis unreachable: counts stay pending (they are counts: memory does not grow)
up to ``max_pending`` outcomes per breaker; beyond that the ``on_redis_error``
policy applies as in exact mode: fail_open hands them to the in-process
fallback breaker, fail_closed drops them (and logs how many).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._runtime import forking
from ..._runtime.health import UNAVAILABLE_ERRORS
from ..._runtime.scripts import run_script, run_scripts_each, run_scripts_each_async
from ..._runtime.subscriber import SUBSCRIBERS, url_of
from ..core import Counts, ScriptCall

if TYPE_CHECKING:
    from ..core import BreakerCore

logger = logging.getLogger("distbreaker")

NOTHING, FIRST, FULL = 0, 1, 2  # what `Accumulator.add` tells the flusher


class Accumulator:
    """Pending outcome counts per breaker; thread-safe, O(1) per outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[BreakerCore, list[int]] = {}
        self.full = False
        self.interval = float("inf")
        self.since = 0.0  # monotonic time the oldest pending outcome arrived

    def add(self, core: BreakerCore, counts: Counts) -> int:
        """Add one call's counts; FIRST: the accumulator was empty, FULL: flush now."""
        config = core.config
        with self._lock:
            entry = self._pending.get(core)
            if entry is None:
                first = not self._pending
                if first:
                    self.since = time.monotonic()
                self._pending[core] = entry = list(counts)
                if config.flush_interval < self.interval:
                    self.interval = config.flush_interval
            else:
                first = False
                entry[0] += counts[0]
                entry[1] += counts[1]
                entry[2] += counts[2]
                entry[3] += counts[3]
            if entry[0] + entry[1] >= config.max_batch:
                self.full = True
                return FULL
        return FIRST if first else NOTHING

    def drain(self) -> dict[BreakerCore, Counts]:
        """Take everything pending (the flusher now owns it)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self.full = False
            self.interval = float("inf")
        return {core: (e[0], e[1], e[2], e[3]) for core, e in pending.items()}

    def restore(self, core: BreakerCore, counts: Counts) -> int:
        """Put counts that could not be sent back; returns the outcomes now pending."""
        with self._lock:
            if not self._pending:
                self.since = time.monotonic()
            entry = self._pending.setdefault(core, [0, 0, 0, 0])
            for i in range(4):
                entry[i] += counts[i]
            self.interval = min(self.interval, core.config.flush_interval)
            return entry[0] + entry[1]

    def take(self, core: BreakerCore) -> Counts | None:
        """Remove and return one breaker's pending counts."""
        with self._lock:
            entry = self._pending.pop(core, None)
        return None if entry is None else (entry[0], entry[1], entry[2], entry[3])

    def pending(self, core: BreakerCore | None = None) -> int:
        """Outcomes pending (for one breaker, or in all)."""
        with self._lock:
            entries = [self._pending.get(core)] if core is not None else self._pending.values()
            return sum(e[0] + e[1] for e in entries if e is not None)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def due_in(self) -> float:
        """Seconds until the pending outcomes are due (<= 0: flush now)."""
        if self.full or not self._pending:
            return 0.0
        return self.since + self.interval - time.monotonic()

    def reset(self) -> None:
        """In a forked child: nothing pending (the parent sends its own), a fresh lock."""
        self._lock = threading.Lock()
        self._pending = {}
        self.full = False
        self.interval = float("inf")


class FlushCore:
    """What the thread and the asyncio flushers share: planning and reply handling."""

    def __init__(self) -> None:
        self.acc = Accumulator()
        #: Flushes that sent something, pipelines sent, outcomes sent and dropped.
        self.flushes = 0
        self.pipelines = 0
        self.sent = 0
        self.dropped = 0

    def attach(self, core: BreakerCore) -> None:
        """A new batched breaker: listen for transitions made elsewhere from the start."""
        if core.config.subscribe:
            SUBSCRIBERS.watch(core)

    def plan(self, drained: dict[BreakerCore, Counts], client_of: Any,
             ) -> list[tuple[Any, list[tuple[BreakerCore, Counts, ScriptCall]]]]:
        """Group the drained counts by Redis client (one pipeline each); breakers whose
        Redis is in backoff are not tried (their counts go back, see `unreachable`)."""
        groups: dict[int, tuple[Any, list[tuple[BreakerCore, Counts, ScriptCall]]]] = {}
        for core, counts in drained.items():
            if core.config.subscribe:
                SUBSCRIBERS.watch(core)  # (again: a forked child starts its own)
            if not core._health.usable():
                self.unreachable(core, counts, None)
                continue
            client = client_of(core)
            groups.setdefault(id(client), (client, []))[1].append(
                (core, counts, core._codec.batch_call(counts)))
        return list(groups.values())

    def settled(self, items: Sequence[tuple[BreakerCore, Counts, ScriptCall]],
                results: Sequence[Any]) -> None:
        """Each breaker's reply refreshes its view and reports its transitions; a
        breaker whose call met an error is handled alone (a pipeline is not a
        transaction: the others' counts are recorded, and must not be sent again)."""
        self.pipelines += 1
        for (core, counts, _), result in zip(items, results, strict=True):
            if isinstance(result, UNAVAILABLE_ERRORS):
                self.unreachable(core, counts, result)
            elif isinstance(result, Exception):
                self.failed_call(core, counts, result)
            else:
                self.sent += counts[0] + counts[1]
                core._redis_reply(result)

    def pipeline_failed(self, items: Sequence[tuple[BreakerCore, Counts, ScriptCall]],
                        error: Exception) -> None:
        """The whole pipeline failed: Redis unavailable (keep the counts), or anything
        else (whether the scripts ran is unknown: drop them rather than count twice)."""
        for core, counts, _ in items:
            if isinstance(error, UNAVAILABLE_ERRORS):
                self.unreachable(core, counts, error)
            else:
                self.failed_call(core, counts, error)

    def unreachable(self, core: BreakerCore, counts: Counts,
                    error: BaseException | None) -> None:
        """Redis could not take these counts: keep them, up to the breaker's bound."""
        if error is not None:
            core._redis_failed(error)
        if self.acc.restore(core, counts) <= core.config.max_pending:
            return
        spilled = self.acc.take(core)
        if spilled is None:
            return
        if core.fail_closed:
            self.dropped += spilled[0] + spilled[1]
            logger.warning("circuit breaker %s: Redis unreachable, dropped %d batched "
                           "outcomes (fail_closed, max_pending %d)", core.name,
                           spilled[0] + spilled[1], core.config.max_pending)
        else:
            core._fallback(core._codec.batch_call(spilled), acquiring=False)

    def failed_call(self, core: BreakerCore, counts: Counts, error: BaseException) -> None:
        """A reply that is an error other than "unavailable" (foreign data, bad config):
        the counts cannot ever be recorded; exact mode would raise it in the call."""
        self.dropped += counts[0] + counts[1]
        logger.error("circuit breaker %s: batched record failed, %d outcomes dropped: %s",
                     core.name, counts[0] + counts[1], error)


def _client_of(core: BreakerCore) -> Any:
    """The breaker's client (an asyncio breaker's: the running loop's)."""
    return core._client  # type: ignore[attr-defined]


class ThreadFlusher(FlushCore):
    """The process's flusher for sync breakers: one daemon thread, started lazily."""

    def __init__(self) -> None:
        super().__init__()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._pid = os.getpid()
        forking.register(self)

    def add(self, core: BreakerCore, counts: Counts) -> None:
        """The hot path: O(1), no I/O; wakes the flusher when it has work."""
        if self._pid != os.getpid():
            _forked(self)  # a fork that skipped Python's fork hooks
        if self.acc.add(core, counts) is not NOTHING:
            if self._thread is None:
                self._start()
            self._wake.set()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="distbreaker-flusher", daemon=True)
            self._thread = thread
            thread.start()
            _register_exit_finalizer()

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
            drained = self.acc.drain()
            if not drained:
                return
            self.flushes += 1
            for client, items in self.plan(drained, _client_of):
                self._send(client, items)

    def _send(self, client: Any,
              items: list[tuple[BreakerCore, Counts, ScriptCall]]) -> None:
        try:
            results = run_scripts_each(
                client, [(core._script, c.keys, c.args) for core, _, c in items])
        except Exception as error:
            self.pipeline_failed(items, error)
        else:
            self.settled(items, results)

    def _after_fork(self) -> None:
        """In a forked child: an empty accumulator and no thread (started on first use)."""
        self.acc.reset()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._thread = None
        self._pid = os.getpid()


def _forked(obj: Any) -> None:
    """Reset everything fork-aware (once per process), and `obj` in any case."""
    forking.after_fork()
    if obj._pid != os.getpid():
        obj._after_fork()


class LoopFlusher(FlushCore):
    """One event loop's flusher for asyncio breakers: a task, started lazily."""

    def __init__(self) -> None:
        super().__init__()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._flush_lock: asyncio.Lock | None = None

    def add(self, core: BreakerCore, counts: Counts) -> None:
        if self.acc.add(core, counts) is not NOTHING:
            if self._task is None or self._task.done():  # (a task that died: start anew)
                self._wake = asyncio.Event()
                self._flush_lock = asyncio.Lock()
                self._task = asyncio.get_running_loop().create_task(
                    self._run(), name="distbreaker-flusher")
            assert self._wake is not None
            self._wake.set()

    async def _run(self) -> None:
        acc, wake = self.acc, self._wake
        assert wake is not None
        try:
            while True:
                await wake.wait()
                wake.clear()
                delay = acc.due_in()
                while delay > 0:
                    try:
                        await asyncio.wait_for(wake.wait(), delay)
                    except asyncio.TimeoutError:  # not the builtin one before Python 3.11
                        pass
                    wake.clear()
                    delay = acc.due_in()
                try:
                    await self.flush()
                except Exception:
                    logger.exception("distbreaker: batched flush failed")
                if acc:  # counts kept while Redis is unreachable: try again later
                    wake.set()
        except asyncio.CancelledError:
            # The loop is shutting down (asyncio.run cancels its tasks): send what is
            # pending while the loop and its connections still run.
            try:
                await self.flush()
            finally:
                self._task = None
            raise

    async def flush(self) -> None:
        """Send everything pending now; returns when it is in Redis (or kept)."""
        lock = self._flush_lock or asyncio.Lock()
        async with lock:
            drained = self.acc.drain()
            if not drained:
                return
            self.flushes += 1
            for client, items in self.plan(drained, _client_of):
                await self._send(client, items)

    async def _send(self, client: Any,
                    items: list[tuple[BreakerCore, Counts, ScriptCall]]) -> None:
        try:
            results = await run_scripts_each_async(
                client, [(core._script, c.keys, c.args) for core, _, c in items])
        except Exception as error:
            self.pipeline_failed(items, error)
        else:
            self.settled(items, results)

    def flush_blocking(self) -> None:
        """At interpreter exit, with the loop gone: send what URL-built breakers hold
        with a blocking client (a breaker given an asyncio client loses its counts)."""
        import redis

        drained = self.acc.drain()
        clients: dict[str, Any] = {}
        for core, counts in drained.items():
            url = url_of(core)
            if url is None:
                self.failed_call(core, counts, RuntimeError("event loop closed before flush"))
                continue
            client = clients.get(url)
            if client is None:
                client = clients[url] = redis.Redis.from_url(
                    url, socket_timeout=core.config.redis_timeout,
                    socket_connect_timeout=core.config.redis_timeout)
            call = core._codec.batch_call(counts)
            try:
                core._redis_reply(run_script(client, core._script, call.keys, call.args))
            except Exception as error:
                self.failed_call(core, counts, error)

    def _after_fork(self) -> None:
        self.acc.reset()


class LoopFlushers:
    """The asyncio flushers, one per running event loop."""

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopFlusher] = (
            weakref.WeakKeyDictionary())
        self._all: weakref.WeakSet[LoopFlusher] = weakref.WeakSet()
        self._pid = os.getpid()
        forking.register(self)

    def current(self) -> LoopFlusher:
        loop = asyncio.get_running_loop()
        flusher = self._by_loop.get(loop)
        if flusher is None:
            flusher = self._by_loop[loop] = LoopFlusher()
            self._all.add(flusher)
        return flusher

    def add(self, core: BreakerCore, counts: Counts) -> None:
        if self._pid != os.getpid():
            _forked(self)
        self.current().add(core, counts)

    def attach(self, core: BreakerCore) -> None:
        if core.config.subscribe:
            SUBSCRIBERS.watch(core)

    def leftovers(self) -> list[LoopFlusher]:
        return [flusher for flusher in list(self._all) if flusher.acc]

    def _after_fork(self) -> None:
        # The parent's loops do not run in the child: start over, nothing pending.
        for flusher in list(self._all):
            flusher.acc.reset()
        self._by_loop = weakref.WeakKeyDictionary()
        self._all = weakref.WeakSet()
        self._pid = os.getpid()


#: The process-wide flushers (sync thread; asyncio, per loop).
THREAD_FLUSHER = ThreadFlusher()
LOOP_FLUSHERS = LoopFlushers()


def flush() -> None:
    """Send every sync breaker's pending outcomes now (blocking)."""
    THREAD_FLUSHER.flush()


def _flush_at_exit() -> None:
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


atexit.register(_flush_at_exit)
