"""Transitions made by other workers, pushed to batched breakers through pub/sub.

One `Subscriber` thread per Redis and channel listens to the transitions the breaker
script publishes and drops the named watchers' local views (`Watched.invalidate`), so
their next call asks Redis. Best effort: flush replies bound staleness on their own.
The watchers (breakers) register themselves: this module knows only the `Watched`
protocol, not the breaker.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from . import forking

logger = logging.getLogger("distbreaker")

_MAX_BACKOFF = 5.0


def parse_event(data: Any) -> tuple[str, int, bool] | None:
    """(breaker name, server ms, whether it is a recovery: HALF_OPEN -> CLOSED) of a
    published transition, None if not one of ours."""
    try:
        event = json.loads(data)
        recovered = event.get("from") == "HALF_OPEN" and event.get("to") == "CLOSED"
        return str(event["name"]), int(event["at_ms"]), recovered
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def listen_until(stop: threading.Event, make_client: Callable[[], Any], channel: str,
                 serve: Callable[[Any, Any], None], what: str,
                 on_error: Callable[[], None] | None = None) -> None:
    """Subscribe to `channel` with a client of `make_client` and hand both to
    ``serve(client, pubsub)`` until `stop` is set; when Redis fails (down, restarted),
    subscribe again after a backoff (50 ms doubling to 5 s, reset by each subscribe)."""
    backoff = 0.05
    while not stop.is_set():
        pubsub = None
        try:
            client = make_client()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(channel)
            backoff = 0.05
            serve(client, pubsub)
        except Exception as error:
            if on_error is not None:
                on_error()
            logger.debug("distbreaker %s %s: %s", what, channel, error)
            stop.wait(backoff)
            backoff = min(_MAX_BACKOFF, backoff * 2)
        finally:
            if pubsub is not None:
                try:
                    pubsub.close()
                except Exception:
                    pass


class Subscription(NamedTuple):
    """Where a watcher hears transitions: the channel, and the connection to listen
    with (`target` identifies it, so watchers of one server share one connection)."""

    channel: str
    target: Any
    make_client: Callable[[], Any]


class Watched(Protocol):
    """What the subscriber needs of what it watches (a breaker)."""

    @property
    def name(self) -> str: ...

    def invalidate(self, at_ms: int, recovered: bool = False) -> bool:
        """Drop the local view after a transition made elsewhere at `at_ms`; True if
        it was dropped."""
        ...

    def subscription(self) -> Subscription | None:
        """Where to listen; None: nowhere (views are revalidated on a timer instead)."""
        ...


class Subscriber:
    """One pub/sub connection, in a daemon thread, invalidating the watched breakers.

    A transition this process's own reply already reported is recognised by its
    server time and ignored. While Redis is unreachable the thread retries with
    backoff; it is started lazily and again in forked children.
    """

    def __init__(self, make_client: Callable[[], Any], channel: str) -> None:
        self._make_client = make_client
        self.channel = channel
        self._watched: dict[str, weakref.WeakSet[Watched]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.ready = threading.Event()  # set once subscribed (tests wait on it)
        #: Views dropped because of another worker's transition.
        self.invalidations = 0
        forking.register(self)

    def watch(self, core: Watched) -> None:
        with self._lock:
            self._watched.setdefault(core.name, weakref.WeakSet()).add(core)
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,),
                                                daemon=True,
                                                name=f"distbreaker-subscriber {self.channel}")
                self._thread.start()

    def unwatch(self, core: Watched) -> None:
        """Stop watching `core`; with nothing left to watch the thread ends by itself
        (within the 1 s it waits for a message, `_idle`) and closes its connection."""
        with self._lock:
            watched = self._watched.get(core.name)
            if watched is not None:
                watched.discard(core)
                if not watched:
                    del self._watched[core.name]

    def _idle(self, stop: threading.Event) -> bool:
        """Thread side: with nothing watched, end this thread. Decided under the lock,
        so a watch before it keeps this thread and one after it starts a new one: a
        process that creates and closes breakers in a loop reuses one thread and one
        connection instead of leaving one per breaker open until its next wake."""
        with self._lock:
            if self._watched:
                return False
            stop.set()
            if self._thread is threading.current_thread():
                self._thread = None
            return True

    def siblings_of(self, core: Watched) -> list[Watched]:
        """The other watched breakers of the same name (same server) in this process."""
        with self._lock:
            return [c for c in self._watched.get(core.name, ()) if c is not core]

    def handle(self, data: Any) -> None:
        parsed = parse_event(data)
        if parsed is None:
            return
        name, at_ms, recovered = parsed
        with self._lock:
            cores = list(self._watched.get(name, ()))
        for core in cores:
            if core.invalidate(at_ms, recovered):
                self.invalidations += 1

    def _run(self, stop: threading.Event) -> None:
        """The thread's body; `stop` is this thread's own (a later restart makes a new one)."""

        def serve(client: Any, pubsub: Any) -> None:
            del client
            self.ready.set()
            while not stop.is_set() and not self._idle(stop):
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    self.handle(message["data"])

        def on_error() -> None:
            self.ready.clear()
            self._idle(stop)

        listen_until(stop, self._make_client, self.channel, serve, "subscriber",
                     on_error=on_error)

    def _after_fork(self) -> None:
        """In a forked child: no thread yet (the next flush starts one), fresh lock."""
        self._lock = threading.Lock()
        self._thread = None
        self.ready = threading.Event()


class Subscribers:
    """The process's subscribers, one per Redis connection target and channel: one
    connection per Redis client (sync breakers) or per URL (asyncio breakers built
    from a URL; an asyncio breaker given a client relies on its flush replies)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_target: dict[tuple[Any, str], Subscriber] = {}
        #: id(core) -> its subscriber (weak on the subscriber side: cores are in WeakSets).
        self._of_core: weakref.WeakValueDictionary[int, Subscriber] = (
            weakref.WeakValueDictionary())
        forking.register(self)

    def watch(self, core: Watched) -> Subscriber | None:
        """Have transitions of `core`'s name made elsewhere drop its local view."""
        where = core.subscription()
        if where is None:
            return None
        target = (where.target, where.channel)
        with self._lock:
            subscriber = self._by_target.get(target)
            if subscriber is None:
                subscriber = self._by_target[target] = Subscriber(where.make_client,
                                                                  where.channel)
            self._of_core[id(core)] = subscriber
        subscriber.watch(core)
        return subscriber

    def unwatch(self, core: Watched) -> None:
        """`core` is closed: its subscriber stops when it watches nothing else."""
        subscriber = self._of_core.pop(id(core), None)
        if subscriber is not None:
            subscriber.unwatch(core)

    def made_transition(self, core: Watched, at_ms: int, recovered: bool = False) -> None:
        """`core`'s own reply reported a transition: breakers of the same name in this
        process drop their views now (without waiting for the pub/sub message)."""
        subscriber = self._of_core.get(id(core))
        if subscriber is None:
            return
        for sibling in subscriber.siblings_of(core):
            if sibling.invalidate(at_ms, recovered):
                subscriber.invalidations += 1

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


def listen_source(url: str | None, blocking_client: Any, given_async_client: Any,
                  timeout: float) -> tuple[Any, Callable[[], Any]] | None:
    """What to subscribe with, as (target, make_client): a sync component's own client,
    or a sync client to an asyncio component's URL or server (None: an asyncio client
    that cannot be mirrored)."""
    if url is not None:
        from .connection import waiting_client

        return ("url", url), lambda: waiting_client(url, timeout, None)
    client = blocking_client
    given_async = client is None
    if given_async:
        client = given_async_client
        if client is None or type(client).__module__.startswith("fakeredis"):
            return None  # nothing to mirror with a sync client (memory:// given as a client)
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        # A cluster client, or an asyncio one we cannot mirror: views stay bounded by
        # revalidate_interval instead.
        return None if given_async else (("client", id(client)), lambda: client)
    # Breakers on the same server share one subscriber.
    key: Any = ("server", *(str(kwargs.get(k)) for k in ("host", "port", "path", "db",
                                                         "username")))
    if not given_async:
        return key, lambda: client
    # An asyncio client: listen with a sync client to the same server (a thread, like
    # every other subscriber: it must not depend on an event loop being alive).
    import redis

    options = {k: kwargs[k] for k in ("host", "port", "path", "db", "username", "password")
               if kwargs.get(k) is not None}
    if "path" in options:
        options.pop("host", None)
        options.pop("port", None)
        options["unix_socket_path"] = options.pop("path")
    return key, lambda: redis.Redis(socket_timeout=None, socket_connect_timeout=timeout,
                                    **options)


SUBSCRIBERS = Subscribers()
