#!/usr/bin/env python3
"""Overload bench: a fleet against an upstream whose capacity only the bench knows.

Two upstreams (``python -m distbreaker.demo.capacity``, a subprocess), C slots each:

- ``refusing``: answers 429 with Retry-After to every call beyond C, and serves the
  admitted ones slower the more are in flight (``idle * (1 + in_flight/C)``, the idle
  latency set so that C calls in flight take ``--base-latency``);
- ``queueing``: a thread-pool server that never refuses early: C slots, lognormal
  service times of mean ``--base-latency`` (spread ``--sigma``), a FIFO queue of
  ``--queue`` calls beyond C, 503 only when the queue is full, no 429.

Calls beyond capacity (``overload_calls``) are those the upstream refused or queued.
A fleet of real worker processes (``--processes`` x ``--threads``) calls it with
**open-loop Poisson arrivals** (``--load`` x the upstream's capacity in calls/s; a
thread late for an arrival calls at once, and the call's latency counts from its
arrival), each call with a client timeout (``--timeout``). **Goodput** is successes
within ``--slo`` per second. Protections compared:

- ``none``; ``fixed_<L>``: a fleet-wide distbreaker `Bulkhead` of L permits, swept
  over C/2 .. 2C (``best_fixed``: the best goodput; ``fixed_2x``: 2C);
- ``adaptive``: the fleet-wide adaptive bulkhead (``Bulkhead(adaptive=AdaptiveLimit(
  ...))``, never told C; ``--adaptive JSON`` overrides fields);
- ``aimd``: a per-process AIMD limiter (Netflix concurrency-limits' AIMDLimit: +1
  per success while half used, x0.9 on a drop; a call slower than the SLO, a 503, a
  429 or a timeout is a drop), ``gradient``: a per-process Gradient2 limiter (short
  and long latency averages, ``sqrt(limit)`` headroom, smoothing 0.2). Both are
  implemented here, per process, as a fleet of per-instance limiters would be.

Scenarios, per upstream (``--upstream refusing|queueing|both``):

- ``steady``: ``--load`` x capacity for ``--seconds``, after ``--warmup`` seconds;
- ``step``: capacity C -> C/3 -> C, a third of the run each (3 x ``--seconds``);
  reports how long the fleet limit took to come within [C'/2, 1.5 C'] of the new
  capacity C' after each step (the adaptive limit is read from Redis every 50 ms;
  a per-process limiter's fleet limit is the sum over the workers);
- ``growth``: a third of the processes offer 1x capacity, the rest join halfway
  (3x); compared with fixed limits C, 1.25C and 1.5C;
- ``recovery`` (refusing only): the upstream fails (503) for a while and comes back
  at C/2; plain breaker, breaker slow start, adaptive restart (issue 18).

Per scenario: ``goodput`` (successes within the SLO per second), ``p50_ms`` /
``p99_ms`` (calls that reached the upstream, from their arrival), ``overload_calls``,
``status_429`` / ``status_503`` / ``timeouts``, ``rejected`` (BulkheadFull and the
per-process limiters' refusals), ``limit`` (fixed, or the adaptive limit's range over
the measured part), Redis script microseconds per call (``INFO commandstats``).

Usage: ``.venv/bin/python scripts/bench_overload.py [--upstream both] [--seconds 4]
[--capacity 9] [--processes 6] [--threads 12] [--json] [--only adaptive,aimd]``
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import math
import multiprocessing
import os
import queue
import random
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

import distbreaker
from distbreaker import AdaptiveLimit, Bulkhead, CircuitBreaker, HttpStatusError, Policy
from distbreaker.demo.embedded import bench_redis
from distbreaker.demo.httpserver import ServerProcess
from distbreaker.errors import BulkheadFull, CallNotPermitted

UPSTREAMS = ("refusing", "queueing")
STEADY = ("none", "fixed", "adaptive", "aimd", "gradient")
STEP = ("step_fixed", "step_adaptive", "step_aimd", "step_gradient")
GROWTH = ("growth_fixed", "growth_adaptive", "growth_aimd", "growth_gradient")
RECOVERY = ("recovery_plain", "recovery_slow_start", "recovery_adaptive")
SCENARIOS = (*STEADY, *STEP, *GROWTH, *RECOVERY)
BUCKET = 0.25          # seconds per point of the time series
POLL = 0.05            # how often the parent reads the adaptive limit from Redis
RAMP_START = 0.1       # slow start: the share admitted right after the close
#: The adaptive scenarios' AdaptiveLimit: the library's defaults, bounded by 1 and 4C,
#: and the bench's SLO as the latency target (see `adaptive_limit`).
ADAPTIVE_DEFAULTS: dict[str, Any] = {"min_limit": 1}


# -- per-process limiters (the baselines) ---------------------------------------------

class LocalFull(Exception):
    """A per-process limiter refused a call."""


class LocalLimiter:
    """A per-process concurrency limiter: non-blocking acquire, `on_sample` moves it."""

    def __init__(self, initial: float = 20.0, max_limit: float = 200.0) -> None:
        self.lock = threading.Lock()
        self.limit = initial
        self.max_limit = max_limit
        self.in_flight = 0

    def acquire(self) -> bool:
        with self.lock:
            if self.in_flight >= int(self.limit):
                return False
            self.in_flight += 1
            return True

    def release(self, latency: float, dropped: bool) -> None:
        with self.lock:
            self.on_sample(latency, dropped, self.in_flight)
            self.in_flight -= 1
            self.limit = min(self.max_limit, max(1.0, self.limit))

    def on_sample(self, latency: float, dropped: bool, in_flight: int) -> None:
        raise NotImplementedError


class AimdLimiter(LocalLimiter):
    """Netflix AIMDLimit: +1 per success while at least half used, x0.9 on a drop."""

    def on_sample(self, latency: float, dropped: bool, in_flight: int) -> None:
        if dropped:
            self.limit *= 0.9
        elif in_flight * 2 >= self.limit:
            self.limit += 1


class GradientLimiter(LocalLimiter):
    """Netflix Gradient2Limit, per process: long (600 samples) and short (10) latency
    averages, gradient clamp(tolerance x long / short, 0.5, 1), sqrt(limit) headroom."""

    def __init__(self) -> None:
        super().__init__()
        self.short = self.long = 0.0

    def on_sample(self, latency: float, dropped: bool, in_flight: int) -> None:
        if dropped:
            latency = max(latency, self.short * 2)
        if self.long <= 0:
            self.short = self.long = latency
        self.short += (latency - self.short) * 0.1
        self.long += (latency - self.long) / 600
        if self.long / self.short > 2:       # Gradient2: the long average decays faster
            self.long *= 0.95
        gradient = max(0.5, min(1.0, 1.5 * self.long / self.short))
        headroom = math.sqrt(self.limit) if in_flight * 2 >= self.limit else 0.0
        self.limit = self.limit * 0.8 + (self.limit * gradient + headroom) * 0.2


# -- what a worker runs ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Spec:
    """One scenario run as the workers see it (picklable)."""

    key: str
    name: str                     # bulkhead / breaker name in Redis (fresh per run)
    kind: str                     # none | fixed | adaptive | aimd | gradient
    limit: int | None = None      # fixed bulkhead limit
    breaker: bool = False
    slow_start: bool = False
    capacity: int = 9
    processes: int = 1
    rate: float = 1.0             # arrivals per second per thread
    join_at: tuple[float, ...] = ()   # per worker: seconds after the start it begins
    slo: float = 0.2
    timeout: float = 0.5
    open_wait: float = 0.5
    tuning: tuple[tuple[str, Any], ...] = ()   # AdaptiveLimit fields over the defaults


def adaptive_limit(capacity: int, slo: float,
                   tuning: tuple[tuple[str, Any], ...] = ()) -> AdaptiveLimit:
    """The adaptive scenarios' limit: the library's defaults between 1 and 4C, the SLO as
    its latency target, never told C; `tuning` (``--adaptive``) overrides fields."""
    fields = {**ADAPTIVE_DEFAULTS, "max_limit": 4 * capacity, "latency_target": slo,
              **dict(tuning)}
    return AdaptiveLimit(**fields)


def slow_start_options(seconds: float) -> dict[str, Any]:
    return {"ramp_start": RAMP_START, "ramp_duration": seconds}


class Protection:
    """The protection one worker process calls through in one scenario."""

    def __init__(self, spec: Spec, url: str, seconds: float) -> None:
        self.bulkhead: Bulkhead | None = None
        self.breaker: CircuitBreaker | None = None
        self.policy: Policy | None = None
        self.local: LocalLimiter | None = None
        self.slo = spec.slo
        if spec.kind == "aimd":
            self.local = AimdLimiter()
        elif spec.kind == "gradient":
            self.local = GradientLimiter()
        bulkhead: dict[str, Any] | None = None
        if spec.kind in ("fixed", "adaptive"):
            bulkhead = {"max_concurrent_calls": spec.limit or 2 * spec.capacity,
                        "max_wait_duration": 0.0, "lease": 5.0,
                        "expected_workers": spec.processes, "redis_timeout": 1.0}
            if spec.kind == "adaptive":
                bulkhead["adaptive"] = adaptive_limit(spec.capacity, spec.slo, spec.tuning)
        breaker: dict[str, Any] | None = None
        if spec.breaker:
            breaker = {
                "sliding_window_type": "COUNT_BASED", "sliding_window_size": 20,
                "minimum_number_of_calls": 10, "failure_rate_threshold": 50,
                "wait_duration_in_open_state": spec.open_wait,
                "permitted_calls_in_half_open": 3, "half_open_lease": 5.0,
                "ignore_exceptions": (BulkheadFull,), "redis_timeout": 1.0,
                **(slow_start_options(seconds / 2) if spec.slow_start else {})}
        if breaker is not None and bulkhead is not None and spec.kind == "adaptive":
            self.policy = Policy(spec.name, redis=url, breaker=breaker, bulkhead=bulkhead,
                                 redis_timeout=1.0)
            return
        if bulkhead is not None:
            self.bulkhead = Bulkhead(spec.name, redis=url, **bulkhead)
        if breaker is not None:
            self.breaker = CircuitBreaker(spec.name, redis=url, **breaker)

    def limit(self) -> float | None:
        return None if self.local is None else self.local.limit

    def call(self, fn: Callable[[], int], arrived: float) -> int:
        if self.local is not None:
            return self._call_local(self.local, fn, arrived)
        if self.policy is not None:
            return self.policy.call(fn)
        inner: Callable[[], int] = fn
        if self.bulkhead is not None:
            bulkhead = self.bulkhead
            inner = lambda: bulkhead.call(fn)  # noqa: E731
        if self.breaker is not None:
            return self.breaker.call(inner)
        return inner()

    def _call_local(self, local: LocalLimiter, fn: Callable[[], int], arrived: float) -> int:
        if not local.acquire():
            raise LocalFull("per-process limit")
        started = time.time()
        dropped = True
        try:
            status = fn()
            dropped = time.time() - arrived > self.slo   # AIMD: the SLO is its timeout
            return status
        finally:
            local.release(time.time() - started, dropped)

    def close(self) -> None:
        if self.policy is not None:
            self.bulkhead, self.breaker = self.policy.bulkhead, self.policy.breaker
        for component in (self.bulkhead, self.breaker):
            if component is not None:
                component.close()


class Caller:
    """One thread's keep-alive HTTP connection to the upstream."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout
        self.connection: http.client.HTTPConnection | None = None

    def __call__(self) -> int:
        """GET /call; a refusal (429, 503) raises `HttpStatusError` (Retry-After kept)."""
        if self.connection is None:
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                         timeout=self.timeout)
        try:
            self.connection.request("GET", "/call")
            reply = self.connection.getresponse()
            reply.read()
        except (OSError, http.client.HTTPException):
            self.connection.close()
            self.connection = None
            raise
        if reply.status >= 400:
            raise HttpStatusError(reply.status, dict(reply.getheaders()))
        return reply.status


class Tally:
    """What one worker process saw in one scenario (threads add under one lock)."""

    def __init__(self, start: float, measure_from: float, slo: float) -> None:
        self.start = start
        self.measure_from = measure_from
        self.slo = slo
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.series: Counter[int] = Counter()   # successes within the SLO per bucket
        self.limits: dict[int, float] = {}      # a per-process limiter's limit per bucket

    def add(self, arrived: float, ended: float, outcome: str, ran: bool,
            limit: float | None) -> None:
        with self.lock:
            index = int((ended - self.start) / BUCKET)
            good = outcome == "ok" and ended - arrived <= self.slo
            if good:
                self.series[index] += 1
            if limit is not None:
                self.limits[index] = max(self.limits.get(index, 0.0), limit)
            if arrived < self.measure_from:
                return
            self.counts[outcome] += 1
            self.counts["attempts"] += 1
            if good:
                self.counts["good"] += 1
            if ran:
                self.latencies.append(ended - arrived)

    def result(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "latencies": self.latencies,
                "series": dict(self.series), "limits": self.limits}


def call_loop(protection: Protection, caller: Caller, tally: Tally, begin: float,
              end: float, rate: float) -> None:
    """Open loop: Poisson arrivals at `rate`/s from `begin` to `end`; a call's latency
    counts from its arrival (a thread late for it calls at once)."""
    arrival = begin + random.expovariate(rate)
    while arrival < end:
        delay = arrival - time.time()
        if delay > 0:
            time.sleep(delay)
        outcome, ran = "ok", True
        try:
            protection.call(caller, arrival)
        except (BulkheadFull, LocalFull):
            outcome, ran = "rejected", False
        except CallNotPermitted:
            outcome, ran = "not_permitted", False
        except HttpStatusError as refusal:
            outcome = f"status_{refusal.status_code}"
        except TimeoutError:
            outcome = "timeout"
        except (OSError, http.client.HTTPException):
            outcome = "error"
        tally.add(arrival, time.time(), outcome, ran, protection.limit())
        arrival += random.expovariate(rate)


def worker(wid: int, url: str, port: int, threads: int, seconds: float, commands: Any,
           out: Any) -> None:
    """A fleet process: per scenario, build its protection, call from `threads` threads
    between the times the parent sends, report its tally."""
    callers: list[Caller] = []
    out.put(("up", wid))
    while True:
        command = commands.get()
        if command[0] == "stop":
            return
        spec: Spec = command[1]
        if len(callers) != threads or callers[0].timeout != spec.timeout:
            callers = [Caller(port, spec.timeout) for _ in range(threads)]
        try:
            protection = Protection(spec, url, seconds)
        except Exception as error:
            out.put(("failed", wid, repr(error)))
            continue
        out.put(("ready", wid))
        start, measure_from, end = commands.get()[1:]
        tally = Tally(start, measure_from, spec.slo)
        begin = start + (spec.join_at[wid] if wid < len(spec.join_at) else 0.0)
        pool = [threading.Thread(target=call_loop, args=(protection, caller, tally, begin,
                                                         end, spec.rate))
                for caller in callers]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        protection.close()
        out.put(("done", wid, tally.result()))


# -- the parent ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Options:
    capacity: int
    processes: int
    threads: int
    seconds: float
    base_latency: float
    queue: int
    sigma: float
    load: float
    slo: float
    timeout: float
    tuning: tuple[tuple[str, Any], ...] = ()
    limits: tuple[int, ...] = ()    # the fixed limits swept (default C/2 .. 2C)

    warmup: float = 2.0             # a steady scenario's unmeasured start (seconds)

    def calls_per_second(self, upstream: str, capacity: int | None = None) -> float:
        """The upstream's capacity in calls/s: C calls in flight each take base_latency, on
        both upstreams (the refusing one's idle latency is half of it)."""
        return (capacity or self.capacity) / self.base_latency

    def upstream_args(self, upstream: str) -> list[str]:
        args = ["--capacity", str(self.capacity), "--bucket", str(BUCKET)]
        if upstream == "queueing":
            return [*args, "--queue", str(self.queue), "--sigma", str(self.sigma),
                    "--base-latency", str(self.base_latency)]
        return [*args, "--base-latency", str(self.base_latency / 2), "--exponent", "1"]


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


#: Commands whose calls and time count as the protection's Redis cost.
SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")


def command_stats(admin: redis.Redis) -> tuple[int, int]:
    calls = usec = 0
    for key, value in admin.info("commandstats").items():
        if key.removeprefix("cmdstat_") in SCRIPT_COMMANDS:
            calls += int(value["calls"])
            usec += int(value["usec"])
    return calls, usec


class ScenarioFailed(Exception):
    """A worker could not build a scenario's protection: that scenario reports it."""


class LimitPoller:
    """Reads an adaptive bulkhead's limit (meta ``a_limit``) every POLL seconds."""

    def __init__(self, admin: redis.Redis, name: str, start: float, end: float) -> None:
        self.points: list[tuple[float, float]] = []
        self.detail: list[list[str]] = []   # a_rtt_s, a_rtt_l, a_why per point
        self._admin, self._key, self._start, self._end = admin, None, start, end
        for key in admin.scan_iter(match=f"*{{{name}}}:bh:meta", count=1000):
            self._key = key
        self._name = name
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (now := time.time()) < self._end:
            if self._key is None:
                for key in self._admin.scan_iter(match=f"*{{{self._name}}}:bh:meta",
                                                 count=1000):
                    self._key = key
            if self._key is not None and now >= self._start:
                with contextlib.suppress(redis.RedisError, TypeError, ValueError):
                    value, *more = self._admin.hmget(self._key, "a_limit", "a_rtt_s",
                                                     "a_rtt_l", "a_why")
                    if value is not None:
                        self.points.append((round(now - self._start, 3), float(value)))
                        self.detail.append([m.decode() if m else "" for m in more])
            time.sleep(POLL)

    def join(self) -> list[tuple[float, float]]:
        self._thread.join(10)
        return self.points


class Fleet:
    """The worker processes, the upstream and Redis of one upstream's runs."""

    def __init__(self, url: str, options: Options, upstream: str) -> None:
        self.url = url
        self.options = options
        self.kind = upstream
        self.tag = secrets.token_hex(3)
        self.admin = redis.Redis.from_url(url)
        self.upstream = ServerProcess("distbreaker.demo.capacity",
                                      options.upstream_args(upstream))
        self.upstream.wait_ready()
        context = multiprocessing.get_context("spawn")
        self.out: Any = context.Queue()
        self.commands = [context.Queue() for _ in range(options.processes)]
        self.processes = [context.Process(target=worker, daemon=True, args=(
            wid, url, self.upstream.port, options.threads, options.seconds,
            self.commands[wid], self.out)) for wid in range(options.processes)]
        for process in self.processes:
            process.start()
        self._expect(("up",))

    def _expect(self, kinds: tuple[str, ...], workers: int | None = None) -> list[Any]:
        got: list[Any] = []
        while len(got) < (len(self.processes) if workers is None else workers):
            try:
                message = self.out.get(timeout=60)
            except queue.Empty:
                raise RuntimeError(f"workers did not report {kinds} in time") from None
            if message[0] in kinds:
                got.append(message)
        return got

    def close(self) -> None:
        for commands in self.commands:
            commands.put(("stop",))
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
        self.upstream.stop()
        with contextlib.suppress(redis.RedisError):
            for key in self.admin.scan_iter(match=f"*ovl-{self.tag}*", count=1000):
                self.admin.delete(key)
        self.admin.close()

    def run(self, spec: Spec, seconds: float, measure_from: float,
            script: Callable[[float], None] | None = None) -> dict[str, Any]:
        """One scenario: `script(start)` drives the upstream during the run."""
        self.upstream.post("/admin", {"capacity": self.options.capacity, "fail_for": 0})
        for commands in self.commands:
            commands.put(("run", spec))
        answers = self._expect(("ready", "failed"))
        failures = [message for message in answers if message[0] == "failed"]
        if failures:  # the ready ones run for no time, so every worker is idle again
            now = time.time()
            for message in answers:
                if message[0] == "ready":
                    self.commands[message[1]].put(("go", now, now, now))
            self._expect(("done",), len(answers) - len(failures))
            raise ScenarioFailed(f"worker {failures[0][1]}: {failures[0][2]}")
        start = time.time() + 0.2
        end = start + seconds
        for commands in self.commands:
            commands.put(("go", start, start + measure_from, end))
        poller = (LimitPoller(self.admin, spec.name, start, end)
                  if spec.kind == "adaptive" else None)
        time.sleep(max(0.0, start - 0.02 - time.time()))
        self.upstream.post("/restart")   # just before the first call
        redis_before = command_stats(self.admin)
        if script is not None:
            script(start)
        time.sleep(max(0.0, end - time.time()))
        tallies = [message[2] for message in self._expect(("done",))]
        redis_after = command_stats(self.admin)
        stats = self.upstream.get("/stats")
        limits = poller.join() if poller is not None else None
        result = summarize(spec, tallies, stats, seconds, measure_from,
                           (redis_after[0] - redis_before[0], redis_after[1] - redis_before[1]),
                           limits)
        if poller is not None:
            result["series"]["limit_detail"] = poller.detail
        return result


def summarize(spec: Spec, tallies: list[dict[str, Any]], stats: dict[str, Any],
              seconds: float, measure_from: float, redis_cost: tuple[int, int],
              polled: list[tuple[float, float]] | None) -> dict[str, Any]:
    """One scenario's figures from the workers' tallies and the upstream's counts."""
    measured = seconds - measure_from
    buckets = int(seconds / BUCKET + 1e-9)
    counts: Counter[str] = Counter()
    latencies: list[float] = []
    series: Counter[int] = Counter()
    local_limits: Counter[int] = Counter()
    for tally in tallies:
        counts.update(tally["counts"])
        latencies.extend(tally["latencies"])
        series.update({int(k): v for k, v in tally["series"].items()})
        local_limits.update({int(k): v for k, v in tally["limits"].items()})
    points = [point for point in stats["series"] if point["t"] + BUCKET <= seconds + 1e-9]
    window = [point for point in stats["series"] if point["t"] >= measure_from - 1e-9]
    upstream: Counter[str] = Counter()
    for point in window:
        upstream.update({k: v for k, v in point.items() if k in ("calls", "ok", "overload",
                                                                 "failed")})
    attempts = max(1, counts["attempts"])
    if polled is not None:
        limit_t = [t for t, _ in polled]
        limit_v = [v for _, v in polled]
    else:
        limit_t = [round(i * BUCKET, 3) for i in sorted(local_limits)]
        limit_v = [round(local_limits[i], 2) for i in sorted(local_limits)]
    measured_limits = [v for t, v in zip(limit_t, limit_v, strict=True) if t >= measure_from]
    limit: Any = spec.limit
    if measured_limits:
        low, high = math.floor(min(measured_limits)), math.floor(max(measured_limits))
        limit = f"{low}-{high}" if low != high else str(low)
    return {
        "limit": limit, "goodput": round(counts["good"] / measured, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "overload_calls": upstream["overload"], "status_429": counts["status_429"],
        "status_503": counts["status_503"], "timeouts": counts["timeout"],
        "rejected": counts["rejected"] + counts["not_permitted"],
        "rejected_bulkhead": counts["rejected"], "rejected_breaker": counts["not_permitted"],
        "errors": counts["error"], "ok": counts["ok"], "attempts": counts["attempts"],
        "upstream_calls": upstream["calls"],
        "max_in_flight": max((p["max_in_flight"] for p in window), default=0),
        "redis_usec_per_call": round(redis_cost[1] / attempts, 2),
        "measured_seconds": round(measured, 2),
        "series": {
            "t": [round(i * BUCKET, 3) for i in range(buckets)],
            "goodput": [round(series.get(i, 0) / BUCKET, 1) for i in range(buckets)],
            "upstream_t": [p["t"] for p in points],
            "in_flight": [p.get("max_in_flight", 0) for p in points],
            "overload": [p.get("overload", 0) for p in points],
            "limit_t": limit_t, "limit": limit_v,
        },
    }


def sweep_limits(capacity: int) -> list[int]:
    """Fixed limits tried for best_fixed: C/2 .. 2C."""
    return sorted({max(1, round(capacity * f)) for f in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)})


def convergence(result: dict[str, Any], steps: list[tuple[float, int]],
                end: float) -> list[dict[str, Any]]:
    """Per capacity step (time, new capacity): seconds until the fleet limit was within
    [C'/2, 1.5 C'] (None: never), and the share of the rest of the phase it stayed so."""
    s = result["series"]
    out = []
    for index, (at, capacity) in enumerate(steps):
        until = steps[index + 1][0] if index + 1 < len(steps) else end
        low, high = capacity / 2, capacity * 1.5
        phase = [(t, v) for t, v in zip(s["limit_t"], s["limit"], strict=True)
                 if at <= t < until]
        inside = [t for t, v in phase if low <= math.floor(v) <= high]
        entered = round(inside[0] - at, 2) if inside else None
        after = [v for t, v in phase if inside and t >= inside[0]]
        share = (round(sum(low <= math.floor(v) <= high for v in after) / len(after), 2)
                 if after else None)
        out.append({"at": at, "capacity": capacity, "within_band_after_s": entered,
                    "share_in_band_after": share})
    return out


class Bench:
    """The scenarios of one upstream on one fleet."""

    def __init__(self, fleet: Fleet, options: Options, only: set[str],
                 progress: Callable[[str], None]) -> None:
        self.fleet, self.options, self.only, self.progress = fleet, options, only, progress
        self.seq = iter(range(1_000_000))
        self.results: dict[str, Any] = {}

    def wanted(self, key: str) -> bool:
        return not self.only or key in self.only

    def spec(self, key: str, kind: str, limit: int | None = None, rate: float | None = None,
             **more: Any) -> Spec:
        o = self.options
        if rate is None:
            rate = o.load * o.calls_per_second(self.fleet.kind) / (o.processes * o.threads)
        return Spec(key, f"ovl-{self.fleet.tag}-{key}-{next(self.seq)}", kind, limit,
                    capacity=o.capacity, processes=o.processes, rate=rate, slo=o.slo,
                    timeout=o.timeout, tuning=o.tuning, **more)

    def run(self, spec: Spec, seconds: float, measure_from: float,
            script: Callable[[float], None] | None = None) -> dict[str, Any]:
        self.progress(f"{self.fleet.kind}: {spec.key}")
        try:
            return self.fleet.run(spec, seconds, measure_from, script)
        except ScenarioFailed as error:
            return {"error": str(error)}

    def all(self) -> dict[str, Any]:
        self.steady()
        if any(self.wanted(k) for k in STEP):
            self.step()
        if any(self.wanted(k) for k in GROWTH):
            self.growth()
        if self.fleet.kind == "refusing":
            for key in RECOVERY:
                if self.wanted(key):
                    self.results[key] = self.recovery(key)
        return self.results

    def steady(self) -> None:
        o, C, r = self.options, self.options.capacity, self.results
        if self.wanted("none"):
            r["none"] = self.run(self.spec("none", "none"), o.warmup + o.seconds, o.warmup)
        if self.wanted("fixed"):
            fixed = {limit: self.run(self.spec(f"fixed_{limit}", "fixed", limit),
                                     o.warmup + o.seconds, o.warmup)
                     for limit in o.limits or sweep_limits(C)}
            best = max(fixed, key=lambda limit: fixed[limit].get("goodput", -1.0))
            r["best_fixed"] = {**fixed[best], "sweep": {
                str(limit): fixed[limit].get("goodput") for limit in sorted(fixed)},
                "sweep_overload": {str(limit): fixed[limit].get("overload_calls")
                                   for limit in sorted(fixed)},
                "sweep_p50_ms": {str(limit): fixed[limit].get("p50_ms")
                                 for limit in sorted(fixed)}}
            if 2 * C in fixed:
                r["fixed_2x"] = fixed[2 * C]
        for kind in ("adaptive", "aimd", "gradient"):
            if self.wanted(kind):
                r[kind] = self.run(self.spec(kind, kind), o.warmup + o.seconds, o.warmup)

    def step(self) -> None:
        o, C = self.options, self.options.capacity
        third = round(o.seconds / BUCKET) * BUCKET
        low = max(1, round(C / 3))
        steps = [(third, low), (2 * third, C)]
        best = (self.results.get("best_fixed") or {}).get("limit") or C

        def script(start: float) -> None:
            for at, capacity in steps:
                time.sleep(max(0.0, start + at - time.time()))
                self.fleet.upstream.post("/admin", {"capacity": capacity})

        for key in STEP:
            if not self.wanted(key):
                continue
            kind = key.removeprefix("step_")
            result = self.run(self.spec(key, kind, best if kind == "fixed" else None),
                              3 * third, 0.0, script)
            if "series" in result:
                result["convergence"] = convergence(result, steps, 3 * third)
            self.results[key] = result

    def growth(self) -> None:
        o, C = self.options, self.options.capacity
        half = round(o.seconds / BUCKET) * BUCKET
        first = max(1, o.processes // 3)
        join_at = tuple(0.0 if wid < first else half for wid in range(o.processes))
        rate = o.calls_per_second(self.fleet.kind) / (first * o.threads)  # 1x, then ~3x
        for key in GROWTH:
            if not self.wanted(key):
                continue
            kind = key.removeprefix("growth_")
            if kind == "fixed":
                fixed = {limit: self.run(self.spec(f"growth_fixed_{limit}", "fixed", limit,
                                                   rate, join_at=join_at), 2 * half, 0.0)
                         for limit in sorted({C, round(1.25 * C), round(1.5 * C)})}
                best = max(fixed, key=lambda limit: fixed[limit].get("goodput", -1.0))
                self.results[key] = {**fixed[best], "sweep": {
                    str(limit): fixed[limit].get("goodput") for limit in sorted(fixed)}}
            else:
                self.results[key] = self.run(self.spec(key, kind, None, rate, join_at=join_at),
                                             2 * half, 0.0)

    def recovery(self, key: str) -> dict[str, Any]:
        """Healthy at C for S/2, failing (503) for S/2, then back at C/2 for S."""
        o = self.options
        S, half = o.seconds, max(1, o.capacity // 2)
        healthy = failing = round(S / 2 / BUCKET) * BUCKET

        def script(start: float) -> None:
            time.sleep(max(0.0, start + healthy - time.time()))
            self.fleet.upstream.post("/admin", {"fail_for": failing, "capacity": half})

        spec = self.spec(key, "adaptive" if key == "recovery_adaptive" else "fixed",
                         None if key == "recovery_adaptive" else o.capacity, breaker=True,
                         slow_start=key == "recovery_slow_start",
                         open_wait=max(0.2, S / 8))
        result = self.run(spec, healthy + failing + S, 0.0, script)
        if "series" in result:
            result["after_recovery"] = after_recovery(result, healthy + failing, half)
        return result


def after_recovery(result: dict[str, Any], back_at: float, capacity: int) -> dict[str, Any]:
    """The recovery run from the moment the upstream came back (series-based)."""
    s = result["series"]
    ups = [i for i, t in enumerate(s["upstream_t"]) if t >= back_at - 1e-9]
    goods = [g for t, g in zip(s["t"], s["goodput"], strict=True) if t >= back_at - 1e-9]
    return {"capacity": capacity,
            "overload_calls": sum(s["overload"][i] for i in ups),
            "max_in_flight": max((s["in_flight"][i] for i in ups), default=0),
            "goodput": round(sum(goods) / len(goods), 1) if goods else 0.0}


def run_bench(url: str, options: Options, upstreams: list[str], only: set[str],
              progress: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in upstreams:
        fleet = Fleet(url, options, kind)
        try:
            out[kind] = Bench(fleet, options, only, progress).all()
        finally:
            fleet.close()
        out[kind]["targets"] = targets(out[kind])
    return out


# -- reporting ------------------------------------------------------------------------------

def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 24's targets, as ratios (None: a side is missing)."""
    def get(key: str, field: str) -> Any:
        return (results.get(key) or {}).get(field)

    best, two_x = get("best_fixed", "goodput"), get("fixed_2x", "overload_calls")
    out: dict[str, Any] = {
        "adaptive_goodput_vs_best_fixed": ratio(get("adaptive", "goodput"), best),
        "adaptive_overload_vs_fixed_2x": ratio(get("adaptive", "overload_calls"), two_x),
        "aimd_goodput_vs_best_fixed": ratio(get("aimd", "goodput"), best),
        "gradient_goodput_vs_best_fixed": ratio(get("gradient", "goodput"), best),
        "growth_adaptive_vs_best_fixed": ratio(get("growth_adaptive", "goodput"),
                                               get("growth_fixed", "goodput")),
        "step_adaptive_vs_fixed": ratio(get("step_adaptive", "goodput"),
                                        get("step_fixed", "goodput")),
        "step_convergence_s": [c["within_band_after_s"] for c in
                               get("step_adaptive", "convergence") or []],
    }
    a, g = out["adaptive_goodput_vs_best_fixed"], out["adaptive_overload_vs_fixed_2x"]
    conv = out["step_convergence_s"]
    out["met"] = {
        "adaptive_goodput_ge_90pct": None if a is None else a >= 0.9,
        "adaptive_overload_le_10pct": None if g is None else g <= 0.1,
        "adaptive_ahead_of_per_process": None if a is None else all(
            a > (out[k] or 0) for k in ("aimd_goodput_vs_best_fixed",
                                        "gradient_goodput_vs_best_fixed")),
        "step_within_band_in_2s": None if not conv else all(
            c is not None and c <= 2.0 for c in conv),
        "growth_goodput_ge_90pct": None if out["growth_adaptive_vs_best_fixed"] is None
        else out["growth_adaptive_vs_best_fixed"] >= 0.9,
    }
    return out


ROWS = ("none", "best_fixed", "fixed_2x", "adaptive", "aimd", "gradient", *STEP, *GROWTH,
        *RECOVERY)


def print_table(document: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    run = document["run"]
    console = Console(width=None if sys.stdout.isatty() else 160)
    for kind in UPSTREAMS:
        results = document.get(kind)
        if not results:
            continue
        best = results.get("best_fixed") or {}
        table = Table(title=(
            f"{kind} upstream: C={run['capacity']} (hidden from the fleet), {run['load']:g}x "
            f"load, SLO {run['slo'] * 1000:g} ms, {run['processes']} processes x "
            f"{run['threads']} threads, {run['seconds']:g} s per phase"))
        for column in ("scenario", "limit", "goodput/s", "x best", "p50 ms", "p99 ms",
                       "beyond C", "x fixed_2x", "429/503/timeout", "rejected", "redis us"):
            table.add_column(column, justify="left" if column == "scenario" else "right")
        two_x = (results.get("fixed_2x") or {}).get("overload_calls")
        for key in ROWS:
            value = results.get(key)
            if value is None:
                continue
            if "error" in value:
                table.add_row(key, "", f"[red]error: {value['error']}[/red]")
                continue
            reference = best.get("goodput") if key in STEADY or key in (
                "best_fixed", "fixed_2x") else None
            if key.startswith("growth_"):
                reference = (results.get("growth_fixed") or {}).get("goodput")
            if key.startswith("step_"):
                reference = (results.get("step_fixed") or {}).get("goodput")
            vs_best = ratio(value["goodput"], reference)
            vs_2x = ratio(value["overload_calls"], two_x) if key in (
                "none", "best_fixed", "fixed_2x", "adaptive", "aimd", "gradient") else None
            limit = value.get("limit")
            table.add_row(key, "-" if limit is None else str(limit), f"{value['goodput']:.1f}",
                          "" if vs_best is None else f"{vs_best:.2f}", f"{value['p50_ms']:.0f}",
                          f"{value['p99_ms']:.0f}", str(value["overload_calls"]),
                          "" if vs_2x is None else f"{vs_2x:.2f}",
                          f"{value['status_429']}/{value['status_503']}/{value['timeouts']}",
                          str(value["rejected"]), f"{value['redis_usec_per_call']:.1f}")
        console.print(table)
        if "sweep" in best:
            beyond = best.get("sweep_overload") or {}
            console.print("best_fixed sweep (limit: goodput/s, calls beyond C): " + ", ".join(
                f"{limit}: {goodput:g}, {beyond.get(limit)}"
                for limit, goodput in best["sweep"].items()))
        for key in STEP:
            for c in (results.get(key) or {}).get("convergence") or []:
                console.print(f"{key}: step to C={c['capacity']} at {c['at']:g} s: within "
                              f"[C/2, 1.5C] after {c['within_band_after_s']} s, then "
                              f"{c['share_in_band_after']} of the time")
        for key in RECOVERY:
            a = (results.get(key) or {}).get("after_recovery")
            if a:
                console.print(f"{key}: after the upstream came back at capacity "
                              f"{a['capacity']}: {a['overload_calls']} overload calls, max in "
                              f"flight {a['max_in_flight']}, goodput {a['goodput']:g}/s")
        console.print(f"targets: {json.dumps(results['targets'])}")


def check_plot_path(path: str) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib "
                         "(or, in a distbreaker checkout: pip install '.[plot]')") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SystemExit(f"--plot {path}: cannot write into {folder}")


def plot(document: dict[str, Any], path: str) -> None:
    """Per upstream: the fleet limit through the capacity step (adaptive and the
    per-process limiters' sums) and goodput over time at steady 2x overload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [kind for kind in UPSTREAMS if document.get(kind)]
    capacity = document["run"]["capacity"]
    fig, axes = plt.subplots(len(kinds), 2, figsize=(14, 4.5 * len(kinds)), squeeze=False)
    for row, kind in enumerate(kinds):
        results = document[kind]
        step_axis, steady_axis = axes[row]
        for key in STEP:
            series = (results.get(key) or {}).get("series") or {}
            if series.get("limit"):
                step_axis.step(series["limit_t"], series["limit"], where="post",
                               label=key.removeprefix("step_"), lw=1.2)
        phase = document["run"]["seconds"]
        low = max(1, round(capacity / 3))
        step_axis.hlines([capacity, low, capacity], [0, phase, 2 * phase],
                         [phase, 2 * phase, 3 * phase], colors="black", linestyles="--",
                         lw=0.8, label="capacity")
        step_axis.set_title(f"{kind}: fleet limit through C -> C/3 -> C")
        step_axis.set_ylim(0, 4 * capacity)
        for key in ("best_fixed", "fixed_2x", "adaptive", "aimd", "gradient"):
            series = (results.get(key) or {}).get("series") or {}
            if series.get("t"):
                steady_axis.step(series["t"], series["goodput"], where="post", label=key,
                                 lw=1.2)
        steady_axis.set_title(f"{kind}: goodput (within the SLO) at 2x overload")
        for axis in (step_axis, steady_axis):
            axis.set_xlabel("seconds")
            axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: $REDIS_URL, else spawn redis-server)")
    parser.add_argument("--upstream", default="both", choices=(*UPSTREAMS, "both"))
    parser.add_argument("--capacity", type=int, default=9, help="the upstream's C (default 9)")
    parser.add_argument("--base-latency", type=float, default=0.05,
                        help="seconds a call takes at C in flight (queueing: the mean "
                             "service time; default 0.05)")
    parser.add_argument("--queue", type=int, default=64,
                        help="queueing: the FIFO queue's length beyond C (default 64)")
    parser.add_argument("--sigma", type=float, default=0.5,
                        help="queueing: lognormal spread of service times (default 0.5)")
    parser.add_argument("--load", type=float, default=2.0,
                        help="offered load, x the upstream's capacity (default 2)")
    parser.add_argument("--slo", type=float, default=0.2,
                        help="a success counts for goodput within this, seconds (default 0.2)")
    parser.add_argument("--timeout", type=float, default=0.5,
                        help="the callers' timeout, seconds (default 0.5)")
    parser.add_argument("--processes", type=int, default=6,
                        help="worker processes (default 6; growth starts with a third)")
    parser.add_argument("--threads", type=int, default=12,
                        help="calling threads per process (default 12)")
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="seconds per steady scenario and per phase of the others "
                             "(default 4)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds before a steady scenario is measured (default 2)")
    parser.add_argument("--limits", default="",
                        help="comma-separated fixed limits to sweep (default C/2 .. 2C)")
    parser.add_argument("--adaptive", default="{}", metavar="JSON",
                        help='AdaptiveLimit fields for the adaptive scenarios, e.g. '
                             '\'{"tolerance": 1.3}\' (default: min 1, max 4C, the SLO as '
                             'latency_target, the rest the library\'s defaults)')
    parser.add_argument("--only", default="",
                        help=f"comma-separated scenarios (default all: {','.join(SCENARIOS)})")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--series", action="store_true",
                        help="keep the per-scenario time series in the JSON")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw the fleet limit through the step and goodput over time")
    args = parser.parse_args(argv)
    if args.plot:
        check_plot_path(args.plot)
    only = {key.strip() for key in args.only.split(",") if key.strip()}
    unknown = only - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if args.capacity < 2 or args.processes < 1 or args.threads < 1 or args.seconds < 0.5:
        parser.error("need --capacity >= 2, --processes >= 1, --threads >= 1, --seconds >= 0.5")
    try:
        tuning = json.loads(args.adaptive)
    except ValueError as error:
        parser.error(f"--adaptive: not JSON: {error}")
    if not isinstance(tuning, dict):
        parser.error("--adaptive: want a JSON object of AdaptiveLimit fields")
    options = Options(args.capacity, args.processes, args.threads, args.seconds,
                      args.base_latency, args.queue, args.sigma, args.load, args.slo,
                      args.timeout, tuple(sorted(tuning.items())),
                      tuple(int(x) for x in args.limits.split(",") if x.strip()), args.warmup)
    try:
        adaptive_limit(options.capacity, options.slo, options.tuning)
    except (TypeError, ValueError) as error:
        parser.error(f"--adaptive: {error}")
    upstreams = list(UPSTREAMS) if args.upstream == "both" else [args.upstream]

    def progress(text: str) -> None:
        print(f"  running {text} ...", file=sys.stderr, flush=True)

    started = time.monotonic()
    with bench_redis(args.url) as (url, origin):
        results = run_bench(url, options, upstreams, only, progress)
    document: dict[str, Any] = {
        "run": {"distbreaker": distbreaker.__version__, "redis": origin,
                **{k: v for k, v in dataclasses.asdict(options).items() if k != "tuning"},
                "adaptive": dict(options.tuning),
                "wall_seconds": round(time.monotonic() - started, 1)},
        **results,
    }
    if args.plot:
        plot(document, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if not args.series:
        for results_of in results.values():
            for value in results_of.values():
                if isinstance(value, dict):
                    value.pop("series", None)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_table(document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
