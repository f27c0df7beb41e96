"""Transitions made by other workers, pushed to batched breakers through pub/sub.

A batched breaker learns the fleet state from its flush replies, so a process
calling a dependency that another worker has just tripped would otherwise
find out only at its next flush (up to ``flush_interval`` later). The breaker
script publishes every transition on the events channel (JSON with ``name``
and ``at_ms``, see docs/KEY_SCHEMA.md); a `Subscriber` thread per Redis and
channel listens and drops the local view of the named breakers, so their next
call asks Redis (one round trip) and sees OPEN at once. A transition this
process's own reply already reported is recognised by its server time and
ignored.

Best effort by design: while Redis is unreachable the thread retries with
backoff, and the flush replies keep the staleness bound on their own. One
connection per Redis client (sync breakers) or per URL (asyncio breakers built
from a URL; an asyncio breaker given a client relies on its flush replies).
Started lazily by the flusher, restarted in forked children.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import forking

if TYPE_CHECKING:
    from ..breaker.core import BreakerCore

logger = logging.getLogger("distbreaker")

_MAX_BACKOFF = 5.0


def parse_event(data: Any) -> tuple[str, int] | None:
    """(breaker name, server ms) of a published transition, None if not one of ours."""
    try:
        event = json.loads(data)
        return str(event["name"]), int(event["at_ms"])
    except (ValueError, TypeError, KeyError):
        return None


class Subscriber:
    """One pub/sub connection, in a daemon thread, invalidating the watched breakers."""

    def __init__(self, make_client: Callable[[], Any], channel: str) -> None:
        self._make_client = make_client
        self.channel = channel
        self._watched: dict[str, weakref.WeakSet[BreakerCore]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.ready = threading.Event()  # set once subscribed (tests wait on it)
        #: Views dropped because of another worker's transition.
        self.invalidations = 0
        forking.register(self)

    def watch(self, core: BreakerCore) -> None:
        with self._lock:
            self._watched.setdefault(core.name, weakref.WeakSet()).add(core)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"distbreaker-subscriber {self.channel}")
                self._thread.start()

    def handle(self, data: Any) -> None:
        parsed = parse_event(data)
        if parsed is None:
            return
        name, at_ms = parsed
        with self._lock:
            cores = list(self._watched.get(name, ()))
        for core in cores:
            if core._codec.invalidate(at_ms):
                self.invalidations += 1

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._make_client().pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                self.ready.set()
                backoff = 0.05
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self.handle(message["data"])
            except Exception as error:  # Redis down or restarted: retry with backoff
                self.ready.clear()
                logger.debug("distbreaker subscriber %s: %s", self.channel, error)
                time.sleep(backoff)
                backoff = min(_MAX_BACKOFF, backoff * 2)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        pass

    def _after_fork(self) -> None:
        """In a forked child: no thread yet (the next flush starts one), fresh lock."""
        self._lock = threading.Lock()
        self._thread = None
        self.ready = threading.Event()


class Subscribers:
    """The process's subscribers, one per Redis connection target and channel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_target: dict[tuple[Any, str], Subscriber] = {}
        forking.register(self)

    def watch(self, core: BreakerCore) -> Subscriber | None:
        """Have transitions of `core`'s breaker made elsewhere drop its local view."""
        target = _target(core)
        if target is None:
            return None
        key, make_client = target
        channel = core.keys.channel
        with self._lock:
            subscriber = self._by_target.get((key, channel))
            if subscriber is None:
                subscriber = self._by_target[(key, channel)] = Subscriber(make_client, channel)
        subscriber.watch(core)
        return subscriber

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


def url_of(core: BreakerCore) -> str | None:
    """The URL an asyncio breaker builds its per-loop clients from (None: given a client)."""
    if not hasattr(core, "_per_loop") or getattr(core, "_given", None) is not None:
        return None
    from .connection import DEFAULT_URL

    url = getattr(core, "_url", None)
    return url if isinstance(url, str) else DEFAULT_URL


def _target(core: BreakerCore) -> tuple[Any, Callable[[], Any]] | None:
    """What to subscribe with: the sync client itself, or a sync client from the URL."""
    url = url_of(core)
    if url is not None:
        from .connection import waiting_client

        timeout = core.config.redis_timeout
        return ("url", url), lambda: waiting_client(url, timeout, None)
    if hasattr(core, "_per_loop"):  # an asyncio breaker given an asyncio client
        return None
    client = core._client  # type: ignore[attr-defined]
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):  # breakers on the same server share one subscriber
        key: Any = ("server", *(str(kwargs.get(k)) for k in
                                ("host", "port", "path", "db", "username")))
    else:
        key = ("client", id(client))
    return key, lambda: client


SUBSCRIBERS = Subscribers()
