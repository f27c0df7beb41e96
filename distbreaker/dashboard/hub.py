"""The dashboard's one reader of Redis: it follows the transitions channel and re-reads the
fleet, and hands each result to every connected browser.

One thread per dashboard process, whatever the number of browsers: it
subscribes to ``<prefix>:v2:events``; each transition is passed on at once
(``transition``) and followed by a fresh read of the fleet (``update``); the
fleet is also re-read every `refresh` seconds, since rates, bulkhead use and
budgets change without transitions. While Redis is unreachable it sends a
``status`` message once per attempt and retries every second. Browsers get the
messages through asyncio queues (one per server-sent-event stream); a browser
too slow to keep up loses updates, never blocks the others.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from .. import readside as view
from .._runtime.keys import events_channel

SPARK_STEP_MS = 4000
SPARK_POINTS = 150  # 10 minutes at one point per 4 s
SPARK_NAMES = 2000  # names whose rate history is kept (the rest: no sparkline)
RETRY_S = 1.0
QUEUE_SIZE = 64

Message = tuple[str, dict[str, Any]]
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def fleet_snapshot(client: Any, prefix: str) -> dict[str, Any]:
    """Every name under the prefix with its breaker, bulkhead and budget (docs/CLI_JSON.md
    `ls` rows); a name whose keys hold foreign data, or a key whose name part is not a
    valid name, is a row with an ``error``."""
    rows = view.read_rows(client, prefix, view.scan(client, prefix))
    return {"prefix": prefix, "server_time_ms": view.server_now_ms(client), "rows": rows}


class Hub:
    """Reads Redis in one thread and broadcasts to the browsers' queues."""

    def __init__(self, connect: Callable[[], Any], prefix: str, refresh: float) -> None:
        self.connect = connect
        self.prefix = prefix
        self.refresh = refresh
        self._lock = threading.Lock()
        self._queues: set[asyncio.Queue[Message]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._spark: dict[str, collections.deque[list[float]]] = {}
        self.latest: dict[str, Any] | None = None
        self.status: dict[str, Any] = {"redis": "connecting", "since_ms": None, "error": None}

    # -- lifecycle (called from the server's event loop) -------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="distbreaker-dashboard-hub",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def subscribe(self) -> asyncio.Queue[Message]:
        queue: asyncio.Queue[Message] = asyncio.Queue(QUEUE_SIZE)
        with self._lock:
            self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Message]) -> None:
        with self._lock:
            self._queues.discard(queue)

    def first_messages(self) -> list[Message]:
        """What a newly connected browser gets at once: status, and the last fleet read
        with the rate history of every name."""
        with self._lock:
            out: list[Message] = [("status", dict(self.status))]
            if self.latest is not None:
                spark = {n: list(points) for n, points in self._spark.items()}
                out.append(("snapshot", {**self.latest, "spark": spark}))
        return out

    # -- the reader thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            client = None
            try:
                client = self.connect()
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(events_channel(self.prefix))
                self._read(client)
                self._follow(client, pubsub)
            except Exception as exc:  # Redis down, foreign data in a scan, ...: retry
                self._outage(exc)
                self._stop.wait(RETRY_S)
            finally:
                if client is not None:
                    try:
                        client.close()
                    except Exception:
                        pass

    def _follow(self, client: Any, pubsub: Any) -> None:
        due = time.monotonic() + self.refresh
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=max(0.01, min(0.5, due - time.monotonic())))
            moved = False
            while message is not None:  # drain a burst, then read the fleet once
                if message.get("type") == "message":
                    event = view.decode_event_message(message["data"])
                    if event is not None:
                        self._broadcast("transition", event)
                        moved = True
                message = pubsub.get_message(timeout=0)
            if moved or time.monotonic() >= due:
                self._read(client)
                due = time.monotonic() + self.refresh

    def _read(self, client: Any) -> None:
        snapshot = fleet_snapshot(client, self.prefix)
        now = snapshot["server_time_ms"]
        with self._lock:
            self.latest = snapshot
            if self.status["redis"] != "ok":
                self.status = {"redis": "ok", "since_ms": now, "error": None}
                status: dict[str, Any] | None = dict(self.status)
            else:
                status = None
            self._sample(snapshot["rows"], now)
        if status is not None:
            self._broadcast("status", status)
        self._broadcast("update", snapshot)

    def _sample(self, rows: list[dict[str, Any]], now: int) -> None:
        for row in rows:
            breaker = row["breaker"]
            if breaker is None or row.get("schema") == view.V1:  # v2's sparkline only
                continue
            points = self._spark.get(row["name"])
            if points is None:
                if len(self._spark) >= SPARK_NAMES:
                    continue
                points = self._spark[row["name"]] = collections.deque(maxlen=SPARK_POINTS)
            if not points or now - points[-1][0] >= SPARK_STEP_MS:
                points.append([now, breaker["failure_rate"], breaker["slow_rate"]])

    def _outage(self, exc: BaseException) -> None:
        kind = "unreachable" if isinstance(exc, UNREACHABLE) else "error"
        with self._lock:
            if self.status["redis"] != kind:
                self.status = {"redis": kind, "since_ms": int(time.time() * 1000),
                               "error": None}
            self.status["error"] = f"{type(exc).__name__}: {exc}"[:300]
            status = dict(self.status)
        self._broadcast("status", status)

    def _broadcast(self, kind: str, data: dict[str, Any]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with self._lock:
            queues = list(self._queues)
        for queue in queues:
            try:
                loop.call_soon_threadsafe(_offer, queue, (kind, data))
            except RuntimeError:  # the loop closed meanwhile (shutdown)
                return


def _offer(queue: asyncio.Queue[Message], message: Message) -> None:
    """Queue a message for one browser; a full queue (a stalled browser) drops it."""
    try:
        queue.put_nowait(message)
    except asyncio.QueueFull:
        pass
