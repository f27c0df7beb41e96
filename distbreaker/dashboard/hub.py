"""The dashboard's one reader of Redis: it follows the transitions channel and re-reads the
fleet, and hands each result to every connected browser.

One thread per dashboard process, whatever the number of browsers: it
subscribes to ``<prefix>:v2:events``; each transition is passed on at once
(``transition``) and followed by a fresh read of the fleet (``update``); the
fleet is also re-read every `refresh` seconds, since rates, bulkhead use and
budgets change without transitions. While Redis is unreachable it sends a
``status`` message once per attempt and retries every second. Browsers get the
messages through asyncio queues (one per server-sent-event stream, each with its
own filter: names and message kinds); a browser too slow to keep up loses
updates, never blocks the others.

Fleet-wide rates: each breaker row gets ``rates`` (calls, successes, failures, slow
calls and rejections per second, fleet-wide) from the difference of the state
record's counters (`calls_total`, `failures_total`, `slow_total`, `rejected`)
between two reads: no
Redis cost beyond the read itself. The sparkline points (failure rate, slow rate,
calls/s) are kept in one hash, ``<prefix>:v2:dashboard:spark`` (name -> JSON
points; outside the ``{name}`` keys, so no reader takes it for a breaker), written
every `SPARK_SAVE_S` seconds and when the dashboard stops, read when it starts:
a restarted dashboard shows the last minutes again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from .. import readside as view
from .._runtime import state_record
from .._runtime.keys import BreakerKeys, events_channel, namespace
from .._runtime.record_layout import COUNT_SLOT_BYTES, WINDOW_OFFSET

SPARK_STEP_MS = 4000
SPARK_POINTS = 150  # 10 minutes at one point per 4 s
SPARK_NAMES = 2000  # names whose rate history is kept (the rest: no sparkline)
SPARK_SAVE_S = 30.0  # how often the sparklines are saved to Redis (and at stop)
SPARK_TTL_MS = 3_600_000  # the saved sparklines expire an hour after the last save
RETRY_S = 1.0
QUEUE_SIZE = 64

Message = tuple[str, dict[str, Any]]
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def spark_key(prefix: str) -> str:
    """The hash the dashboard keeps its sparkline points in (docs/KEY_SCHEMA.md)."""
    return f"{namespace(prefix)}:dashboard:spark"


@dataclasses.dataclass(frozen=True)
class Filter:
    """What one event stream wants: names (empty: all) and message kinds (empty: all).
    Rows of other names are left out of ``snapshot`` and ``update`` messages."""

    names: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()

    def apply(self, kind: str, data: dict[str, Any]) -> dict[str, Any] | None:
        """The message as this stream gets it, or None when it does not want it."""
        if self.kinds and kind not in self.kinds:
            return None
        if not self.names:
            return data
        if kind == "transition":
            return data if data.get("name") in self.names else None
        if kind in ("snapshot", "update"):
            shown = dict(data, rows=[r for r in data["rows"] if r["name"] in self.names])
            if "spark" in data:
                shown["spark"] = {n: p for n, p in data["spark"].items() if n in self.names}
            return shown
        return data


Counters = tuple[int, int, int, int, int]


def rates(before: Counters | None, now: Counters) -> dict[str, float] | None:
    """Per-second fleet-wide figures between two reads of (server ms, calls_total,
    failures_total, slow_total, rejected); None without an earlier read, or when the
    counters went back (the keys expired and were created again)."""
    if before is None or now[0] <= before[0]:
        return None
    seconds = (now[0] - before[0]) / 1000
    calls, failures, slow, rejected = (now[i] - before[i] for i in (1, 2, 3, 4))
    if min(calls, failures, slow, rejected) < 0:
        return None
    return {"calls": calls / seconds, "success": (calls - failures) / seconds,
            "failure": failures / seconds, "slow": slow / seconds,
            "rejected": rejected / seconds, "interval_s": seconds}


def fleet_snapshot(client: Any, prefix: str) -> dict[str, Any]:
    """Every name under the prefix with its breaker, bulkhead and budget (docs/CLI_JSON.md
    `ls` rows, plus ``latency``); a name whose keys hold foreign data, or a key whose name
    part is not a valid name, is a row with an ``error``."""
    rows = view.read_rows(client, prefix, view.scan(client, prefix))
    add_latency(client, prefix, rows)
    return {"prefix": prefix, "server_time_ms": view.server_now_ms(client), "rows": rows}


def percentile(values: list[int], share: float) -> int:
    """The nearest-rank percentile of sorted `values` (share 0.5: the median)."""
    return values[max(0, min(len(values) - 1, -(-int(share * 1000) * len(values) // 1000) - 1))]


def add_latency(client: Any, prefix: str, rows: list[dict[str, Any]]) -> None:
    """Each breaker row's fleet-wide call latency over its window, as ``latency``:
    p50 and p99 of a count window (its ring keeps every call's ms: one pipelined
    GETRANGE of the record up to its ring's end per read), the mean of a time window (its per-second
    slots keep sums only: the header's totals). None without calls."""
    ring: list[tuple[dict[str, Any], int]] = []
    for row in rows:
        breaker = row.get("breaker")
        if breaker is None or row.get("schema") == view.V1:
            continue
        window = breaker["window"]
        row["latency"] = None
        if not window["calls"]:
            continue
        if breaker["config"]["sliding_window_type"] == "COUNT_BASED":
            ring.append((row, breaker["config"]["sliding_window_size"]))
        else:
            row["latency"] = {"mean_ms": window["total_ms"] / window["calls"]}
    if not ring:
        return
    pipe = client.pipeline(transaction=False)
    for row, size in ring:
        # the record up to its ring's end, as bytes even on a client that decodes replies
        view.queue_raw(pipe, BreakerKeys.build(row["name"], prefix).state,
                       WINDOW_OFFSET + COUNT_SLOT_BYTES * size - 1)
    for (row, size), raw in zip(ring, pipe.execute(raise_on_error=False), strict=True):
        if not isinstance(raw, bytes):  # foreign data, a decoded client: no figure
            continue
        slots = state_record.count_slots(raw, size)
        ms = sorted(slot[2] for slot in slots if slot is not None)
        if ms:
            row["latency"] = {"p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99),
                              "mean_ms": sum(ms) / len(ms), "calls": len(ms)}


class Hub:
    """Reads Redis in one thread and broadcasts to the browsers' queues."""

    def __init__(self, connect: Callable[[], Any], prefix: str, refresh: float) -> None:
        self.connect = connect
        self.prefix = prefix
        self.refresh = refresh
        self._lock = threading.Lock()
        self._queues: dict[asyncio.Queue[Message], Filter] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._spark: dict[str, collections.deque[list[float]]] = {}
        self._counters: dict[str, Counters] = {}
        self._rates: dict[str, dict[str, float]] = {}
        self._spark_loaded = False
        self._spark_saved = time.monotonic()
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

    def subscribe(self, wanted: Filter = Filter()) -> asyncio.Queue[Message]:
        queue: asyncio.Queue[Message] = asyncio.Queue(QUEUE_SIZE)
        with self._lock:
            self._queues[queue] = wanted
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Message]) -> None:
        with self._lock:
            self._queues.pop(queue, None)

    def first_messages(self, wanted: Filter = Filter()) -> list[Message]:
        """What a newly connected browser gets at once: status, and the last fleet read
        with the rate history of every name (as far as its filter wants them)."""
        with self._lock:
            out: list[Message] = [("status", dict(self.status))]
            if self.latest is not None:
                spark = {n: list(points) for n, points in self._spark.items()}
                out.append(("snapshot", {**self.latest, "spark": spark}))
        shown = [(kind, wanted.apply(kind, data)) for kind, data in out]
        return [(kind, data) for kind, data in shown if data is not None]

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
                    if self._stop.is_set():
                        self._save_spark(client)
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
        if not self._spark_loaded:
            self._load_spark(client)
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
        if time.monotonic() - self._spark_saved >= SPARK_SAVE_S:
            self._save_spark(client)
        if status is not None:
            self._broadcast("status", status)
        self._broadcast("update", snapshot)

    def _sample(self, rows: list[dict[str, Any]], now: int) -> None:
        for row in rows:
            breaker = row["breaker"]
            if breaker is None or row.get("schema") == view.V1:  # v2's sparkline only
                continue
            name = row["name"]
            if breaker.get("calls_total") is not None:
                counters = (now, breaker["calls_total"], breaker["failures_total"],
                            breaker.get("slow_total") or 0, breaker["rejected"])
                before = self._counters.get(name)
                # a rate needs a second of reads at least (a transition's read can follow
                # the last one within milliseconds): until then the last rate stands
                if before is None or now - before[0] >= 1000 or counters[1] < before[1]:
                    found = rates(before, counters)
                    if found is not None:
                        self._rates[name] = found
                    else:
                        self._rates.pop(name, None)
                    self._counters[name] = counters
            row["rates"] = self._rates.get(name)
            points = self._spark.get(name)
            if points is None:
                if len(self._spark) >= SPARK_NAMES:
                    continue
                points = self._spark[name] = collections.deque(maxlen=SPARK_POINTS)
            if not points or now - points[-1][0] >= SPARK_STEP_MS:
                calls_per_s = row["rates"]["calls"] if row["rates"] else None
                points.append([now, breaker["failure_rate"], breaker["slow_rate"], calls_per_s])

    def _load_spark(self, client: Any) -> None:
        """The sparklines a previous dashboard saved (foreign data there: none)."""
        self._spark_loaded = True
        try:
            saved = client.hgetall(spark_key(self.prefix))
        except redis.ResponseError:  # the key holds another type: start empty
            return
        with self._lock:
            for raw_name, raw_points in saved.items():
                name = view.text(raw_name)
                if name in self._spark or len(self._spark) >= SPARK_NAMES:
                    continue
                try:
                    points = [list(p) for p in json.loads(raw_points)
                              if isinstance(p, list) and len(p) >= 3]
                except (ValueError, TypeError):
                    continue
                self._spark[name] = collections.deque(points, maxlen=SPARK_POINTS)

    def _save_spark(self, client: Any) -> None:
        """Every name's sparkline points, in one HSET (best effort: a failure is retried
        at the next save)."""
        self._spark_saved = time.monotonic()
        with self._lock:
            points = {n: json.dumps(list(p), separators=(",", ":"))
                      for n, p in self._spark.items() if p}
        if not points:
            return
        try:
            pipe = client.pipeline(transaction=False)
            pipe.hset(spark_key(self.prefix), mapping=points)
            pipe.pexpire(spark_key(self.prefix), SPARK_TTL_MS)
            pipe.execute()
        except redis.RedisError:
            pass

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
            queues = list(self._queues.items())
        for queue, wanted in queues:
            shown = wanted.apply(kind, data)
            if shown is None:
                continue
            try:
                loop.call_soon_threadsafe(_offer, queue, (kind, shown))
            except RuntimeError:  # the loop closed meanwhile (shutdown)
                return


def _offer(queue: asyncio.Queue[Message], message: Message) -> None:
    """Queue a message for one browser; a full queue (a stalled browser) drops it."""
    try:
        queue.put_nowait(message)
    except asyncio.QueueFull:
        pass
