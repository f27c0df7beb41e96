#!/usr/bin/env python3
"""Overload bench: a fleet against an upstream whose capacity only the bench knows.

The upstream (``python -m distbreaker.demo.capacity``, a subprocess) serves at most
C calls at once, slower the more are in flight (``base * (1 + in_flight/C) ** k``),
and answers 429 with Retry-After to every call beyond C, which it counts as an
overload call. A fleet of real worker processes (``--processes`` x ``--threads``
closed-loop callers, offered load well above C) calls it, each call protected by
a fleet-wide distbreaker `Bulkhead` in Redis (a fresh ``redis-server``, or
``--url`` / ``$REDIS_URL``). Scenarios, one after the other on the same fleet:

- ``none``: no bulkhead; ``fixed_2x``: limit 2C; ``fixed_half``: limit C/2;
- ``best_fixed``: the best goodput of a sweep over fixed limits (C/2 .. 2C);
- ``adaptive``: ``Bulkhead(..., adaptive=AdaptiveLimit(...))`` (see
  `adaptive_limit`; ``--adaptive JSON`` overrides its fields), learning from the
  429s (with Retry-After) the callers raise inside it;
- ``recovery_plain``: breaker + fixed bulkhead at C; the upstream fails (503) for a
  while, the breaker opens, then the upstream comes back at C/2 and the breaker's
  close lets the whole fleet in at once; ``recovery_slow_start``: the same with the
  breaker's slow start (``ramp_start`` 0.1, ``ramp_duration`` S/2);
  ``recovery_adaptive``: a `Policy` of the breaker and the adaptive bulkhead instead,
  whose limit restarts at its minimum when the breaker closes after the recovery.

Per scenario: ``goodput`` (successful calls/s), ``p50_ms`` / ``p99_ms`` (calls that
reached the upstream, from the start of the protected call: a permit wait counts),
``ok_p50_ms`` / ``ok_p99_ms`` (successful calls only), ``overload_calls`` (the
upstream's count beyond C), ``status_429`` (429 answers the callers saw), ``rejected``
(BulkheadFull + CallNotPermitted), Redis commands (script calls and BLPOP waits) and
script server microseconds per protected call (``INFO commandstats``: a rough guide;
the per-call cost proper is scripts/bench_redis_cost.py's). A steady scenario's first
quarter is a warm-up (not measured); a recovery run is measured whole, and its
``after_recovery`` part from the moment the upstream came back. Callers are naive:
after a 429, a 503 or a rejection they pause 20 ms, whatever the Retry-After says.

Usage: ``.venv/bin/python scripts/bench_overload.py [--seconds 4] [--capacity 8]
[--processes 4] [--threads 6] [--json] [--plot FILE.png] [--only none,fixed_2x]``
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import inspect
import json
import multiprocessing
import os
import queue
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

import distbreaker
from distbreaker import Bulkhead, CircuitBreaker, HttpStatusError, Policy
from distbreaker.breaker.config import BreakerConfig
from distbreaker.demo.embedded import bench_redis
from distbreaker.demo.httpserver import ServerProcess
from distbreaker.errors import BulkheadFull, CallNotPermitted

STEADY = ("none", "fixed_2x", "fixed_half", "best_fixed", "adaptive")
RECOVERY = ("recovery_plain", "recovery_slow_start", "recovery_adaptive")
SCENARIOS = (*STEADY, *RECOVERY)
BUCKET = 0.25          # seconds per point of the time series (worker and upstream side)
PAUSE = 0.02           # a caller's pause after any call that did not succeed
MAX_WAIT = 0.1         # how long a caller waits for a bulkhead permit
ADAPTIVE_MAX_WAIT = 0.0  # the adaptive bulkhead's (see Protection)
ADAPTIVE_DEFAULTS = {"min_limit": 1, "smoothing": 0.05}   # and max_limit 4C
RAMP_START = 0.1       # slow start: the share admitted right after the close


# -- what a worker runs ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Spec:
    """One scenario run as the workers see it (picklable)."""

    key: str
    name: str                     # bulkhead / breaker name in Redis (fresh per run)
    limit: int | None             # fixed bulkhead limit; None: no bulkhead
    adaptive: bool = False
    breaker: bool = False
    slow_start: bool = False
    capacity: int = 8
    processes: int = 1
    open_wait: float = 0.5        # the breaker's wait in OPEN
    tuning: tuple[tuple[str, Any], ...] = ()   # AdaptiveLimit fields over the defaults


def adaptive_limit(capacity: int, tuning: tuple[tuple[str, Any], ...] = ()) -> Any:
    """The `AdaptiveLimit` the adaptive scenarios use: between 1 and 4C, starting at the
    library's default (4), never told C; `tuning` (``--adaptive``) overrides fields.

    Smoothing 0.05 (the library's default is 0.2): measured at C=8, 0.2 grows so fast
    that the limit probes past C every second (54 overload calls in the adaptive run,
    ~10/s after a recovery), 0.05 keeps goodput (194/s vs the best fixed 192/s) with
    3 overload calls, and ~1/s after a recovery. Raises AttributeError / TypeError
    while the library lacks it."""
    cls = distbreaker.AdaptiveLimit  # type: ignore[attr-defined]
    return cls(**{**ADAPTIVE_DEFAULTS, "max_limit": 4 * capacity, **dict(tuning)})


def slow_start_options(seconds: float) -> dict[str, Any]:
    """Breaker options of slow start (issue 18); KeyError while the breaker lacks them.

    `ramp_start` is given as the breaker's default is written: a percent when that
    default is above 1 (like `failure_rate_threshold`), else a share."""
    fields = {field.name: field for field in dataclasses.fields(BreakerConfig)}
    missing = {"ramp_start", "ramp_duration"} - set(fields)
    if missing:
        raise KeyError(f"BreakerConfig has no {', '.join(sorted(missing))}")
    default = fields["ramp_start"].default
    percent = isinstance(default, (int, float)) and default > 1
    return {"ramp_start": RAMP_START * 100 if percent else RAMP_START,
            "ramp_duration": seconds}


def adaptive_unavailable(capacity: int,
                         tuning: tuple[tuple[str, Any], ...] = ()) -> str | None:
    """Why the adaptive scenarios cannot run, or None."""
    if not hasattr(distbreaker, "AdaptiveLimit"):
        return "AdaptiveLimit not available"
    if "adaptive" not in inspect.signature(Bulkhead).parameters and not any(
            p.kind is inspect.Parameter.VAR_KEYWORD
            for p in inspect.signature(Bulkhead).parameters.values()):
        return "Bulkhead takes no adaptive="
    try:
        adaptive_limit(capacity, tuning)
    except (TypeError, ValueError) as error:
        return f"AdaptiveLimit(...) failed: {error}"
    return None


def slow_start_unavailable() -> str | None:
    try:
        slow_start_options(1.0)
    except KeyError as error:
        return f"slow start not available ({error.args[0]})"
    return None


class Protection:
    """The bulkhead (and breaker) one worker process calls through in one scenario.

    An adaptive bulkhead learns from what each call reports: the callers raise the
    upstream's 429 inside the bulkhead (an `HttpStatusError` with its Retry-After,
    which the bulkhead reports like `distbreaker.Overloaded(retry_after)`). With a
    breaker too (recovery_adaptive) both are one `Policy`, whose breaker restarts
    the adaptive limit at its minimum when it closes after a recovery.
    """

    def __init__(self, spec: Spec, url: str, seconds: float) -> None:
        self.bulkhead: Bulkhead | None = None
        self.breaker: CircuitBreaker | None = None
        self.policy: Policy | None = None
        bulkhead: dict[str, Any] | None = None
        if spec.limit is not None or spec.adaptive:
            bulkhead = {"max_concurrent_calls": spec.limit or 2 * spec.capacity,
                        "max_wait_duration": MAX_WAIT, "lease": 5.0,
                        "expected_workers": spec.processes, "redis_timeout": 1.0}
            if spec.adaptive:
                bulkhead["adaptive"] = adaptive_limit(spec.capacity, spec.tuning)
                # An adaptive bulkhead cannot register waiters yet: bulkhead.lua parses
                # every meta field as a number once one is registered, and a_why is text.
                bulkhead["max_wait_duration"] = ADAPTIVE_MAX_WAIT
        breaker: dict[str, Any] | None = None
        if spec.breaker:
            breaker = {
                "sliding_window_type": "COUNT_BASED", "sliding_window_size": 20,
                "minimum_number_of_calls": 10, "failure_rate_threshold": 50,
                "wait_duration_in_open_state": spec.open_wait,
                "permitted_calls_in_half_open": 3, "half_open_lease": 5.0,
                "ignore_exceptions": (BulkheadFull,), "redis_timeout": 1.0,
                **(slow_start_options(seconds / 2) if spec.slow_start else {})}
        if breaker is not None and bulkhead is not None and spec.adaptive:
            self.policy = Policy(spec.name, redis=url, breaker=breaker, bulkhead=bulkhead,
                                 redis_timeout=1.0)
            return
        if bulkhead is not None:
            self.bulkhead = Bulkhead(spec.name, redis=url, **bulkhead)
        if breaker is not None:
            self.breaker = CircuitBreaker(spec.name, redis=url, **breaker)

    def call(self, fn: Callable[[], int]) -> int:
        if self.policy is not None:
            return self.policy.call(fn)
        inner: Callable[[], int] = fn
        if self.bulkhead is not None:
            bulkhead = self.bulkhead
            inner = lambda: bulkhead.call(fn)  # noqa: E731
        if self.breaker is not None:
            return self.breaker.call(inner)
        return inner()

    def close(self) -> None:
        if self.policy is not None:    # a Policy has no close(): its components do
            self.bulkhead, self.breaker = self.policy.bulkhead, self.policy.breaker
        for component in (self.bulkhead, self.breaker):
            if component is not None:
                component.close()


class Caller:
    """One thread's keep-alive HTTP connection to the upstream."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection: http.client.HTTPConnection | None = None

    def __call__(self) -> int:
        """GET /call; a refusal (429, 503) raises `HttpStatusError` (Retry-After kept)."""
        if self.connection is None:
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
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

    def __init__(self, start: float, measure_from: float) -> None:
        self.start = start
        self.measure_from = measure_from
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.ok_latencies: list[float] = []
        self.series: Counter[int] = Counter()   # successes per bucket, by end time
        self.ran: Counter[int] = Counter()      # calls that reached the upstream, per bucket

    def add(self, started: float, ended: float, outcome: str, ran: bool) -> None:
        with self.lock:
            index = int((ended - self.start) / BUCKET)
            if outcome == "ok":
                self.series[index] += 1
            if ran:
                self.ran[index] += 1
            if started < self.measure_from:
                return
            self.counts[outcome] += 1
            self.counts["attempts"] += 1
            if ran:
                self.latencies.append(ended - started)
            if outcome == "ok":
                self.ok_latencies.append(ended - started)

    def result(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "latencies": self.latencies,
                "ok_latencies": self.ok_latencies,
                "series": dict(self.series), "ran": dict(self.ran)}


def call_loop(protection: Protection, caller: Caller, tally: Tally, end: float) -> None:
    """Call until `end` (closed loop); pause after anything but a success."""
    delay = tally.start - time.time()
    if delay > 0:
        time.sleep(delay)
    while (started := time.time()) < end:
        outcome, ran = "ok", True
        try:
            protection.call(caller)
        except BulkheadFull:
            outcome, ran = "bulkhead_full", False
        except CallNotPermitted:
            outcome, ran = "not_permitted", False
        except HttpStatusError as refusal:
            outcome = f"status_{refusal.status_code}"
        except (OSError, http.client.HTTPException):
            outcome = "error"
        tally.add(started, time.time(), outcome, ran)
        if outcome != "ok":
            time.sleep(PAUSE)


def worker(wid: int, url: str, port: int, threads: int, seconds: float, commands: Any,
           out: Any) -> None:
    """A fleet process: per scenario, build its protection, call from `threads` threads
    between the times the parent sends, report its tally."""
    callers = [Caller(port) for _ in range(threads)]
    out.put(("up", wid))
    while True:
        command = commands.get()
        if command[0] == "stop":
            return
        spec: Spec = command[1]
        try:
            protection = Protection(spec, url, seconds)
        except Exception as error:
            out.put(("failed", wid, repr(error)))
            continue
        out.put(("ready", wid))
        start, measure_from, end = commands.get()[1:]
        tally = Tally(start, measure_from)
        pool = [threading.Thread(target=call_loop, args=(protection, caller, tally, end))
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
    exponent: float
    tuning: tuple[tuple[str, Any], ...] = ()

    @property
    def warmup(self) -> float:
        """The unmeasured start of a steady scenario (whole buckets)."""
        return max(BUCKET, round(self.seconds / 4 / BUCKET) * BUCKET)


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


#: The commands a bulkhead or breaker sends itself (INFO commandstats also counts every
#: command run inside a script, whose time the script's own entry already includes).
SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")
BLOCKING = ("blpop",)   # counted as a call; its time is mostly waiting, not counted


def command_stats(admin: redis.Redis) -> tuple[int, int]:
    """Top-level commands the fleet sent since Redis started, and the server
    microseconds of its script calls (inner commands included)."""
    calls = usec = 0
    for key, value in admin.info("commandstats").items():
        command = key.removeprefix("cmdstat_")
        if command in SCRIPT_COMMANDS:
            calls += int(value["calls"])
            usec += int(value["usec"])
        elif command in BLOCKING:
            calls += int(value["calls"])
    return calls, usec


class ScenarioFailed(Exception):
    """A worker could not build a scenario's protection (e.g. an option the library
    does not take yet): that scenario reports the error, the others still run."""


class Fleet:
    """The worker processes, the upstream and Redis of one bench run."""

    def __init__(self, url: str, options: Options) -> None:
        self.url = url
        self.options = options
        self.tag = secrets.token_hex(3)
        self.admin = redis.Redis.from_url(url)
        self.upstream = ServerProcess("distbreaker.demo.capacity", [
            "--capacity", str(options.capacity), "--base-latency", str(options.base_latency),
            "--exponent", str(options.exponent), "--bucket", str(BUCKET)])
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
        """One message of one of `kinds` from every worker (or `workers` of them)."""
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
        """One scenario: `script(start)` drives the upstream during the run (recovery)."""
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
        time.sleep(max(0.0, start - 0.02 - time.time()))
        self.upstream.post("/restart")   # just before the first call
        redis_before = command_stats(self.admin)
        if script is not None:
            script(start)
        time.sleep(max(0.0, end - time.time()))
        tallies = [message[2] for message in self._expect(("done",))]
        redis_after = command_stats(self.admin)
        stats = self.upstream.get("/stats")
        return summarize(spec, tallies, stats, seconds, measure_from,
                         (redis_after[0] - redis_before[0], redis_after[1] - redis_before[1]))


def summarize(spec: Spec, tallies: list[dict[str, Any]], stats: dict[str, Any],
              seconds: float, measure_from: float, redis_cost: tuple[int, int]) -> dict[str, Any]:
    """One scenario's figures from the workers' tallies and the upstream's counts
    (the time series keep whole buckets of the run only: no ragged last point)."""
    measured = seconds - measure_from
    buckets = int(seconds / BUCKET + 1e-9)
    counts: Counter[str] = Counter()
    latencies: list[float] = []
    ok_latencies: list[float] = []
    series: Counter[int] = Counter()
    for tally in tallies:
        counts.update(tally["counts"])
        latencies.extend(tally["latencies"])
        ok_latencies.extend(tally["ok_latencies"])
        series.update({int(k): v for k, v in tally["series"].items()})
    points = [point for point in stats["series"] if point["t"] + BUCKET <= seconds + 1e-9]
    window = [point for point in stats["series"] if point["t"] >= measure_from - 1e-9]
    upstream: Counter[str] = Counter()
    for point in window:
        upstream.update({k: v for k, v in point.items() if k in ("calls", "ok", "overload",
                                                                 "failed")})
    attempts = max(1, counts["attempts"])
    return {
        "limit": spec.limit, "goodput": round(counts["ok"] / measured, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "ok_p50_ms": round(percentile(ok_latencies, 0.5) * 1000, 1),
        "ok_p99_ms": round(percentile(ok_latencies, 0.99) * 1000, 1),
        "overload_calls": upstream["overload"], "status_429": counts["status_429"],
        "status_503": counts["status_503"],
        "rejected": counts["bulkhead_full"] + counts["not_permitted"],
        "rejected_bulkhead": counts["bulkhead_full"],
        "rejected_breaker": counts["not_permitted"], "errors": counts["error"],
        "ok": counts["ok"], "attempts": counts["attempts"],
        "upstream_calls": upstream["calls"],
        "max_in_flight": max((p["max_in_flight"] for p in window), default=0),
        "redis_commands_per_call": round(redis_cost[0] / attempts, 2),
        "redis_usec_per_call": round(redis_cost[1] / attempts, 2),
        "measured_seconds": round(measured, 2),
        "series": {
            "t": [round(i * BUCKET, 3) for i in range(buckets)],
            "goodput": [round(series.get(i, 0) / BUCKET, 1) for i in range(buckets)],
            "upstream_t": [p["t"] for p in points],
            "in_flight": [p.get("max_in_flight", 0) for p in points],
            "overload": [p.get("overload", 0) for p in points],
        },
    }


def after_recovery(result: dict[str, Any], back_at: float, capacity: int) -> dict[str, Any]:
    """The recovery run from the moment the upstream came back (series-based)."""
    s = result["series"]
    ups = [i for i, t in enumerate(s["upstream_t"]) if t >= back_at - 1e-9]
    goods = [g for t, g in zip(s["t"], s["goodput"], strict=True) if t >= back_at - 1e-9]
    per_second: Counter[int] = Counter()
    for i in ups:
        per_second[int((s["upstream_t"][i] - back_at) + 1e-9)] += s["overload"][i]
    return {"capacity": capacity,
            "overload_calls": sum(s["overload"][i] for i in ups),
            # when the rush comes: right at the close (plain), later (a ramp), never
            "overload_per_second": [per_second[i] for i in range(max(per_second, default=-1)
                                                                  + 1)],
            "max_in_flight": max((s["in_flight"][i] for i in ups), default=0),
            "goodput": round(sum(goods) / len(goods), 1) if goods else 0.0}


def scenario_plan(only: set[str]) -> list[str]:
    """The scenarios to run, in the order they are reported."""
    return [key for key in SCENARIOS if not only or key in only]


def sweep_limits(capacity: int) -> list[int]:
    """Fixed limits tried for best_fixed: C/2 .. 2C."""
    return sorted({max(1, round(capacity * f)) for f in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)})


def run_bench(url: str, options: Options, only: set[str],
              progress: Callable[[str], None]) -> dict[str, Any]:
    C = options.capacity
    fleet = Fleet(url, options)
    results: dict[str, Any] = {}
    seq = iter(range(1_000_000))

    def spec(key: str, limit: int | None, **more: Any) -> Spec:
        return Spec(key, f"ovl-{fleet.tag}-{key}-{next(seq)}", limit, capacity=C,
                    processes=options.processes, tuning=options.tuning, **more)

    def steady(key: str, limit: int | None, **more: Any) -> dict[str, Any]:
        progress(f"{key} (limit {limit if limit is not None else '-'})")
        try:
            return fleet.run(spec(key, limit, **more), options.seconds, options.warmup)
        except ScenarioFailed as error:
            return {"error": str(error)}

    plan = scenario_plan(only)
    adaptive_why = adaptive_unavailable(C, options.tuning)
    slow_why = slow_start_unavailable()
    try:
        fixed: dict[int, dict[str, Any]] = {}

        def fixed_at(limit: int) -> dict[str, Any]:
            if limit not in fixed:
                fixed[limit] = steady(f"fixed_{limit}", limit)
            return fixed[limit]

        if "none" in plan:
            results["none"] = steady("none", None)
        if "fixed_2x" in plan:
            results["fixed_2x"] = fixed_at(2 * C)
        if "fixed_half" in plan:
            results["fixed_half"] = fixed_at(max(1, C // 2))
        if "best_fixed" in plan:
            for limit in sweep_limits(C):
                fixed_at(limit)
            best = max(fixed, key=lambda limit: fixed[limit].get("goodput", -1.0))
            results["best_fixed"] = {**fixed[best], "sweep": {
                str(limit): fixed[limit].get("goodput") for limit in sorted(fixed)}}
        if "adaptive" in plan:
            results["adaptive"] = ({"skipped": adaptive_why} if adaptive_why
                                   else steady("adaptive", None, adaptive=True))
        for key in RECOVERY:
            if key not in plan:
                continue
            why = (slow_why if key == "recovery_slow_start"
                   else adaptive_why if key == "recovery_adaptive" else None)
            if why:
                results[key] = {"skipped": why}
                continue
            progress(key)
            results[key] = recovery_or_error(fleet, spec(
                key, None if key == "recovery_adaptive" else C, breaker=True,
                slow_start=key == "recovery_slow_start", adaptive=key == "recovery_adaptive",
                open_wait=max(0.2, options.seconds / 8)), options)
    finally:
        fleet.close()
    return results


def recovery_or_error(fleet: Fleet, spec: Spec, options: Options) -> dict[str, Any]:
    try:
        return recovery(fleet, spec, options)
    except ScenarioFailed as error:
        return {"error": str(error)}


def recovery(fleet: Fleet, spec: Spec, options: Options) -> dict[str, Any]:
    """Healthy at C for S/2, failing (503) for S/2, then back at C/2 for S."""
    S, half = options.seconds, max(1, options.capacity // 2)
    healthy, failing = round(S / 2 / BUCKET) * BUCKET, round(S / 2 / BUCKET) * BUCKET

    def script(start: float) -> None:
        time.sleep(max(0.0, start + healthy - time.time()))
        fleet.upstream.post("/admin", {"fail_for": failing, "capacity": half})

    result = fleet.run(spec, healthy + failing + S, 0.0, script)
    result["after_recovery"] = after_recovery(result, healthy + failing, half)
    result["phases"] = {"healthy": [0, healthy], "failing": [healthy, healthy + failing],
                        "recovered": [healthy + failing, healthy + failing + S]}
    return result


# -- reporting ------------------------------------------------------------------------------

def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 18's targets, as ratios (None: a side is missing or skipped)."""
    def get(key: str, field: str) -> Any:
        value = results.get(key) or {}
        return None if "skipped" in value else value.get(field)

    def after(key: str) -> Any:
        value = results.get(key) or {}
        return (value.get("after_recovery") or {}).get("overload_calls")

    out = {
        "adaptive_goodput_vs_best_fixed": ratio(get("adaptive", "goodput"),
                                                get("best_fixed", "goodput")),
        "adaptive_overload_vs_fixed_2x": ratio(get("adaptive", "overload_calls"),
                                               get("fixed_2x", "overload_calls")),
        "recovery_plain_overload_after": after("recovery_plain"),
        "recovery_slow_start_overload_after": after("recovery_slow_start"),
        "recovery_adaptive_overload_after": after("recovery_adaptive"),
        "adaptive_redis_usec_vs_fixed": ratio(get("adaptive", "redis_usec_per_call"),
                                              get("best_fixed", "redis_usec_per_call")),
    }
    out["met"] = {
        "adaptive_goodput_ge_90pct": None if out["adaptive_goodput_vs_best_fixed"] is None
        else out["adaptive_goodput_vs_best_fixed"] >= 0.9,
        "adaptive_overload_le_10pct": None if out["adaptive_overload_vs_fixed_2x"] is None
        else out["adaptive_overload_vs_fixed_2x"] <= 0.1,
        "slow_start_at_or_under_capacity": None
        if out["recovery_slow_start_overload_after"] is None
        else out["recovery_slow_start_overload_after"] == 0,
        "adaptive_restart_at_or_under_capacity": None
        if out["recovery_adaptive_overload_after"] is None
        else out["recovery_adaptive_overload_after"] == 0,
    }
    return out


def print_table(document: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    run = document["run"]
    console = Console(width=None if sys.stdout.isatty() else 150)
    best = document.get("best_fixed") or {}
    table = Table(title=(f"overload bench: capacity C={run['capacity']} (hidden from the "
                         f"fleet), {run['processes']} processes x {run['threads']} threads, "
                         f"{run['seconds']:g} s per scenario"))
    for column in ("scenario", "limit", "goodput/s", "x best", "p50 ms", "p99 ms",
                   "overload calls", "x fixed_2x", "429s", "rejected", "redis us/call"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    two_x = (document.get("fixed_2x") or {}).get("overload_calls")
    for key in SCENARIOS:
        value = document.get(key)
        if value is None:
            continue
        if "skipped" in value or "error" in value:
            why = (f"[dim]skipped: {value['skipped']}[/dim]" if "skipped" in value
                   else f"[red]error: {value['error']}[/red]")
            table.add_row(key, "", why)
            continue
        vs_best = ratio(value["goodput"], best.get("goodput"))
        vs_2x = ratio(value["overload_calls"], two_x)
        limit = value.get("limit")
        table.add_row(key, "-" if limit is None else str(limit), f"{value['goodput']:.1f}",
                      "" if vs_best is None else f"{vs_best:.2f}", f"{value['p50_ms']:.0f}",
                      f"{value['p99_ms']:.0f}", str(value["overload_calls"]),
                      "" if vs_2x is None else f"{vs_2x:.2f}", str(value["status_429"]),
                      str(value["rejected"]), f"{value['redis_usec_per_call']:.1f}")
    console.print(table)
    if "sweep" in best:
        console.print("best_fixed sweep (limit: goodput/s): " + ", ".join(
            f"{limit}: {goodput:g}" for limit, goodput in best["sweep"].items()))
    for key in RECOVERY:
        value = document.get(key) or {}
        if "after_recovery" in value:
            a = value["after_recovery"]
            console.print(f"{key}: after the upstream came back at capacity {a['capacity']}: "
                          f"{a['overload_calls']} overload calls, max in flight "
                          f"{a['max_in_flight']}, goodput {a['goodput']:g}/s")
    console.print(f"targets: {json.dumps(document['targets'])}")


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
    """Goodput and upstream in-flight over time: steady scenarios on top, recovery below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacity = document["run"]["capacity"]
    fig, axes = plt.subplots(2, 2, figsize=(14, 8))
    outside = {"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}
    for row, keys in enumerate((STEADY, RECOVERY)):
        goodput_axis, flight_axis = axes[row]
        for key in keys:
            value = document.get(key) or {}
            if "series" not in value:
                continue
            s = value["series"]
            goodput_axis.step(s["t"], s["goodput"], where="post", label=key, lw=1.4)
            flight_axis.step(s["upstream_t"], s["in_flight"], where="post", label=key, lw=1.4)
        goodput_axis.set_ylabel("successful calls/s")
        flight_axis.set_ylabel("upstream in flight (max per bucket)")
        if row == 0:
            flight_axis.axhline(capacity, color="black", ls="--", lw=0.8, label="capacity C",
                                zorder=0)
            goodput_axis.axvline(document["run"]["warmup"], color="grey", ls=":", lw=0.8)
            goodput_axis.set_title("steady load (dotted: end of warm-up)")
        else:
            phases = next((document[k]["phases"] for k in RECOVERY
                           if "phases" in (document.get(k) or {})), None)
            if phases:
                fail_start, fail_end = phases["failing"]
                end = phases["recovered"][1]
                for axis in (goodput_axis, flight_axis):
                    axis.axvspan(fail_start, fail_end, color="#ffebee", zorder=0)
                flight_axis.hlines([capacity, capacity // 2], [0, fail_end],
                                   [fail_start, end], colors="black", linestyles="--", lw=0.8,
                                   label="capacity")
            goodput_axis.set_title("recovery: fails (shaded), back at half capacity")
        for axis in (goodput_axis, flight_axis):
            axis.set_xlabel("seconds")
        flight_axis.legend(**outside)
        goodput_axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: $REDIS_URL, else spawn redis-server)")
    parser.add_argument("--capacity", type=int, default=8, help="the upstream's C (default 8)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--threads", type=int, default=6,
                        help="calling threads per process (default 6)")
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="seconds per steady scenario; recovery runs take 2x (default 4)")
    parser.add_argument("--base-latency", type=float, default=0.02,
                        help="the upstream's idle latency, seconds (default 0.02)")
    parser.add_argument("--exponent", type=float, default=1.0,
                        help="latency ~ base * (1 + in_flight/C) ** exponent (default 1)")
    parser.add_argument("--adaptive", default="{}", metavar="JSON",
                        help='AdaptiveLimit fields for the adaptive scenarios, e.g. '
                             '\'{"smoothing": 0.2}\' (default: min 1, max 4C, smoothing 0.05, '
                             'the rest the library\'s defaults)')
    parser.add_argument("--only", default="",
                        help=f"comma-separated scenarios (default all: {','.join(SCENARIOS)})")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--series", action="store_true",
                        help="keep the per-scenario time series in the JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw goodput and in-flight over time")
    args = parser.parse_args(argv)
    only = {key.strip() for key in args.only.split(",") if key.strip()}
    unknown = only - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if args.capacity < 2 or args.processes < 1 or args.threads < 1 or args.seconds < 0.5:
        parser.error("need --capacity >= 2, --processes >= 1, --threads >= 1, --seconds >= 0.5")
    if args.plot:
        check_plot_path(args.plot)
    try:
        tuning = json.loads(args.adaptive)
    except ValueError as error:
        parser.error(f"--adaptive: not JSON: {error}")
    if not isinstance(tuning, dict):
        parser.error("--adaptive: want a JSON object of AdaptiveLimit fields")
    options = Options(args.capacity, args.processes, args.threads, args.seconds,
                      args.base_latency, args.exponent, tuple(sorted(tuning.items())))

    def progress(text: str) -> None:
        print(f"  running {text} ...", file=sys.stderr, flush=True)

    started = time.monotonic()
    with bench_redis(args.url) as (url, origin):
        results = run_bench(url, options, only, progress)
    document: dict[str, Any] = {
        "run": {"distbreaker": distbreaker.__version__, "redis": origin,
                "capacity": options.capacity, "processes": options.processes,
                "threads": options.threads, "seconds": options.seconds,
                "warmup": options.warmup, "base_latency": options.base_latency,
                "exponent": options.exponent, "adaptive": dict(options.tuning),
                "wall_seconds":
                round(time.monotonic() - started, 1)},
        **results,
    }
    document["targets"] = targets(document)
    if args.plot:
        plot(document, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if not args.series:
        for value in document.values():
            if isinstance(value, dict):
                value.pop("series", None)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_table(document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
