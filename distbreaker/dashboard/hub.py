"""The dashboard's one reader of Redis: it follows the transitions channel, reads what
changed, and hands each browser only the rows that changed.

One thread per dashboard process, whatever the number of browsers. It subscribes to
``<prefix>:v2:events``; each transition is passed on at once (``transition``) and its
name is read again at once. Every `refresh` seconds it reads, at a cost bounded whatever
the fleet's size (10,000 names cost the same per tick as 1,500):

- one SCAN step (`SCAN_STEP` keys) of the key space, so new names (and new components of
  a name) are found within a few ticks and a whole pass takes ``keys / SCAN_STEP`` ticks;
- the state record headers (one pipelined GETRANGE each) of the next `PROBE_PER_TICK`
  breakers, in turn: a header whose bytes did not change means a breaker that did not
  change (every call, transition and probe writes it), so only changed ones are read in
  full; its cumulative counters give the fleet-wide rates;
- in full: the names whose header changed, the names of transitions, names without a
  breaker in the probe's turn (bulkheads, budgets, rate limiters: small reads), and in
  turn every name once per `FULL_CYCLE_S` (what moves with time alone: a worker that went
  silent, a time window going stale).

A row read again is sent (``update``: only the changed rows, and the keys of rows gone)
only when it differs from the one last sent, fields that move with time alone left out;
nothing is sent when nothing changed. A new browser gets the whole fleet (``snapshot``)
and then the diffs (``seq`` orders them); one too slow to keep up gets a new snapshot
instead of the diffs it missed. While Redis is unreachable it sends a ``status``
message once per attempt and retries every second.

Fleet-wide rates: each breaker row gets ``rates`` (calls, successes, failures, slow
calls and rejections per second, fleet-wide) from the difference of the state
record's counters (`calls_total`, `failures_total`, `slow_total`, `rejected`) between
two reads, each rate limiter ``rl_rates`` from its hash's counters; no Redis cost
beyond the reads themselves. Latency: `rows.window_latency`. The sparkline points
(failure rate, slow rate, calls/s) are kept in one hash, ``<prefix>:v2:dashboard:spark``
(name -> JSON points; outside the ``{name}`` keys, so no reader takes it for a breaker),
written every `SPARK_SAVE_S` seconds and when the dashboard stops, read when it starts:
a restarted dashboard shows the last minutes again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from .. import readside as view
from .. import readside_pool as pools
from .._runtime import state_record
from .._runtime.keys import BreakerKeys, PoolKeys, events_channel, namespace
from .._runtime.record_layout import WINDOW_OFFSET
from ..pool.core import decode_record as decode_pool_record
from ..pool.core import decode_status as decode_pool_status
from . import rows as fleet
from .rows import percentile, rates, row_key

__all__ = ["Filter", "Hub", "add_latency", "fleet_snapshot", "percentile", "rates",
           "spark_key"]

SPARK_STEP_MS = 4000
SPARK_POINTS = 150  # 10 minutes at one point per 4 s
SPARK_NAMES = 2000  # names whose rate history is kept (the rest: no sparkline)
SPARK_SAVE_S = 30.0  # how often the sparklines are saved to Redis (and at stop)
SPARK_TTL_MS = 3_600_000  # the saved sparklines expire an hour after the last save
RETRY_S = 1.0
QUEUE_SIZE = 64
SCAN_STEP = 1000  # keys asked per SCAN step (one step per tick)
PROBE_PER_TICK = 1500  # breaker headers read per tick
FULL_CYCLE_S = 300.0  # every name is read in full at least this often
BATCH = 500  # names per pipelined read
RL_COUNTERS = ("calls", "permits", "rejected", "waited")
POOL_SCAN_S = 30.0  # how often a cluster's keys are scanned for new pools

Message = tuple[str, dict[str, Any]]
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def spark_key(prefix: str) -> str:
    """The hash the dashboard keeps its sparkline points in (docs/KEY_SCHEMA.md)."""
    return f"{namespace(prefix)}:dashboard:spark"


@dataclasses.dataclass(frozen=True)
class Filter:
    """What one event stream wants: names (empty: all) and message kinds (empty: all).
    Rows of other names are left out of ``snapshot`` and ``update`` messages (an update
    left with no row is not sent)."""

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
            if "removed" in data:
                shown["removed"] = [k for k in data["removed"]
                                    if k in self.names or k[3:] in self.names]
            for field in ("pools", "pools_removed"):  # a pool's rows by its name
                if field in data:
                    shown[field] = [p for p in data[field]
                                    if (p if isinstance(p, str) else p["pool"]) in self.names]
            if kind == "update" and not any(shown.get(f) for f in (
                    "rows", "removed", "pools", "pools_removed")):
                return None
            if "spark" in data:
                shown["spark"] = {n: p for n, p in data["spark"].items() if n in self.names}
            return shown
        return data


def fleet_snapshot(client: Any, prefix: str) -> dict[str, Any]:
    """Every name under the prefix with its breaker, bulkhead and budget (docs/CLI_JSON.md
    `ls` rows, plus ``latency``), read at once; a name whose keys hold foreign data, or a
    key whose name part is not a valid name, is a row with an ``error``."""
    rows = view.read_rows(client, prefix, view.scan(client, prefix))
    now = view.server_now_ms(client)
    add_latency(client, prefix, rows, now)
    return {"prefix": prefix, "server_time_ms": now, "rows": rows}


def add_latency(client: Any, prefix: str, rows: list[dict[str, Any]],
                now_ms: int | None = None) -> None:
    """Each breaker row's fleet-wide call latency over its window, as ``latency``
    (`rows.window_latency`: p50, p99 and mean; one pipelined GETRANGE of the record up to
    its window's end per row). None without calls."""
    wanted: list[tuple[dict[str, Any], str, int]] = []
    for row in rows:
        breaker = row.get("breaker")
        if breaker is None or row.get("schema") == view.V1:
            continue
        row["latency"] = None
        if breaker["window"]["calls"]:
            config = breaker["config"]
            wanted.append((row, config["sliding_window_type"], config["sliding_window_size"]))
    if not wanted:
        return
    now = view.server_now_ms(client) if now_ms is None else now_ms
    pipe = client.pipeline(transaction=False)
    for row, kind, size in wanted:
        # the record up to its window's end, as bytes even on a client that decodes replies
        view.queue_raw(pipe, BreakerKeys.build(row["name"], prefix).state,
                       fleet.window_end(kind, size))
    for (row, kind, size), raw in zip(wanted, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(raw, bytes):  # else foreign data, a decoded client: no figure
            row["latency"] = fleet.window_latency(raw, kind, size, now)


_COUNTER_OFFSETS = tuple(8 * state_record.FIELDS.index(f) for f in (
    "calls_total", "failures_total", "slow_total", "rejected"))


def header_counters(header: bytes, now: int) -> fleet.Counters:
    """(now, calls_total, failures_total, slow_total, rejected) of a state record header."""
    return (now, *(int.from_bytes(header[o:o + 8], "big", signed=True)
                   for o in _COUNTER_OFFSETS))


@dataclasses.dataclass
class Tracked:
    """One row the hub follows: where its keys are, what it last read and sent."""

    key: str
    name: str
    schema: str
    parts: set[str]
    state_key: str = ""  # the breaker's state record (v2)
    invalid: list[str] | None = None  # a name part that is not a valid name: its keys
    header: bytes | None = None  # the state record's header at the last probe
    counters: fleet.Counters | None = None
    rates: dict[str, float] | None = None
    still: bool = False  # its rates are all 0: an unchanged header changes nothing
    rl_counters: fleet.Counters | None = None
    rl_rates: dict[str, float] | None = None
    full: dict[str, Any] | None = None  # the row last read (before rates), for rate-only changes
    sent: str | None = None  # `rows.comparable` of the row last sent
    row: dict[str, Any] | None = None  # the row last sent

    @property
    def probed(self) -> bool:
        """Whether a header read tells if it changed (a v2 breaker and nothing else)."""
        return self.invalid is None and self.schema == view.V2 and self.parts == {"breaker"}


class Rotation:
    """Names taken in turn, a bounded number per tick, each once per turn."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.pos = 0

    def add(self, key: str) -> None:
        self.order.append(key)

    def take(self, n: int, alive: dict[str, Tracked]) -> list[str]:
        if self.pos >= len(self.order) or len(self.order) > 2 * len(alive) + 64:
            self.order = [k for k in self.order if k in alive]  # forget the removed ones
            self.pos = 0 if self.pos >= len(self.order) else self.pos
        taken = self.order[self.pos:self.pos + n]
        self.pos += len(taken)
        return [k for k in taken if k in alive]


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
        self._spark: dict[str, collections.deque[list[Any]]] = {}  # [ms, rate, rate, calls/s]
        self._spark_loaded = False
        self._spark_saved = time.monotonic()
        self._tracked: dict[str, Tracked] = {}
        self._probes = Rotation()
        self._fulls = Rotation()
        self._cursors: dict[str, int] = {view.V2: 0, view.V1: 0, "pool": 0}
        self._pools: dict[str, dict[str, Any]] = {}  # pool name -> the row last sent
        self._pool_sent: dict[str, str] = {}
        self._pool_names: set[str] = set()
        self._pools_scanned = 0.0
        self._scanned = False  # a first whole scan done
        self.seq = 0
        self.server_time_ms = 0
        self.status: dict[str, Any] = {"redis": "connecting", "since_ms": None, "error": None}
        self.reads = 0  # ticks so far (tests and the bench read it)

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
        """What a newly connected browser gets at once: status, and every row last sent
        with the rate history of every name (as far as its filter wants them)."""
        with self._lock:
            out: list[Message] = [("status", dict(self.status))]
            if self._scanned:
                spark = {n: list(points) for n, points in self._spark.items()}
                shown = sorted((t.row for t in self._tracked.values() if t.row is not None),
                               key=lambda r: (r["name"], r["schema"] != view.V2))
                out.append(("snapshot", {"prefix": self.prefix, "seq": self.seq,
                                         "server_time_ms": self.server_time_ms,
                                         "rows": shown, "total": len(shown), "spark": spark,
                                         "pools": [self._pools[n] for n in sorted(self._pools)]}))
        filtered = [(kind, wanted.apply(kind, data)) for kind, data in out]
        return [(kind, data) for kind, data in filtered if data is not None]

    # -- the reader thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            client = None
            try:
                client = self.connect()
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(events_channel(self.prefix))
                self._tick(client, set(), whole=True)
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
            moved: set[str] = set()
            while message is not None:  # drain a burst, then read those names once
                if message.get("type") == "message":
                    event = view.decode_event_message(message["data"])
                    if event is not None:
                        self._broadcast("transition", event)
                        moved.add(event["name"])
                message = pubsub.get_message(timeout=0)
            if time.monotonic() >= due:
                self._tick(client, moved)
                due = time.monotonic() + self.refresh
            elif moved:
                self._tick(client, moved, turn=False)

    def _tick(self, client: Any, moved: Iterable[str], *, whole: bool = False,
              turn: bool = True) -> None:
        """One read: the names that moved, and (`turn`) the next scan step, probes and
        full reads; `whole`: a whole scan first (at the start and after an outage)."""
        if not self._spark_loaded:
            self._load_spark(client)
        now = view.server_now_ms(client)
        dirty = {name for name in moved if name in self._tracked}
        if whole:
            dirty |= self._found(view.scan(client, self.prefix))
        elif turn:
            dirty |= self._scan_step(client)
        unknown = [n for n in moved if n not in self._tracked]
        if unknown:  # a transition of a name no scan found yet
            dirty |= self._found(view.Scan(names={n: {"breaker"} for n in unknown}))
        probe: list[str] = [k for k in dirty if self._tracked[k].probed]
        if turn:
            n = len(self._tracked)
            for key in self._probes.take(PROBE_PER_TICK, self._tracked):
                if self._tracked[key].probed:
                    probe.append(key)
                else:
                    dirty.add(key)
            per_tick = max(1, math.ceil(n * self.refresh / FULL_CYCLE_S))
            dirty.update(self._fulls.take(per_tick, self._tracked))
        changed: dict[str, dict[str, Any] | None] = {}
        dirty |= self._probe(client, set(probe), now, changed)
        self._reread(client, dirty, now, changed)
        removed = [k for k, row in changed.items() if row is None]
        for key in removed:
            del self._tracked[key]
        sent = [row for row in changed.values() if row is not None]
        pools_changed, pools_gone = self._read_pools(client, whole, now) if turn else ([], [])
        with self._lock:
            self.server_time_ms = now
            self._scanned = True
            self.reads += 1
            if sent or removed or pools_changed or pools_gone:
                self.seq += 1
            seq = self.seq
            status = None
            if self.status["redis"] != "ok":
                self.status = {"redis": "ok", "since_ms": now, "error": None}
                status = dict(self.status)
        if time.monotonic() - self._spark_saved >= SPARK_SAVE_S:
            self._save_spark(client)
        if status is not None:
            self._broadcast("status", status)
        if whole:
            self._resync()  # after an outage, every browser starts again from a snapshot
        elif sent or removed or pools_changed or pools_gone:
            update: dict[str, Any] = {"prefix": self.prefix, "seq": seq, "server_time_ms": now,
                                      "rows": sent, "removed": removed,
                                      "total": len(self._tracked)}
            if pools_changed or pools_gone:
                update.update(pools=pools_changed, pools_removed=pools_gone)
            self._broadcast("update", update)

    # -- pools ---------------------------------------------------------------------------
    def _read_pools(self, client: Any, whole: bool,
                    now: int) -> tuple[list[dict[str, Any]], list[str]]:
        """Every pool read (a pool is small, and changes with every call: in flight);
        the rows that changed, and the names of the pools gone. New pools are found by
        the scan steps (a cluster: a whole scan every `POOL_SCAN_S`)."""
        if whole or (view.is_cluster(client)
                     and time.monotonic() - self._pools_scanned >= POOL_SCAN_S):
            self._pools_scanned = time.monotonic()
            self._pool_names |= set(pools.scan_pools(client, self.prefix))
        changed: list[dict[str, Any]] = []
        gone: list[str] = []
        names = sorted(self._pool_names)
        if not names:
            return changed, gone
        # one pipelined HGETALL per pool at the tick's server time (what
        # readside_pool.read_pool reads, without a TIME in the pipeline: a cluster refuses it)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(PoolKeys.build(name, self.prefix).members)
        for name, raw in zip(names, pipe.execute(raise_on_error=False), strict=True):
            try:
                if isinstance(raw, Exception):
                    raise raw
                row = None
                if raw:
                    for field, value in raw.items():
                        if view.text(field).startswith("m:"):
                            decode_pool_record(value)  # ValueError on a corrupt record
                    status = decode_pool_status(name, pools.status_reply(raw, now))
                    row = fleet.pool_row(pools.pool_row(status))
            except (ValueError, TypeError, KeyError, IndexError, redis.ResponseError) as exc:
                row = {"pool": name, "error": f"{type(exc).__name__}: {exc}"[:300]}
            if row is None:
                self._pool_names.discard(name)
                if self._pools.pop(name, None) is not None:
                    self._pool_sent.pop(name, None)
                    gone.append(name)
                continue
            same = fleet.comparable(row)
            if same != self._pool_sent.get(name):
                self._pool_sent[name] = same
                self._pools[name] = row
                changed.append(row)
        return changed, gone

    # -- finding names -------------------------------------------------------------------
    def _found(self, found: view.Scan) -> set[str]:
        """Track what a scan found; the keys of rows that are new or gained a component."""
        new: set[str] = set()
        for schema, names in ((view.V2, found.names), (view.V1, found.legacy)):
            for name, parts in names.items():
                key = name if schema == view.V2 else "v1:" + name
                t = self._tracked.get(key)
                if t is None:
                    t = self._tracked[key] = Tracked(key, name, schema, set(parts))
                    self._probes.add(key)
                    self._fulls.add(key)
                    new.add(key)
                elif not parts <= t.parts:
                    t.parts |= parts
                    new.add(key)
        for name, keys in found.invalid.items():
            t = self._tracked.get(name)
            if t is None or t.invalid is None or set(keys) - set(t.invalid):
                merged = sorted(set(keys) | set(t.invalid or ()) if t else set(keys))
                self._tracked[name] = Tracked(name, name, view.V2, set(), invalid=merged)
                if t is None:
                    self._probes.add(name)
                    self._fulls.add(name)
                new.add(name)
        return new

    def _scan_step(self, client: Any) -> set[str]:
        """One SCAN step of each key schema (a whole scan on a cluster, once a pass)."""
        if view.is_cluster(client):
            if self._probes.pos < len(self._probes.order):
                return set()
            return self._found(view.scan(client, self.prefix))
        found = view.Scan()
        heads = {schema: view.schema_namespace(self.prefix, schema) + ":{"
                 for schema in view.SCHEMAS}
        cursor, keys = client.scan(self._cursors["pool"], match=view.scan_pattern(
            self.prefix) + "}" + pools.POOL_SUFFIX, count=SCAN_STEP)
        self._cursors["pool"] = int(cursor)
        head, tail = view.schema_namespace(self.prefix) + ":{", "}" + pools.POOL_SUFFIX
        self._pool_names.update(k[len(head):-len(tail)] for k in map(view.text, keys)
                                if k.startswith(head) and k.endswith(tail))
        for schema in view.SCHEMAS:
            # each component's keys (:cb..., :bh..., :rb, :rb2, :rl): not a pool's
            cursor, keys = client.scan(self._cursors[schema], match=view.scan_pattern(
                self.prefix, schema) + "}:[bcr][bhl]*", count=SCAN_STEP)
            self._cursors[schema] = int(cursor)
            for raw in keys:
                if self._known(view.text(raw), heads[schema], schema):
                    continue  # the usual case: nothing new, no name to validate
                view.sort_key(found, raw, self.prefix, schema)
        return self._found(found)

    def _known(self, key: str, head: str, schema: str) -> bool:
        """Whether a scanned key belongs to a tracked name and component."""
        name, _, suffix = key[len(head):].rpartition("}:")
        t = self._tracked.get(name if schema == view.V2 else "v1:" + name)
        part = {"cb": "breaker", "bh": "bulkhead", "rb": "budget", "rb2": "budget",
                "rl": "rate_limiter"}.get(suffix.partition(":")[0])
        return t is not None and t.invalid is None and part in t.parts

    # -- reading -------------------------------------------------------------------------
    def _probe(self, client: Any, keys: set[str], now: int,
               changed: dict[str, dict[str, Any] | None]) -> set[str]:
        """Read the headers of `keys`' state records; the keys whose header changed (or
        is gone). Unchanged ones still get their rates (zero when the counters stood)."""
        order = sorted(keys)
        moved: set[str] = set()
        for i in range(0, len(order), BATCH):
            chunk = order[i:i + BATCH]
            pipe = client.pipeline(transaction=False)
            for key in chunk:
                t = self._tracked[key]
                if not t.state_key:
                    t.state_key = BreakerKeys.build(t.name, self.prefix).state
                view.queue_raw(pipe, t.state_key, WINDOW_OFFSET - 1)
            for key, raw in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
                t = self._tracked[key]
                if not isinstance(raw, bytes) or not raw or raw != t.header:
                    t.header = raw if isinstance(raw, bytes) else None
                    moved.add(key)
                    continue
                if t.still and t.counters is not None:
                    t.counters = (now, *t.counters[1:])  # standing still, and shown so
                elif t.full is not None and self._observe(t, header_counters(raw, now)):
                    self._send(t, t.full, changed)
        return moved

    def _observe(self, t: Tracked, counters: fleet.Counters | None) -> bool:
        """Take a read of a breaker's counters; whether its rates changed. A rate needs
        a second between reads (a transition's read can follow the last within
        milliseconds): until then the last rate stands."""
        if counters is None:
            return False
        before = t.counters
        if t.still and before is not None and counters[1:] == before[1:]:
            t.counters = counters  # standing still, and its rates say so already
            return False
        if before is not None and counters[0] - before[0] < 1000 and counters[1] >= before[1]:
            return False
        t.counters = counters
        found = rates(before, counters)
        if found == t.rates or (found is not None and t.rates is not None and fleet.comparable(
                found) == fleet.comparable(t.rates)):
            return False
        t.rates = found
        t.still = found is not None and not any(
            found[k] for k in ("calls", "failure", "slow", "rejected"))
        return True

    def _reread(self, client: Any, keys: set[str], now: int,
                changed: dict[str, dict[str, Any] | None]) -> None:
        """Read `keys` in full; each row that differs from the one last sent goes into
        `changed` (None: the row is gone)."""
        groups: dict[str, dict[str, set[str]]] = {view.V2: {}, view.V1: {}}
        for key in keys:
            t = self._tracked[key]
            if t.invalid is not None:
                pipe = client.pipeline(transaction=False)
                for foreign in t.invalid:
                    pipe.type(foreign)  # TYPE: what `ls` asks already (no new ACL command)
                if any(view.text(kind) != "none" for kind in pipe.execute()):
                    self._send(t, view.invalid_row(t.name, t.invalid, self.prefix), changed)
                else:  # its foreign keys are gone
                    changed[key] = None
            else:
                groups[t.schema][t.name] = t.parts
        for schema, names in groups.items():
            if not names:
                continue
            read = list(view.read_summaries(client, self.prefix, names, BATCH, schema))
            add_latency(client, self.prefix, read, now)
            for row in read:
                key = row_key(row)
                t = self._tracked[key]
                breaker = row.get("breaker")
                if breaker is not None and breaker.get("calls_total") is not None:
                    self._observe(t, (now, breaker["calls_total"], breaker["failures_total"],
                                      breaker.get("slow_total") or 0, breaker["rejected"]))
                limiter = row.get("rate_limiter")
                if limiter is not None:
                    counters = (now, *(int(limiter.get(c) or 0) for c in RL_COUNTERS))
                    before = t.rl_counters
                    if before is None or now - before[0] >= 1000:
                        t.rl_rates = fleet.per_second(before, counters, RL_COUNTERS)
                        t.rl_counters = counters
                if fleet.is_empty(row):
                    if t.row is not None or t.sent is None:
                        changed[key] = None
                    continue
                self._sample(row, t, now)
                t.full = row
                self._send(t, row, changed)

    def _send(self, t: Tracked, row: dict[str, Any],
              changed: dict[str, dict[str, Any] | None]) -> None:
        """Queue the row when it differs from the one last sent."""
        shown = fleet.fleet_row({**row, "rates": t.rates, "rl_rates": t.rl_rates})
        same = fleet.comparable(shown)
        if same != t.sent:
            t.sent, t.row = same, shown
            changed[t.key] = shown

    def _sample(self, row: dict[str, Any], t: Tracked, now: int) -> None:
        breaker = row["breaker"]
        if breaker is None or row.get("schema") == view.V1:  # v2's sparkline only
            return
        points = self._spark.get(t.name)
        if points is None:
            if len(self._spark) >= SPARK_NAMES:
                return
            points = self._spark[t.name] = collections.deque(maxlen=SPARK_POINTS)
        if not points or now - points[-1][0] >= SPARK_STEP_MS:
            calls_per_s = t.rates["calls"] if t.rates else None
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

    def _resync(self) -> None:
        """Every stream starts again from a snapshot (its filter applied)."""
        self._broadcast("resync", {})

    def _broadcast(self, kind: str, data: dict[str, Any]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with self._lock:
            queues = list(self._queues.items())
        for queue, wanted in queues:
            shown = data if kind == "resync" else wanted.apply(kind, data)
            if shown is None:
                continue
            try:
                loop.call_soon_threadsafe(_offer, queue, (kind, shown))
            except RuntimeError:  # the loop closed meanwhile (shutdown)
                return


def _offer(queue: asyncio.Queue[Message], message: Message) -> None:
    """Queue a message for one browser; a full queue (a stalled browser) is emptied and
    asks for a new snapshot instead of the diffs it would miss."""
    try:
        queue.put_nowait(message)
    except asyncio.QueueFull:
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(("resync", {}))
