"""Keeping a process's fault-injection table fresh: one daemon thread per Redis server
and key prefix, started only by a component whose config allows injection.

The thread re-reads the injections in force (lua/inject.lua, op "read") at once when
the events channel says they changed, and every `REFRESH_S` seconds in any case; the
same call registers the names this process allows, so `distbreaker inject` can refuse
an injection no running worker would obey. A process that allows nothing runs none of
this: its calls never look at a table.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from . import forking
from .faults import REFRESH_S, REGISTRATION_MS, FaultTable, fault_keys, parse_flat
from .scripts import load_script, run_script
from .subscriber import Subscription, listen_until


def is_fault_notice(data: Any) -> bool:
    """Whether a message of the events channel says the injections changed."""
    try:
        return bool(json.loads(data).get("faults"))
    except (ValueError, TypeError, AttributeError):
        return False


class FaultFeed:
    """The injections of one prefix on one Redis, kept fresh by a daemon thread, and the
    names this process allows (registered with every read)."""

    def __init__(self, where: Subscription, prefix: str) -> None:
        self._where = where
        self._keys = fault_keys(prefix)
        self.table = FaultTable()
        self._names: dict[str, int] = {}  # name -> objects allowing it here
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.reads = 0
        forking.register(self)

    def join(self, name: str) -> None:
        with self._lock:
            self._names[name] = self._names.get(name, 0) + 1
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,),
                                                daemon=True, name="distbreaker-faults")
                self._thread.start()
            else:
                self._wake.set()  # register the new name now

    def leave(self, name: str) -> None:
        with self._lock:
            left = self._names.get(name, 0) - 1
            if left > 0:
                self._names[name] = left
            else:
                self._names.pop(name, None)
        # With no name left the thread ends by itself within its 0.25 s wait (`_idle`).

    def _idle(self, stop: threading.Event) -> bool:
        """Thread side: with no name left, end this thread; decided under the lock so
        that create/close churn reuses one thread and connection (as the subscriber's)."""
        with self._lock:
            if self._names:
                return False
            stop.set()
            if self._thread is threading.current_thread():
                self._thread = None
            return True

    def stop(self) -> None:
        """Forget every name and end the thread (it ends within its 0.25 s wait)."""
        with self._lock:
            self._names.clear()
            if self._thread is not None:
                self._stop.set()
                self._wake.set()
                self._thread = None

    def _read(self, client: Any) -> None:
        with self._lock:
            names = sorted(self._names)
        sent = time.monotonic()
        flat = run_script(client, load_script("inject"), self._keys,
                          ["read", str(REGISTRATION_MS), *names])
        now_ms, faults, _ = parse_flat(flat)
        self.table.replace(now_ms, faults, sent)
        self.reads += 1

    def _run(self, stop: threading.Event) -> None:
        """The thread's body; `stop` is this thread's own (a later join makes a new one)."""

        def serve(client: Any, pubsub: Any) -> None:
            self._read(client)
            due = time.monotonic() + REFRESH_S
            while not stop.is_set() and not self._idle(stop):
                message = pubsub.get_message(timeout=max(0.0, min(0.25, due - time.monotonic())))
                changed = self._wake.is_set() or time.monotonic() >= due
                if message is not None and message.get("type") == "message":
                    changed = changed or is_fault_notice(message["data"])
                if changed:
                    self._wake.clear()
                    self._read(client)
                    due = time.monotonic() + REFRESH_S

        listen_until(stop, self._where.make_client, self._where.channel, serve, "fault feed",
                     on_error=lambda: self._idle(stop))

    def _after_fork(self) -> None:
        """In a forked child: start a thread of its own on the next join or call."""
        self._lock = threading.Lock()
        self._thread = None
        if self._names:
            names, self._names = self._names, {}
            for name, n in names.items():
                for _ in range(n):
                    self.join(name)


class FaultFeeds:
    """The process's feeds, one per (Redis server, channel, prefix)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._feeds: dict[tuple[Any, str, str], FaultFeed] = {}

    def join(self, name: str, where: Subscription, prefix: str) -> FaultFeed:
        """The feed `name` reads its injections from (started if need be)."""
        key = (where.target, where.channel, prefix)
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None:
                feed = self._feeds[key] = FaultFeed(where, prefix)
        feed.join(name)
        return feed

    def feeds(self) -> list[FaultFeed]:
        with self._lock:
            return list(self._feeds.values())

    def stop_all(self) -> None:
        """End every feed (a test's teardown: no thread outlives the test that made it,
        whatever it forgot to close)."""
        for feed in self.feeds():
            feed.stop()


FEEDS = FaultFeeds()
