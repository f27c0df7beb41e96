#!/usr/bin/env python3
"""Pool bench: fleet-wide outlier ejection against per-process ejectors and none.

A simulated pool of ``--members`` members (10), each answering after a latency the
bench draws (lognormal around ``--latency``), is called by a fleet of real worker
processes (``--processes`` x ``--threads``, closed loop: a thread calls again as soon
as its call ends). The members are simulated in the workers, on one shared timeline
(wall clock, so every process agrees on it): after ``--warmup`` seconds one member
goes bad, answering 503 at once for ``--errors`` seconds, then only slow
(``--slow-factor`` x the latency, 200) for ``--slow`` seconds.

Every variant picks a member by power of two choices on in-flight counts among the
members it does not eject, and records each call's outcome. Variants:

- ``fleet``: distbreaker's `Pool` (one fleet-wide health record per member in Redis,
  `max_ejection_percent` enforced by one script);
- ``per_process``: the same rules (consecutive 5xx, latency outliers against the
  pool's median, ejection time growing with the number of ejections, the cap, the
  panic threshold) implemented here per process, as Envoy's outlier detection per
  proxy or LiteLLM's cooldowns per pod do;
- ``none``: no ejection.

Figures per variant (over the time after the member went bad): ``time_to_eject_s``
(until the fleet stops sending to it: for per-process ejectors, until the last process
ejected it; ``time_to_first_eject_s``: the first), ``calls_to_bad_before_eject`` (calls
the fleet sent the bad member between its going bad and its ejection, for each process
its own ejection), ``bad_share_after_eject`` (share of the fleet's calls from the
ejection on that still went to the bad member; ``none``: from its going bad),
``goodput`` (200s within ``--slo`` per second), ``p50_ms``/``p99_ms``, ``errors``.

The ``cap`` scenario: ``--cap-bad`` (6) of the 10 members answer 503 from the warmup
on, ``max_ejection_percent=50``: never more than 5 may be ejected at once, the rest
stay in rotation (panic). ``cap_violations`` counts the moments (reads of the fleet's
ejections every ``POLL`` s, and every ejection event) with more than the cap ejected;
for per-process ejectors the cap is per process (each process's own log), and
``max_ejected_by_any_process`` / ``ejections_above_cap_fleet_wide`` are what the
fleet as a whole had out of rotation at once (members ejected by at least one process).

Usage: ``.venv/bin/python scripts/bench_pool.py [--json] [--processes 8]
[--threads 3] [--only fleet,per_process,none,cap]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import multiprocessing
import queue
import random
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from distbreaker.demo.embedded import bench_redis

VARIANTS = ("fleet", "per_process", "none")
SCENARIOS = (*VARIANTS, "cap")
POLL = 0.01            # how often the parent reads the fleet's ejections (seconds)
BAD = 0                # the member that goes bad in the outlier scenario
LEAD = 0.3             # seconds between "all ready" and the timeline's zero


# -- the rules both ejectors follow ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Rules:
    """Envoy's outlier detection parameters (the subset the bench exercises), with the
    latency rule of distbreaker's Pool (Envoy has none): a member whose mean latency over
    the interval is above `latency_factor` x the median member's mean and above
    `latency_threshold`, judged when at least `latency_minimum_hosts` members had
    `latency_request_volume` calls in the interval."""

    consecutive_5xx: int = 5
    interval: float = 1.0               # seconds between two analyses (Envoy: 10 s)
    base_ejection: float = 2.0          # seconds; x the member's number of ejections
    max_ejection: float = 10.0
    max_ejection_percent: int = 50
    panic_threshold: int = 50           # % of members not ejected below which: route to all
    latency_factor: float = 3.0
    latency_threshold: float = 0.05     # seconds: a mean below it is never an outlier
    latency_minimum_hosts: int = 5
    latency_request_volume: int = 10

    def cap(self, members: int) -> int:
        """Most members ejected at once (Envoy: at least one)."""
        return max(1, members * self.max_ejection_percent // 100)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One run as the workers see it (picklable)."""

    variant: str                  # fleet | per_process | none
    name: str                     # the Pool's name in Redis (fresh per run)
    members: int
    bad: tuple[int, ...]          # members that go bad
    start: float                  # wall clock of the timeline's zero (set when all are ready)
    bad_at: float                 # seconds after start: the bad members fail
    slow_at: float                # ... answer slowly instead (>= end: never)
    end: float                    # seconds after start
    latency: float
    slow_factor: float
    threads: int
    rules: Rules
    seed: int = 0


def member_name(index: int) -> str:
    return f"m{index}"


def answer(spec: Spec, member: int, at: float, rng: random.Random) -> tuple[int, float]:
    """(status, seconds) of a call to `member` started `at` seconds into the timeline."""
    healthy = spec.latency * rng.lognormvariate(0.0, 0.25)
    if member not in spec.bad or at < spec.bad_at:
        return 200, healthy
    if at < spec.slow_at:
        return 503, spec.latency / 10
    return 200, healthy * spec.slow_factor


# -- the ejectors --------------------------------------------------------------------------

class NoEjection:
    """Power of two choices on this process's in-flight counts, nobody ejected."""

    def __init__(self, spec: Spec) -> None:
        self.members = [member_name(i) for i in range(spec.members)]
        self.lock = threading.Lock()
        self.in_flight = dict.fromkeys(self.members, 0)
        self.log: list[tuple[float, str, str, str]] = []   # (wall, member, eject|return, why)

    def routable(self, now: float) -> list[str]:
        return self.members

    def pick(self, rng: random.Random) -> str:
        with self.lock:
            live = self.routable(time.time())
            a, b = rng.sample(live, 2) if len(live) > 1 else (live[0], live[0])
            member = a if self.in_flight[a] <= self.in_flight[b] else b
            self.in_flight[member] += 1
            return member

    def record(self, member: str, status: int, seconds: float) -> None:
        with self.lock:
            self.in_flight[member] -= 1

    def close(self) -> None:
        pass


class LocalEjector(NoEjection):
    """Outlier detection in one process (Envoy per proxy, LiteLLM per pod): the rules of
    `Rules` judged from this process's own calls only. As in Envoy, a member whose
    ejection ended is back in full rotation (no probes)."""

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self.rules = spec.rules
        self.consecutive = dict.fromkeys(self.members, 0)
        self.ejections = dict.fromkeys(self.members, 0)
        self.until: dict[str, float] = {}
        self.interval_start = time.time()
        self.latency = {m: [0, 0.0] for m in self.members}   # this interval: calls, seconds

    def _expire(self, now: float) -> None:
        for member, until in list(self.until.items()):
            if until <= now:
                del self.until[member]
                self.consecutive[member] = 0
                self.log.append((until, member, "return", ""))

    def routable(self, now: float) -> list[str]:
        self._expire(now)
        live = [m for m in self.members if m not in self.until]
        if len(live) * 100 < self.rules.panic_threshold * len(self.members):
            return self.members          # panic: too few left, route to all
        return live

    def record(self, member: str, status: int, seconds: float) -> None:
        with self.lock:
            self.in_flight[member] -= 1
            now = time.time()
            self._expire(now)
            if now - self.interval_start >= self.rules.interval:
                self._analyse(now)
            if member in self.until:
                return                    # a call started before its ejection
            self.consecutive[member] = self.consecutive[member] + 1 if status >= 500 else 0
            self.latency[member][0] += 1
            self.latency[member][1] += seconds
            if self.consecutive[member] >= self.rules.consecutive_5xx:
                self._eject(member, now, "consecutive_5xx")

    def _analyse(self, now: float) -> None:
        """The interval's latency outliers, slowest first, within the cap."""
        rules = self.rules
        means = {m: total / calls for m, (calls, total) in self.latency.items()
                 if m not in self.until and calls >= rules.latency_request_volume and calls}
        if len(means) >= rules.latency_minimum_hosts and means:
            middle = statistics.median(means.values())
            for member in sorted(means, key=means.__getitem__, reverse=True):
                mean = means[member]
                if mean > rules.latency_factor * middle and mean >= rules.latency_threshold:
                    self._eject(member, now, "latency")
        self.interval_start = now
        self.latency = {m: [0, 0.0] for m in self.members}

    def _eject(self, member: str, now: float, why: str) -> None:
        if len(self.until) >= self.rules.cap(len(self.members)):
            return                        # the cap: this one stays in rotation
        self.ejections[member] += 1
        seconds = min(self.rules.max_ejection, self.rules.base_ejection * self.ejections[member])
        self.until[member] = now + seconds
        self.log.append((now, member, "eject", why))


class FleetEjector:
    """distbreaker's Pool: one fleet-wide record per member, picks and outcomes through it."""

    def __init__(self, spec: Spec, url: str) -> None:
        self.log: list[tuple[float, str, str, str]] = []   # the fleet's: read by the parent
        self.pool = make_pool(spec, url)

    def pick(self, rng: random.Random) -> Any:
        return self.pool.pick()

    def record(self, picked: Any, status: int, seconds: float) -> None:
        self.pool.record(picked, status=status, duration=seconds)

    def close(self) -> None:
        self.pool.close()


def make_pool(spec: Spec, url: str) -> Any:
    """The run's Pool (every process builds the same one)."""
    from distbreaker import Pool  # only the fleet variant needs it

    return Pool(spec.name, redis=url, members=[member_name(i) for i in range(spec.members)],
                **pool_options(spec.rules))


def pool_options(rules: Rules) -> dict[str, Any]:
    """`Rules` as the Pool's configuration."""
    return {
        "consecutive_5xx": rules.consecutive_5xx,
        "interval": rules.interval,
        "base_ejection_time": rules.base_ejection,
        "max_ejection_time": rules.max_ejection,
        "max_ejection_percent": rules.max_ejection_percent,
        "healthy_panic_threshold": rules.panic_threshold,
        "latency_factor": rules.latency_factor,
        "latency_threshold": rules.latency_threshold,
        "latency_minimum_hosts": rules.latency_minimum_hosts,
        "latency_request_volume": rules.latency_request_volume,
        "enforcing_success_rate": 0,      # not a rule the per-process ejector follows
        "redis_timeout": 1.0,             # a loaded machine's Redis is not an outage
    }


def member_of(picked: Any) -> str:
    """The member name a pick returned (a name, or an object naming one)."""
    return picked if isinstance(picked, str) else str(getattr(picked, "name", picked))


# -- a worker process -------------------------------------------------------------------------

def call_loop(spec: Spec, ejector: Any, seed: int, calls: list[tuple[float, str, int, float]],
              lock: threading.Lock) -> None:
    """Closed loop until the end: pick, call the simulated member, record."""
    rng = random.Random(seed)
    end = spec.start + spec.end
    mine: list[tuple[float, str, int, float]] = []
    while (now := time.time()) < end:
        picked = ejector.pick(rng)
        member = member_of(picked)
        status, seconds = answer(spec, int(member[1:]), now - spec.start, rng)
        time.sleep(seconds)
        ejector.record(picked, status, seconds)
        mine.append((round(now - spec.start, 5), member, status, round(seconds, 5)))
    with lock:
        calls.extend(mine)


def worker(wid: int, url: str, spec: Spec, commands: Any, out: Any) -> None:
    """One fleet process: its ejector, `spec.threads` calling threads from the start the
    parent sends (once every process is ready), its calls reported."""
    try:
        ejector: Any
        if spec.variant == "fleet":
            ejector = FleetEjector(spec, url)
        elif spec.variant == "per_process":
            ejector = LocalEjector(spec)
        else:
            ejector = NoEjection(spec)
    except Exception as error:  # reported, the run fails with it
        out.put(("failed", wid, repr(error)))
        return
    out.put(("ready", wid))
    spec = dataclasses.replace(spec, start=commands.get())
    time.sleep(max(0.0, spec.start - time.time()))
    calls: list[tuple[float, str, int, float]] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=call_loop, args=(
        spec, ejector, spec.seed * 1000 + wid * 100 + t, calls, lock))
        for t in range(spec.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log = [(round(t - spec.start, 5), m, what, why) for t, m, what, why in ejector.log]
    with contextlib.suppress(Exception):
        ejector.close()
    out.put(("done", wid, {"calls": calls, "log": log}))


# -- the parent ---------------------------------------------------------------------------------

class Poller:
    """Reads which members the fleet has ejected every POLL seconds (fleet variant)."""

    def __init__(self, spec: Spec, url: str) -> None:
        self.spec = spec
        self.url = url
        self.points: list[tuple[float, frozenset[str]]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            read = fleet_reader(self.spec, self.url)
        except Exception as error:
            self.error = repr(error)
            return
        while not self._stop.is_set() and time.time() < self.spec.start + self.spec.end:
            now = time.time()
            if now >= self.spec.start:
                try:
                    self.points.append((round(now - self.spec.start, 4), read()))
                except Exception as error:  # counted, not fatal: a poll is a sample
                    self.error = repr(error)
            time.sleep(POLL)

    def join(self) -> list[tuple[float, frozenset[str]]]:
        self._stop.set()
        self._thread.join(10)
        return self.points


def fleet_reader(spec: Spec, url: str) -> Callable[[], frozenset[str]]:
    """A function returning the members the fleet's Pool has ejected now."""
    pool = make_pool(spec, url)

    def read() -> frozenset[str]:
        return frozenset(m.member for m in pool.status().members if m.ejected)

    return read


def fleet_history(spec: Spec, url: str) -> list[tuple[float, str, str, float, str]]:
    """The pool's events, oldest first: (seconds into the run, member, event, until, why)
    from the pool's stream (`at`: the decision's server milliseconds)."""
    pool = make_pool(spec, url)
    try:
        entries = pool.history(count=100_000)
    finally:
        pool.close()
    out = []
    for entry in reversed(entries):
        at = int(entry.get("at") or entry["id"].split("-")[0]) / 1000 - spec.start
        until = int(entry.get("until") or 0) / 1000 - spec.start
        out.append((round(at, 4), entry.get("member", ""), entry.get("event", ""),
                    round(until, 4), entry.get("why", "")))
    return out


def run(url: str, spec: Spec, processes: int) -> dict[str, Any]:
    """One run: the workers, once all are ready, for the timeline; their calls and logs."""
    context = multiprocessing.get_context("spawn")
    out: Any = context.Queue()
    commands = [context.Queue() for _ in range(processes)]
    workers = [context.Process(target=worker, args=(wid, url, spec, commands[wid], out),
                               daemon=True) for wid in range(processes)]
    for process in workers:
        process.start()
    try:
        for _ in workers:
            message = receive(out, workers, 120)
            if message[0] == "failed":
                raise RuntimeError(f"worker {message[1]}: {message[2]}")
        spec = dataclasses.replace(spec, start=time.time() + LEAD)
        for each in commands:
            each.put(spec.start)
        poller = Poller(spec, url) if spec.variant == "fleet" else None
        reports = []
        for _ in workers:
            message = receive(out, workers, spec.end + 120)
            if message[0] != "done":
                raise RuntimeError(f"worker {message[1]}: {message[2:]}")
            reports.append(message[2])
        polled = poller.join() if poller is not None else []
        if poller is not None and poller.error and not polled:
            raise RuntimeError(f"reading the pool's ejections: {poller.error}")
        history = fleet_history(spec, url) if spec.variant == "fleet" else []
    finally:
        for process in workers:
            process.join(10)
            if process.is_alive():
                process.kill()
    return {"reports": reports, "polled": polled, "history": history}


def receive(out: Any, workers: list[Any], seconds: float) -> Any:
    """The next worker message; a worker that died without one fails the run at once."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=0.5)
        except queue.Empty:
            dead = [p.exitcode for p in workers if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a worker exited with {dead[0]}") from None
    raise RuntimeError("the workers did not answer in time")


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summarize_outlier(spec: Spec, run_: dict[str, Any], slo: float) -> dict[str, Any]:
    """A variant's figures in the outlier scenario."""
    bad = member_name(BAD)
    reports = run_["reports"]
    calls = [c for r in reports for c in r["calls"] if c[0] >= spec.bad_at]
    measured = spec.end - spec.bad_at
    # When each process stopped sending to the bad member (its own ejection, or the fleet's).
    if spec.variant == "fleet":
        fleet = [t for t, m, what, *_ in run_["history"]
                 if m == bad and what == "ejected" and t >= spec.bad_at]
        stops = [fleet[0] if fleet else None] * len(reports)
    elif spec.variant == "per_process":
        stops = [next((t for t, m, what, _ in r["log"]
                       if m == bad and what == "eject" and t >= spec.bad_at), None)
                 for r in reports]
    else:
        stops = [None] * len(reports)
    known = [t for t in stops if t is not None]
    everyone = max(known) if known and len(known) == len(stops) else None
    before = 0
    for report, stop in zip(reports, stops, strict=True):
        limit = stop if stop is not None else spec.slow_at
        before += sum(1 for t, m, _, _ in report["calls"]
                      if m == bad and spec.bad_at <= t < limit)
    since = everyone if everyone is not None else spec.bad_at
    after = [c for c in calls if c[0] >= since]
    latencies = [c[3] for c in calls]
    good = sum(1 for c in calls if c[2] < 500 and c[3] <= slo)
    return {
        "time_to_eject_s": None if everyone is None else round(everyone - spec.bad_at, 3),
        "time_to_first_eject_s": round(min(known) - spec.bad_at, 3) if known else None,
        "processes_that_ejected": len(known),
        "calls_to_bad_before_eject": before,
        "bad_share_after_eject": round(sum(1 for c in after if c[1] == bad)
                                       / max(1, len(after)), 4),
        "calls_to_bad": sum(1 for c in calls if c[1] == bad),
        "goodput": round(good / measured, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "errors": sum(1 for c in calls if c[2] >= 500),
        "calls": len(calls),
        "ejections": ejection_counts(spec, run_),
    }


def ejection_counts(spec: Spec, run_: dict[str, Any]) -> dict[str, dict[str, int]]:
    """How many ejections each member had, by reason (fleet: the pool's events; per
    process: summed over the processes)."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    if spec.variant == "fleet":
        counts.update((m, why) for _, m, what, _, why in run_["history"] if what == "ejected")
    else:
        for report in run_["reports"]:
            counts.update((m, why) for _, m, what, why in report["log"] if what == "eject")
    out: dict[str, dict[str, int]] = {}
    for (member, why), n in sorted(counts.items()):
        out.setdefault(member, {})[why] = n
    return out


def most_ejected(log: list[tuple[float, str, str, str]]) -> int:
    """The most members one process's log had ejected at once."""
    out: set[str] = set()
    peak = 0
    for _, member, what, _ in sorted(log, key=lambda e: (e[0], e[2] != "return")):
        (out.add if what == "eject" else out.discard)(member)
        peak = max(peak, len(out))
    return peak


def most_ejected_anywhere(logs: list[list[tuple[float, str, str, str]]],
                          cap: int) -> tuple[int, int]:
    """(the most members ejected by at least one process at once, how many ejections left
    more than `cap` out fleet-wide): per-process ejectors, seen as the fleet they are."""
    events = sorted(((t, what != "return", w, m) for w, log in enumerate(logs)
                     for t, m, what, _ in log), key=lambda e: (e[0], e[1]))
    out: list[set[str]] = [set() for _ in logs]
    peak = above = 0
    for _, ejects, w, member in events:
        (out[w].add if ejects else out[w].discard)(member)
        now = len(set().union(*out))
        peak = max(peak, now)
        above += ejects and now > cap
    return peak, above


def summarize_cap(spec: Spec, run_: dict[str, Any], slo: float) -> dict[str, Any]:
    """The cap scenario's figures: the most ejected at once, moments above the cap."""
    cap = spec.rules.cap(spec.members)
    bad = {member_name(i) for i in spec.bad}
    calls = [c for r in run_["reports"] for c in r["calls"] if c[0] >= spec.bad_at]
    measured = spec.end - spec.bad_at
    result: dict[str, Any] = {"cap": cap, "bad_members": len(bad)}
    if spec.variant == "fleet":
        polled = run_["polled"]
        sizes = [len(ejected) for _, ejected in polled]
        # Every ejection event: how many were ejected at its moment (the stream's times).
        spans = [(t, until) for t, _, what, until, _ in run_["history"] if what == "ejected"]
        at_events = [sum(1 for t0, t1 in spans if t0 <= t < t1) for t, _ in spans]
        result.update({
            "max_ejected": max([*sizes, *at_events], default=0),
            "cap_violations": sum(1 for n in [*sizes, *at_events] if n > cap),
            "reads": len(sizes),
            "ejection_events": len(spans),
            "capped_events": sum(1 for _, _, what, *_ in run_["history"] if what == "capped"),
            "distinct_ejected": len(frozenset().union(*(e for _, e in polled))),
            "healthy_ever_ejected": sorted(
                frozenset().union(*(e for _, e in polled)) - bad),
        })
    else:
        peaks = [most_ejected(r["log"]) for r in run_["reports"]]
        anywhere = most_ejected_anywhere([r["log"] for r in run_["reports"]], cap)
        ejected = {m for r in run_["reports"] for _, m, what, _ in r["log"] if what == "eject"}
        result.update({"max_ejected": max(peaks, default=0),
                       "cap_violations": sum(1 for p in peaks if p > cap),
                       "max_ejected_by_any_process": anywhere[0],
                       "ejections_above_cap_fleet_wide": anywhere[1],
                       "distinct_ejected": len(ejected),
                       "healthy_ever_ejected": sorted(ejected - bad)})
    result.update({
        "bad_share": round(sum(1 for c in calls if c[1] in bad) / max(1, len(calls)), 4),
        "goodput": round(sum(1 for c in calls if c[2] < 500 and c[3] <= slo) / measured, 1),
        "errors": sum(1 for c in calls if c[2] >= 500),
        "calls": len(calls),
    })
    return result


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each True/False (None: a variant did not run)."""
    fleet, local = results.get("fleet"), results.get("per_process")
    cap = results.get("cap", {}).get("fleet")
    calls_ratio = (ratio(fleet["calls_to_bad_before_eject"], local["calls_to_bad_before_eject"])
                   if fleet and local and "error" not in fleet and "error" not in local
                   else None)
    met = {
        "ejected_within_quarter_of_per_process_calls":
            None if calls_ratio is None else calls_ratio <= 0.25,
        "bad_share_after_eject_le_1pct":
            None if not fleet or "error" in fleet else fleet["bad_share_after_eject"] <= 0.01,
        "zero_cap_violations": None if not cap or "error" in cap
        else cap["cap_violations"] == 0 and cap["max_ejected"] <= cap["cap"],
    }
    return {"calls_to_bad_fleet_over_per_process": calls_ratio, "met": met}


def compare(results: dict[str, Any]) -> dict[str, Any]:
    """distbreaker's figures over the others' (the README's ratios)."""
    fleet = results.get("fleet")
    out: dict[str, Any] = {}
    if not fleet or "error" in fleet:
        return out
    for other in ("per_process", "none"):
        theirs = results.get(other)
        if not theirs or "error" in theirs:
            continue
        out[f"fleet_vs_{other}"] = {
            "calls_to_bad_before_eject": ratio(fleet["calls_to_bad_before_eject"],
                                               theirs["calls_to_bad_before_eject"]),
            "calls_to_bad": ratio(fleet["calls_to_bad"], theirs["calls_to_bad"]),
            "errors": ratio(fleet["errors"], theirs["errors"]),
            "goodput": ratio(fleet["goodput"], theirs["goodput"]),
            "p99_ms": ratio(fleet["p99_ms"], theirs["p99_ms"]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="Redis URL (default $REDIS_URL, else a spawned server)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.02, help="healthy latency (s)")
    parser.add_argument("--slow-factor", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--errors", type=float, default=2.0, help="seconds of 503s")
    parser.add_argument("--slow", type=float, default=6.0, help="seconds slow after them")
    parser.add_argument("--slo", type=float, default=0.1, help="goodput's latency bound (s)")
    parser.add_argument("--base-ejection", type=float, default=2.0)
    parser.add_argument("--max-ejection", type=float, default=10.0)
    parser.add_argument("--cap-bad", type=int, default=6)
    parser.add_argument("--cap-seconds", type=float, default=3.0)
    parser.add_argument("--only", default="", help=f"comma-separated of {', '.join(SCENARIOS)}")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if not 1 <= args.cap_bad <= args.members or args.members < 2:
        parser.error("need --members >= 2 and 1 <= --cap-bad <= --members")
    rules = Rules(base_ejection=args.base_ejection, max_ejection=args.max_ejection)
    tag = secrets.token_hex(3)

    def progress(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        url, origin = stack.enter_context(bench_redis(args.url))
        for variant in VARIANTS:
            if only and variant not in only:
                continue
            progress(f"outlier: {variant}")
            end = args.warmup + args.errors + args.slow
            spec = Spec(variant, f"bpool-{tag}-{variant}", args.members, (BAD,),
                        0.0, args.warmup, args.warmup + args.errors, end,
                        args.latency, args.slow_factor, args.threads, rules, args.seed)
            try:
                results[variant] = summarize_outlier(spec, run(url, spec, args.processes),
                                                     args.slo)
            except Exception as error:
                results[variant] = {"error": str(error)}
        if not only or "cap" in only:
            cap: dict[str, Any] = {}
            for variant in ("fleet", "per_process"):
                progress(f"cap: {variant}")
                end = args.warmup + args.cap_seconds
                spec = Spec(variant, f"bpool-{tag}-cap-{variant}", args.members,
                            tuple(range(args.cap_bad)), 0.0, args.warmup,
                            end, end, args.latency, args.slow_factor, args.threads, rules,
                            args.seed)
                try:
                    cap[variant] = summarize_cap(spec, run(url, spec, args.processes),
                                                 args.slo)
                except Exception as error:
                    cap[variant] = {"error": str(error)}
            results["cap"] = cap
        cleanup(url, tag)
    doc = {
        "run": {"members": args.members, "processes": args.processes,
                "threads": args.threads, "latency_ms": args.latency * 1000,
                "slow_factor": args.slow_factor, "warmup_s": args.warmup,
                "errors_s": args.errors, "slow_s": args.slow, "slo_ms": args.slo * 1000,
                "cap_bad": args.cap_bad, "rules": dataclasses.asdict(rules),
                "redis": origin},
        **results,
        "ratios": compare(results),
        "targets": targets(results),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_table(doc)
    return 0


def cleanup(url: str, tag: str) -> None:
    """The bench's keys are deleted (they have TTLs too)."""
    client = redis.Redis.from_url(url)
    with contextlib.suppress(redis.RedisError):
        for key in client.scan_iter(match=f"*bpool-{tag}*", count=1000):
            client.delete(key)
    client.close()


def print_table(doc: dict[str, Any]) -> None:
    fields = ("time_to_eject_s", "calls_to_bad_before_eject", "bad_share_after_eject",
              "goodput", "p99_ms", "errors")
    print(f"{'variant':<12}" + "".join(f"{f:>28}" for f in fields))
    for variant in VARIANTS:
        row = doc.get(variant)
        if row is None:
            continue
        if "error" in row:
            print(f"{variant:<12}  {row['error']}")
            continue
        print(f"{variant:<12}" + "".join(f"{row[f]!s:>28}" for f in fields))
    for variant, row in doc.get("cap", {}).items():
        print(f"cap {variant}: {row}")
    print(json.dumps({"ratios": doc["ratios"], "targets": doc["targets"]}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
