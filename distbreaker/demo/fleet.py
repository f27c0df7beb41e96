"""The fleet demo: one shared breaker vs. naive retries, against a flaky upstream.

Run it with ``./scripts/demo``, ``distbreaker demo`` or ``python -m distbreaker.demo``.
It starts an embedded Redis (``redis-server`` on a free port, else an
in-process fakeredis TCP server; ``$REDIS_URL`` overrides), two flaky HTTP
upstreams following the same timeline (``python -m distbreaker.demo.upstream``:
ok -> failing -> slow -> recovering) and two fleets of worker processes that
send the same stream of user requests at the same time:

- WITH distbreaker: each request goes through one `distbreaker.Policy`
  (retry with a fleet-wide budget, circuit breaker, bulkhead), shared by the
  fleet through Redis;
- WITHOUT: the same request through three naive retry layers (HTTP client,
  service helper, job), 3 attempts each: up to 27 upstream calls per request.

It prints a live per-second timeline (the state each worker sees, requests,
rejections, calls that reached each upstream), the fleet-wide transitions and
a table comparing upstream load and user-visible latency per phase.
``--json`` prints the result as JSON on stdout (the timeline goes to stderr);
``--plot FILE.png`` draws the timeline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import queue
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from typing import IO, Any

import redis

from .._runtime.keys import DEFAULT_PREFIX, BudgetKeys, BulkheadKeys
from ..breaker.config import BreakerConfig
from ..breaker.events import Transition
from ..breaker.state import State
from ..breaker.sync import CircuitBreaker
from ..budget.config import BudgetConfig
from ..bulkhead.config import BulkheadConfig
from ..errors import BulkheadFull, CallNotPermitted
from ..policy.sync import Policy
from ..retry.config import RetryConfig
from .embedded import embedded_redis
from .httpserver import ServerProcess
from .upstream import Timeline

NAME = "payments"
WORKERS = 4
DURATION = 30.0
PROBES = 3
INTERVAL = 0.1          # one user request per worker every 100 ms (when it keeps up)
HTTP_TIMEOUT = 2.0
LATENCY = 0.02          # the upstream's answer time, ok or failing
SLOW_LATENCY = 1.0      # its answer time in the slow phase
NAIVE_LAYERS = ((3, 0.0), (3, 0.01), (3, 0.02))   # (attempts, pause) from the inside out
FRACTIONS = (("ok", 0.2), ("failing", 0.35), ("slow", 0.2), ("recovering", 0.25))
LETTERS = {"CLOSED": "C", "OPEN": "O", "HALF_OPEN": "H", "FORCED_OPEN": "F",
           "DISABLED": "D", "METRICS_ONLY": "M"}


# -- what the two fleets run ---------------------------------------------------------

def timeline_for(duration: float) -> Timeline:
    """The upstream's phases for a run of `duration` seconds."""
    return Timeline.parse(",".join(f"{mode}:{duration * share:.3f}"
                                   for mode, share in FRACTIONS))


def breaker_config(duration: float) -> BreakerConfig:
    """Trips at 50% failures or slow calls over the last 20 calls (10 at least)."""
    return BreakerConfig(sliding_window_type="COUNT_BASED", sliding_window_size=20,
                         minimum_number_of_calls=10, failure_rate_threshold=50,
                         slow_call_rate_threshold=50, slow_call_duration=SLOW_LATENCY / 2,
                         wait_duration_in_open_state=max(0.5, duration / 10),
                         permitted_calls_in_half_open=PROBES, half_open_lease=5.0,
                         redis_timeout=2.0)  # generous: the server may be fakeredis


def build_policy(name: str, url: str, workers: int, duration: float,
                 prefix: str = DEFAULT_PREFIX) -> Policy:
    """The policy every WITH worker uses: retry (budgeted), breaker, bulkhead."""
    return Policy(
        name, redis=url, prefix=prefix, redis_timeout=2.0,
        breaker=breaker_config(duration),
        bulkhead=BulkheadConfig(max_concurrent_calls=workers,
                                max_wait_duration=0.1, lease=10.0,
                                expected_workers=workers, redis_timeout=2.0),
        retry=RetryConfig(max_attempts=3, base=0.05, cap=0.2),
        budget=BudgetConfig(percent_can_retry=0.2, min_retries_per_sec=1.0, ttl=10.0,
                            redis_timeout=2.0))


@dataclasses.dataclass(frozen=True)
class Response:
    """What the HTTP call returns: enough for `Policy` to classify it."""

    status_code: int
    headers: dict[str, str]


def http_get(url: str, timeout: float = HTTP_TIMEOUT) -> Response:
    """One GET that returns the status (a 503 is a result here, not an exception)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            reply.read()
            return Response(reply.status, dict(reply.headers.items()))
    except urllib.error.HTTPError as error:
        error.read()
        return Response(error.code, dict(error.headers.items()))


def naive_retry(fn: Callable[[], Response], attempts: int, pause: float) -> Response:
    """The retry layer found everywhere: try again on 5xx or an exception, no budget."""
    for attempt in range(1, attempts + 1):
        try:
            response = fn()
        except Exception:
            if attempt == attempts:
                raise
        else:
            if response.status_code < 500 or attempt == attempts:
                return response
        time.sleep(pause)
    raise AssertionError("unreachable")


def naive_layers(fn: Callable[[], Response]) -> Response:
    """HTTP client retry inside a service helper's retry inside a job's retry."""
    call = fn
    for attempts, pause in NAIVE_LAYERS:
        call = _layer(call, attempts, pause)
    return call()


def _layer(fn: Callable[[], Response], attempts: int, pause: float) -> Callable[[], Response]:
    return lambda: naive_retry(fn, attempts, pause)


def local_view(policy: Policy) -> str:
    """The breaker state this process last learned from Redis (its local view).

    It is what decides, in this process, whether the next call asks Redis, fails
    fast or goes ahead.
    """
    view = policy.breaker.local_view if policy.breaker is not None else None
    return view.value if isinstance(view, State) else "?"


# -- worker processes ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WorkerArgs:
    """What a spawned worker needs (picklable)."""

    fleet: str              # "with" or "without"
    wid: int
    upstream: str
    redis_url: str
    name: str
    prefix: str
    workers: int
    duration: float


def worker(args: WorkerArgs, go: Any, stop: Any, out: Any) -> None:
    """Send user requests every INTERVAL until told to stop; report each one.

    Each report: fleet, worker, start, end (wall clock), outcome (ok, error,
    rejected, bulkhead), the breaker state this worker saw, upstream calls made.
    """
    calls = [0]
    target = args.upstream + "/charge"

    def call_upstream() -> Response:
        calls[0] += 1
        return http_get(target)

    policy = None
    if args.fleet == "with":
        policy = build_policy(args.name, args.redis_url, args.workers, args.duration,
                              args.prefix)

        def made(event: Transition) -> None:
            out.put(("made", args.wid, event.from_state.value, event.to_state.value,
                     event.at_ms))

        policy.breaker.add_listener(made)
    out.put(("ready", args.fleet, args.wid))
    go.wait()
    next_at = time.time()
    while not stop.is_set():
        calls[0] = 0
        started = time.time()
        outcome, state = "ok", "-"
        try:
            if policy is not None:
                policy.call(call_upstream)
            else:
                response = naive_layers(call_upstream)
                if response.status_code >= 500:
                    outcome = "error"
        except CallNotPermitted as rejection:
            outcome, state = "rejected", str(getattr(rejection.state, "value",
                                                     rejection.state))
        except BulkheadFull:
            outcome = "bulkhead"
        except Exception:
            outcome = "error"
        if policy is not None and state == "-":
            state = local_view(policy)
        out.put(("req", args.fleet, args.wid, started, time.time(), outcome, state, calls[0]))
        next_at = max(next_at + INTERVAL, time.time() - INTERVAL)
        stop.wait(max(0.0, next_at - time.time()))


# -- the coordinator ------------------------------------------------------------------

def server_kind(url_given: bool) -> str:
    if url_given:
        return "REDIS_URL"
    return "redis-server" if shutil.which("redis-server") else "fakeredis TCP server"


def listen(url: str, channel: str, name: str, out: Any, stop: threading.Event) -> None:
    """Forward this breaker's fleet-wide transitions from pub/sub to the coordinator.

    The periodic PING also makes fakeredis' TCP server flush pending messages.
    """
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    out.put(("subscribed",))
    while not stop.is_set():
        pubsub.ping()
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.02)
            if message is None or message.get("type") != "message":
                continue
            event = json.loads(message["data"])
            if event.get("name") == name:
                out.put(("heard", event))
    pubsub.close()
    client.close()


class UpstreamProcess(ServerProcess):
    """``python -m distbreaker.demo.upstream`` in a subprocess (as docker-compose runs it)."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__("distbreaker.demo.upstream",
                         ["--timeline", str(timeline), "--latency", str(LATENCY),
                          "--slow-latency", str(SLOW_LATENCY)])

    def restart(self) -> None:
        self.post("/restart")


@dataclasses.dataclass
class Request:
    """One user request, as a worker reported it (times relative to the start)."""

    fleet: str
    wid: int
    start: float
    end: float
    outcome: str
    state: str
    calls: int

    @property
    def latency(self) -> float:
        return self.end - self.start


def worker_context() -> Any:
    """Fresh worker processes (no inherited Redis connections or threads), started fast.

    A fork server that imported this module once forks each worker; spawn where
    there is none (each worker then imports distbreaker itself).
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        return context
    return multiprocessing.get_context("spawn")


class Demo:
    """Starts both fleets and upstreams, prints the live timeline, builds the result."""

    def __init__(self, url: str, workers: int, duration: float, name: str,
                 prefix: str = DEFAULT_PREFIX, stream: IO[str] | None = None) -> None:
        self.url, self.workers, self.duration = url, workers, duration
        self.name, self.prefix = name, prefix
        self.stream = stream or sys.stdout
        self.timeline = timeline_for(duration)
        self.config = breaker_config(duration)
        self.ctx = worker_context()
        self.out: Any = self.ctx.Queue()
        self.go = self.ctx.Event()
        self.stop = self.ctx.Event()
        self.t0 = 0.0
        self.requests: list[Request] = []
        self.made: dict[tuple[str, str, int], int] = {}   # (from, to, at_ms) -> worker
        self.heard: list[dict[str, Any]] = []
        self.stats: dict[str, dict[str, Any]] = {}
        self.printed_events = 0
        self.extended = 0.0

    def say(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    # -- collecting ---------------------------------------------------------------
    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                message = self.out.get(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            self.take(message)

    def take(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "req":
            _, fleet, wid, start, end, outcome, state, calls = message
            self.requests.append(Request(fleet, wid, start - self.t0, end - self.t0,
                                         outcome, state, calls))
        elif kind == "made":
            _, wid, src, dst, at_ms = message
            self.made[(src, dst, at_ms)] = wid
        elif kind == "heard":
            self.heard.append(message[1])

    # -- the run ---------------------------------------------------------------------
    def reset_keys(self, admin: CircuitBreaker) -> None:
        admin.reset("demo start", actor="demo")
        client = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            client.delete(*dataclasses.astuple(BulkheadKeys.build(self.name, self.prefix)),
                          BudgetKeys.build(self.name, self.prefix).slices)
        finally:
            client.close()

    def run(self) -> dict[str, Any]:
        admin = CircuitBreaker(self.name, redis=self.url, config=self.config,
                               prefix=self.prefix)
        self.reset_keys(admin)
        began = time.monotonic()
        upstreams = {fleet: UpstreamProcess(self.timeline) for fleet in ("with", "without")}
        listening = threading.Event()
        listener = threading.Thread(target=listen, daemon=True, args=(
            self.url, admin.keys.channel, self.name, self.out, listening))
        procs = [self.ctx.Process(target=worker, daemon=True, args=(
            WorkerArgs(fleet, wid, upstreams[fleet].url, self.url, self.name, self.prefix,
                       self.workers, self.duration), self.go, self.stop, self.out))
            for fleet in ("with", "without") for wid in range(1, self.workers + 1)]
        try:
            for upstream in upstreams.values():
                upstream.wait_ready()
            listener.start()
            for proc in procs:
                proc.start()
            self.wait_ready(len(procs) + 1)
            self.say(f"{len(procs)} worker processes ready after "
                     f"{time.monotonic() - began:.1f}s")
            for upstream in upstreams.values():
                upstream.restart()
            self.t0 = time.time()
            self.go.set()
            self.header()
            self.live(admin, upstreams)
            self.stop.set()
            for proc in procs:
                proc.join(10)
            self.drain(0.3)
            self.stats = {fleet: u.get("/stats") for fleet, u in upstreams.items()}
            final = admin.state
        finally:
            self.stop.set()
            self.go.set()
            listening.set()
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
            for upstream in upstreams.values():
                upstream.stop()
            if listener.is_alive():
                listener.join(2)
        return self.result(final)

    def wait_ready(self, expected: int) -> None:
        ready, deadline = 0, time.monotonic() + 60
        while ready < expected and time.monotonic() < deadline:
            try:
                message = self.out.get(timeout=0.5)
            except queue.Empty:
                continue
            ready += message[0] in ("ready", "subscribed")
        if ready < expected:
            raise RuntimeError("the worker processes did not start in time")

    def live(self, admin: CircuitBreaker, upstreams: dict[str, UpstreamProcess]) -> None:
        """Print one line per second; run on (up to 5 s) until the breaker has closed."""
        second = 0
        end = self.duration
        while True:
            self.drain(max(0.0, self.t0 + second + 1.25 - time.time()))
            stats = {fleet: u.get("/stats") for fleet, u in upstreams.items()}
            self.print_events(second + 1)
            self.say(self.line(second, stats))
            second += 1
            if second >= end:
                if admin.state is State.CLOSED or second >= self.duration + 5:
                    break
                end = second + 1
        self.extended = max(0.0, second - self.duration)

    # -- the live timeline -------------------------------------------------------------
    def header(self) -> None:
        width = max(4, self.workers)
        title = "WITH distbreaker (one Policy in Redis)".ljust(width + 27)
        self.say(f"\n{'':>4}  {'upstream':15} | {title} | WITHOUT (3 retry layers x 3)")
        self.say(f"{'t':>4}  {'phase':15} | {'seen':{width}} "
                 f"{'req':>4} {'ok':>4} {'rej':>4} {'err':>4} {'calls':>6} | "
                 f"{'req':>4} {'ok':>4} {'err':>4} {'calls':>6}")

    def phase_label(self, second: int) -> str:
        """The upstream's phase in that second ("a>b" when it changed within it)."""
        first, last = self.phase_of(second), self.phase_of(second + 0.999)
        return first if first == last else f"{first}>{last}"

    def line(self, second: int, stats: dict[str, dict[str, Any]]) -> str:
        mode = self.phase_label(second)
        done = [r for r in self.requests if second <= r.end < second + 1]
        seen = ""
        for wid in range(1, self.workers + 1):
            mine = [r for r in done if r.fleet == "with" and r.wid == wid]
            seen += LETTERS.get(mine[-1].state, "?") if mine else "."
        cells = []
        for fleet in ("with", "without"):
            rows = [r for r in done if r.fleet == fleet]
            count = Counter(r.outcome for r in rows)
            calls = sum(stats[fleet]["per_second"].get(str(second), {}).values())
            rejected = count["rejected"] + count["bulkhead"]
            if fleet == "with":
                cells.append(f"{seen:{max(4, self.workers)}} {len(rows):4} {count['ok']:4} "
                             f"{rejected:4} {count['error']:4} {calls:6}")
            else:
                cells.append(f"{len(rows):4} {count['ok']:4} {count['error']:4} {calls:6}")
        return f"{second:3}s  {mode:15} | " + " | ".join(cells)

    def print_events(self, until: float) -> None:
        """Print the fleet-wide transitions made before `until`, in order, once each."""
        events = sorted(self.heard, key=lambda e: e["at_ms"])
        for event in events[self.printed_events:]:
            at = event["at_ms"] / 1000 - self.t0
            if at >= until:
                break
            self.printed_events += 1
            by = self.made.get((event["from"], event["to"], event["at_ms"]))
            self.say(f"      {at:6.2f}s  *** {event['from']} -> {event['to']}"
                     f" ({event['reason']}) by worker {by if by else '?'}, seen on pub/sub")

    # -- the result ----------------------------------------------------------------------
    def phase_of(self, t: float) -> str:
        return self.timeline.mode_at(t) if t < self.duration else self.timeline.phases[-1].mode

    def result(self, final: State) -> dict[str, Any]:
        transitions = [{"from": e["from"], "to": e["to"], "reason": e["reason"],
                        "t": round(e["at_ms"] / 1000 - self.t0, 3),
                        "by_worker": self.made.get((e["from"], e["to"], e["at_ms"]))}
                       for e in self.heard]
        phases: dict[str, dict[str, Any]] = {}
        for mode, _, _ in self.timeline.bounds():
            phases[mode] = {fleet: self.phase_numbers(mode, fleet)
                            for fleet in ("with", "without")}
        seconds = self.per_second()
        open_rejections = sorted({r.wid for r in self.requests if r.fleet == "with"
                                  and r.outcome == "rejected" and r.state == "OPEN"})
        steps = [(t["from"], t["to"]) for t in transitions]
        failing = phases.get("failing", {})
        with_calls = failing.get("with", {}).get("upstream_calls", 0)
        without_calls = failing.get("without", {}).get("upstream_calls", 0)
        checks = {
            "tripped_once": steps.count(("CLOSED", "OPEN")) == 1,
            "all_workers_rejected_while_open": open_rejections == list(
                range(1, self.workers + 1)),
            "fewer_upstream_calls": with_calls * 3 <= without_calls and without_calls > 0,
            "recovered": final is State.CLOSED and bool(steps) and
            steps[-1] == ("HALF_OPEN", "CLOSED"),
        }
        return {
            "breaker": self.name, "workers": self.workers, "duration": self.duration,
            "extended": self.extended, "interval": INTERVAL,
            "timeline": [[m, round(a, 3), round(b, 3)] for m, a, b in self.timeline.bounds()],
            "config": {"sliding_window_size": self.config.sliding_window_size,
                       "minimum_number_of_calls": self.config.minimum_number_of_calls,
                       "failure_rate_threshold": self.config.failure_rate_threshold,
                       "slow_call_duration": self.config.slow_call_duration,
                       "wait_duration_in_open_state":
                           self.config.wait_duration_in_open_state,
                       "permitted_calls_in_half_open": PROBES,
                       "naive_layers": [list(layer) for layer in NAIVE_LAYERS]},
            "final_state": final.value, "transitions": transitions,
            "workers_rejected_while_open": open_rejections,
            "phases": phases, "seconds": seconds,
            "upstream": {fleet: {"calls": s["calls"], "max_in_flight": s["max_in_flight"],
                                 "by_mode": s["by_mode"]} for fleet, s in self.stats.items()},
            "checks": checks, "ok": all(checks.values()),
        }

    def phase_numbers(self, mode: str, fleet: str) -> dict[str, Any]:
        rows = [r for r in self.requests if r.fleet == fleet and self.phase_of(r.start) == mode]
        count = Counter(r.outcome for r in rows)
        upstream = sum(self.stats.get(fleet, {}).get("by_mode", {}).get(mode, {}).values())
        latencies = sorted(r.latency for r in rows)
        return {"requests": len(rows), "ok": count["ok"], "errors": count["error"],
                "rejected": count["rejected"], "bulkhead": count["bulkhead"],
                "upstream_calls": upstream,
                "calls_per_request": round(upstream / len(rows), 2) if rows else 0.0,
                "max_calls_per_request": max((r.calls for r in rows), default=0),
                "calls_per_error": sorted({r.calls for r in rows if r.outcome == "error"}),
                "latency_ms": {"p50": ms(percentile(latencies, 50)),
                               "p95": ms(percentile(latencies, 95)),
                               "max": ms(latencies[-1] if latencies else 0.0)}}

    def per_second(self) -> list[dict[str, Any]]:
        out = []
        last = max([self.duration + self.extended] + [r.end for r in self.requests])
        for second in range(math.ceil(last)):
            entry: dict[str, Any] = {"t": second, "mode": self.phase_label(second)}
            for fleet in ("with", "without"):
                rows = [r for r in self.requests if r.fleet == fleet
                        and second <= r.end < second + 1]
                count = Counter(r.outcome for r in rows)
                per_second = self.stats.get(fleet, {}).get("per_second", {})
                entry[fleet] = {"requests": len(rows), "ok": count["ok"],
                                "errors": count["error"],
                                "rejected": count["rejected"] + count["bulkhead"],
                                "upstream_calls": sum(per_second.get(str(second), {}).values())}
                if fleet == "with":
                    states = {}
                    for row in rows:
                        states[str(row.wid)] = row.state
                    entry[fleet]["states"] = states
            out.append(entry)
        return out


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of sorted `values` (0 when empty)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(pct / 100 * len(values)) - 1))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


# -- the final table ----------------------------------------------------------------------

def table_lines(result: dict[str, Any]) -> Iterator[str]:
    yield ""
    yield "fleet-wide transitions (one script call made each; every process heard it):"
    for t in result["transitions"]:
        yield (f"  {t['t']:6.2f}s  {t['from']:>9} -> {t['to']:9} by worker "
               f"{t['by_worker'] or '?'}  ({t['reason']})")
    yield ""
    yield (f"{'phase':11}{'fleet':9}{'requests':>9}{'ok':>6}{'rejected':>9}{'errors':>7}"
           f"{'upstream':>10}{'per req':>8}{'p50 ms':>9}{'p95 ms':>9}")
    for mode, fleets in result["phases"].items():
        for fleet, n in fleets.items():
            label = mode if fleet == "with" else ""
            yield (f"{label:11}{fleet:9}{n['requests']:9}{n['ok']:6}"
                   f"{n['rejected'] + n['bulkhead']:9}{n['errors']:7}{n['upstream_calls']:10}"
                   f"{n['calls_per_request']:8.2f}{n['latency_ms']['p50']:9.0f}"
                   f"{n['latency_ms']['p95']:9.0f}")
    yield ""
    yield "what each phase shows (WITH distbreaker vs WITHOUT, the same requests):"
    for mode, fleets in result["phases"].items():
        yield "  " + phase_tradeoff(mode, fleets["with"], fleets["without"])
    failing = result["phases"].get("failing")
    if failing:
        w, wo = failing["with"], failing["without"]
        worst = math.prod(a for a, _ in NAIVE_LAYERS)
        factor = wo["upstream_calls"] / max(1, w["upstream_calls"])
        yield ""
        yield (f"failing phase: WITHOUT, {wo['requests']} user requests became "
               f"{wo['upstream_calls']} upstream calls (up to {worst} each: 50 requests can "
               f"become {50 * worst:,}); WITH distbreaker the whole fleet sent "
               f"{w['upstream_calls']} (about the breaker's minimum of "
               f"{result['config']['minimum_number_of_calls']} calls, then probes): "
               f"{factor:.0f}x fewer. Users waited p50 {w['latency_ms']['p50']:.0f} ms "
               f"(rejected at once) instead of {wo['latency_ms']['p50']:.0f} ms "
               f"for an error.")
    yield ""
    yield "checks: " + ", ".join(f"{k}={'yes' if v else 'NO'}"
                                 for k, v in result["checks"].items())


def phase_tradeoff(mode: str, w: dict[str, Any], wo: dict[str, Any]) -> str:
    """One line: what the breaker bought and what it cost in this phase."""
    rejected = w["rejected"] + w["bulkhead"]
    p50, naive_p50 = w["latency_ms"]["p50"], wo["latency_ms"]["p50"]
    if mode == "ok":
        return (f"ok:         both served all ({w['ok']}/{w['requests']}, {wo['ok']}/"
                f"{wo['requests']}; p50 {p50:.0f} vs {naive_p50:.0f} ms): a healthy upstream "
                "costs one Redis round trip per call.")
    if mode == "failing":
        return (f"failing:    WITH rejected {rejected} of {w['requests']} at once and sent "
                f"{w['upstream_calls']} calls; WITHOUT got {wo['errors']} errors for "
                f"{wo['upstream_calls']:,} calls (p50 {naive_p50:.0f} ms): fail fast, spare "
                "the upstream.")
    if mode == "slow":
        return (f"slow:       WITH rejected {rejected} of {w['requests']} in {p50:.0f} ms; "
                f"WITHOUT served {wo['ok']} of {wo['requests']}, slowly (p50 "
                f"{naive_p50:.0f} ms): fast refusals instead of slow answers.")
    if mode == "recovering":
        return (f"recovering: WITH served {w['ok']} of {w['requests']} once its probes "
                f"closed it, WITHOUT {wo['ok']} of {wo['requests']}: a few probes test the "
                "upstream first, at the price of some rejections.")
    return (f"{mode}: WITH served {w['ok']} of {w['requests']} ({rejected} rejected); "
            f"WITHOUT served {wo['ok']} of {wo['requests']} ({wo['errors']} errors).")


# -- the plot ----------------------------------------------------------------------------

STATE_COLOURS = {"CLOSED": "#2ca02c", "HALF_OPEN": "#ff7f0e", "OPEN": "#d62728"}
PHASE_COLOURS = {"ok": "#e8f5e9", "failing": "#ffebee", "slow": "#fff8e1",
                 "recovering": "#e3f2fd"}


def check_plot_path(path: str) -> None:
    """Fail before the demo runs (not after ~25 s) when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib "
                         "(or, in a distbreaker checkout: pip install '.[plot]')") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SystemExit(f"--plot {path}: cannot write into {folder}")


def plot(result: dict[str, Any], requests: list[Request], path: str) -> None:
    """Draw upstream load, the state each worker saw and user latency over time
    (successes, errors and rejections apart); legends sit outside the data."""
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = result["workers"]
    fig, (load, states, latency) = plt.subplots(
        3, 1, figsize=(13, 8.5), sharex=True, gridspec_kw={"height_ratios": [3, 2, 3]})
    outside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
    for axis in (load, states, latency):
        for mode, start, end in result["timeline"]:
            axis.axvspan(start, end, color=PHASE_COLOURS.get(mode, "#eeeeee"), zorder=0)
    for mode, start, end in result["timeline"]:
        load.text((start + end) / 2, 1.02, mode, transform=load.get_xaxis_transform(),
                  ha="center", va="bottom", fontsize=10)

    seconds = [s["t"] + 0.5 for s in result["seconds"]]
    for fleet, colour, label in (("without", "#d62728", "WITHOUT: 3 naive retry layers"),
                                 ("with", "#1f77b4", "WITH distbreaker")):
        calls = [s[fleet]["upstream_calls"] for s in result["seconds"]]
        failing = result["phases"].get("failing", {}).get(fleet, {}).get("upstream_calls", 0)
        load.step(seconds, calls, where="mid", color=colour, lw=2,
                  label=f"{label} ({failing:,} calls while failing)")
    load.set_ylabel("calls reaching the\nupstream per second")
    load.set_yscale("symlog", linthresh=10)
    peak = max((s[f]["upstream_calls"] for s in result["seconds"] for f in ("with", "without")),
               default=10)
    load.set_ylim(0, max(peak, 10) * 2)
    load.legend(fontsize=8, **outside)
    load.set_title(f"distbreaker demo: {workers} worker processes per fleet, "
                   f"one request per worker every {int(INTERVAL * 1000)} ms", pad=18)

    for state, colour in STATE_COLOURS.items():
        xs = [r.end for r in requests if r.fleet == "with" and r.state == state]
        ys = [r.wid for r in requests if r.fleet == "with" and r.state == state]
        states.scatter(xs, ys, s=14, marker="|", color=colour, label=state, zorder=2)
    for t in result["transitions"]:
        states.axvline(t["t"], color=STATE_COLOURS.get(t["to"], "grey"), lw=0.8, ls="--",
                       zorder=1)
    states.set_yticks(range(1, workers + 1))
    states.set_ylim(0.4, workers + 0.6)
    states.set_ylabel("state seen by\neach WITH worker")
    states.legend(fontsize=8, title="state", title_fontsize=8, **outside)

    marks = {"ok": ("o", "served"), "error": ("^", "error"), "rejected": ("x", "rejected"),
             "bulkhead": ("x", "rejected")}
    for fleet, colour, label in (("without", "#d62728", "WITHOUT"),
                                 ("with", "#1f77b4", "WITH")):
        for outcome in ("ok", "error", "rejected"):
            rows = [r for r in requests if r.fleet == fleet
                    and marks.get(r.outcome, ("o", ""))[1] == marks[outcome][1]]
            if not rows:
                continue
            marker = marks[outcome][0]
            latency.scatter([r.start for r in rows],
                            [max(r.latency * 1000, 0.1) for r in rows], s=14 if marker == "x"
                            else 7, marker=marker, color=colour,
                            alpha=0.8 if marker == "x" else 0.5, linewidths=0.8,
                            label=f"{label}: {marks[outcome][1]} ({len(rows)})", zorder=2)
    if requests:
        latency.set_yscale("log")
    latency.set_ylabel("user-visible\nlatency (ms)")
    latency.set_xlabel("seconds since start")
    latency.legend(fontsize=8, title="requests", title_fontsize=8, **outside)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# -- entry points ------------------------------------------------------------------------

def run(workers: int = WORKERS, duration: float = DURATION, name: str = NAME,
        url: str | None = None, prefix: str = DEFAULT_PREFIX, as_json: bool = False,
        plot_path: str | None = None) -> int:
    """Run the demo and print its result; exit code 0 when every check held."""
    if workers < 1 or duration < 4:
        raise ValueError("need --workers >= 1 and --duration >= 4")
    if plot_path:
        check_plot_path(plot_path)
    stream = sys.stderr if as_json else sys.stdout
    given = bool(url or os.environ.get("REDIS_URL"))
    with embedded_redis(url) as redis_url:
        print(f"distbreaker demo: {workers} worker processes WITH a shared Policy and "
              f"{workers} WITHOUT, each against its own flaky upstream, for {duration:g}s "
              f"(Redis: {server_kind(given)}, {redis_url})", file=stream)
        timeline = timeline_for(duration)
        config = breaker_config(duration)
        print(f"upstream timeline: {timeline}; breaker {name!r}: opens at "
              f"{config.failure_rate_threshold:g}% failures or slow calls (> "
              f"{config.slow_call_duration:g}s) over the last {config.sliding_window_size} "
              f"calls (min {config.minimum_number_of_calls}), waits "
              f"{config.wait_duration_in_open_state:g}s, then {PROBES} probes fleet-wide",
              file=stream)
        print("seen: the state each WITH worker last saw (C closed, O open, H half-open); "
              "calls: requests that reached that fleet's upstream", file=stream)
        demo = Demo(redis_url, workers, duration, name, prefix, stream)
        result = demo.run()
    for line in table_lines(result):
        print(line, file=stream)
    if plot_path:
        plot(result, demo.requests, plot_path)
        result["plot"] = plot_path
        print(f"plot written to {plot_path}", file=stream)
    if as_json:
        print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distbreaker.demo", description=(
        "A fleet sharing one breaker vs. the same fleet with naive retries, "
        "against a flaky upstream (ok -> failing -> slow -> recovering)."))
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"worker processes per fleet (default {WORKERS})")
    parser.add_argument("--duration", type=float, default=DURATION,
                        help=f"seconds of the upstream timeline (default {DURATION:g})")
    parser.add_argument("--name", default=NAME, help=f"breaker name (default {NAME})")
    parser.add_argument("--json", action="store_true",
                        help="print the result as JSON on stdout (the timeline on stderr)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the timeline (matplotlib)")
    options = parser.parse_args(argv)
    try:
        return run(options.workers, options.duration, options.name, as_json=options.json,
                   plot_path=options.plot)
    except ValueError as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
