"""A short, self-contained scenario: four worker processes share one breaker.

Run it with ``./scripts/demo`` or ``python -m distbreaker.demo``. It uses an
embedded Redis (a ``redis-server`` on a free port, else an in-process
fakeredis TCP server; ``$REDIS_URL`` overrides) and a flaky "payments"
dependency whose health is a flag in Redis, so every process sees the same
dependency:

1. healthy: every worker's calls succeed;
2. failing: one worker's failure trips the breaker, and every worker fails
   fast (no call reaches the dependency) until the wait is over; a probe
   that fails opens it again;
3. healthy again: after the wait, only ``permitted_calls_in_half_open``
   probes reach the dependency fleet-wide, and they close the breaker.

It prints a timeline (who made each transition, which transitions the
observer received on the breaker's pub/sub channel, what each worker saw),
per-phase tables and, last, one ``SUMMARY {json}`` line for tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import queue
import shutil
import sys
import threading
import time
from collections import Counter
from typing import Any

import redis

from .breaker import CircuitBreaker
from .config import BreakerConfig
from .embedded import embedded_redis
from .errors import CallNotPermitted
from .events import Transition
from .state import State

NAME = "payments"
WORKERS = 4
PROBES = 3


def demo_config(scale: float) -> BreakerConfig:
    """The breaker every worker uses (generous Redis timeout: the server may be fakeredis)."""
    return BreakerConfig(sliding_window_type="COUNT_BASED", sliding_window_size=20,
                         minimum_number_of_calls=10, failure_rate_threshold=50,
                         wait_duration_in_open_state=1.2 * scale,
                         permitted_calls_in_half_open=PROBES, half_open_lease=5.0,
                         redis_timeout=2.0)


def flag_key(name: str) -> str:
    return f"demo:{{{name}}}:dependency"


class Dependency:
    """The flaky payments gateway: healthy or failing as the shared flag in Redis says."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self._client = client
        self._key = flag_key(name)

    def __call__(self) -> str:
        healthy = self._client.get(self._key) == b"healthy"
        time.sleep(0.004)  # the gateway's own latency
        if not healthy:
            raise ConnectionError("payments gateway down")
        return "paid"


# -- worker process ---------------------------------------------------------------

def worker(wid: int, url: str, name: str, scale: float, phase: Any, stop: Any,
           out: Any) -> None:
    """Call the dependency through the shared breaker until told to stop.

    Sends notable moments (outcome changes, probes, transitions this process
    made) and, at the end, its per-phase counts to the coordinator.
    """
    breaker = CircuitBreaker(name, redis=url, config=demo_config(scale))
    dependency = Dependency(redis.Redis.from_url(url, socket_timeout=2.0), name)

    def made(event: Transition) -> None:
        out.put(("made", wid, time.time(), event.from_state.value, event.to_state.value,
                 event.reason, event.at_ms))

    breaker.add_listener(made)
    counts: dict[int, Counter[str]] = {}
    last = ""
    out.put(("ready", wid, time.time()))
    while phase.value == 0 and not stop.is_set():
        time.sleep(0.005)
    while not stop.is_set():
        current = phase.value
        tally = counts.setdefault(current, Counter())
        tally["calls"] += 1
        note, detail = "", ""
        try:
            permit = breaker.acquire()
        except CallNotPermitted as rejection:
            tally["rejected"] += 1
            note = f"rejected:{rejection.state}"
            detail = f"{rejection.retry_after:.2f}"
        else:
            probe = bool(permit.token)
            started = time.monotonic()
            error: BaseException | None = None
            try:
                dependency()
            except ConnectionError as failure:
                error = failure
            breaker.record(permit, error, time.monotonic() - started)
            outcome = "ok" if error is None else "failed"
            tally[outcome] += 1
            tally["reached_dependency"] += 1
            if probe:
                tally["probes"] += 1
                note = f"probe:{outcome}"
            else:
                note = outcome
        if note != last or note.startswith("probe"):
            out.put(("saw", wid, time.time(), note, detail))
            last = note
        time.sleep(0.025)
    out.put(("counts", wid, time.time(), {p: dict(c) for p, c in counts.items()}))


# -- coordinator ---------------------------------------------------------------------

@dataclasses.dataclass
class Line:
    """One timeline entry."""

    at: float
    who: str
    text: str
    order: int = 1  # at equal times: the maker of a transition before the listeners


def listen(url: str, channel: str, name: str, out: Any, stop: threading.Event) -> None:
    """Forward this breaker's fleet-wide transitions from pub/sub to the coordinator.

    The periodic PING also makes fakeredis' TCP server flush pending messages.
    """
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    out.put(("subscribed", 0, time.time()))
    while not stop.is_set():
        pubsub.ping()
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.02)
            if message is None or message.get("type") != "message":
                continue
            event = json.loads(message["data"])
            if event.get("name") == name:
                out.put(("heard", 0, time.time(), event))
    pubsub.close()
    client.close()


def server_kind(url_given: bool) -> str:
    if url_given:
        return "REDIS_URL"
    return "redis-server" if shutil.which("redis-server") else "fakeredis TCP server"


class Demo:
    """Runs the three phases and collects what the workers and the channel reported."""

    def __init__(self, url: str, scale: float, workers: int, name: str) -> None:
        self.url, self.scale, self.workers, self.name = url, scale, workers, name
        self.ctx = multiprocessing.get_context("spawn")
        self.out: Any = self.ctx.Queue()
        self.phase = self.ctx.Value("i", 0)
        self.stop = self.ctx.Event()
        self.client = redis.Redis.from_url(url)
        self.t0 = 0.0
        self.lines: list[Line] = []
        self.made: list[tuple[int, str, str, int]] = []      # worker, from, to, at_ms
        self.heard: list[dict[str, Any]] = []
        self.counts: dict[int, dict[int, dict[str, int]]] = {}
        self.first_rejection: dict[int, tuple[int, float]] = {}

    def set_dependency(self, healthy: bool) -> None:
        self.client.set(flag_key(self.name), "healthy" if healthy else "failing", ex=600)

    def drain(self, seconds: float) -> None:
        """Collect messages for `seconds`."""
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
        kind, wid, at = message[0], message[1], message[2] - self.t0
        who = f"worker {wid}"
        if kind == "made":
            _, _, _, src, dst, reason, at_ms = message
            self.made.append((wid, src, dst, at_ms))
            self.lines.append(Line(at_ms / 1000 - self.t0, who,
                                   f"*** made {src} -> {dst} ({reason})", 0))
        elif kind == "heard":
            event = message[3]
            self.heard.append(event)
            self.lines.append(Line(event["at_ms"] / 1000 - self.t0, "pub/sub",
                                   f"observer received {self.name} {event['from']} -> "
                                   f"{event['to']} on the fleet channel"))
        elif kind == "saw":
            note, detail = message[3], message[4]
            self.lines.append(Line(at, who, describe(note, detail)))
            if note.startswith("rejected") and wid not in self.first_rejection:
                self.first_rejection[wid] = (self.phase.value, at)
        elif kind == "counts":
            self.counts[wid] = {int(p): c for p, c in message[3].items()}

    def flush(self, title: str, since: float) -> None:
        """Print the timeline entries from `since` on, ordered by time."""
        print(title)
        for line in sorted((x for x in self.lines if x.at >= since), key=lambda x: (x.at, x.order)):
            print(f"  {line.at:6.2f}s  {line.who:9}  {line.text}")
        self.lines = [x for x in self.lines if x.at < since]

    def run(self) -> dict[str, Any]:
        scale = self.scale
        admin = CircuitBreaker(self.name, redis=self.url, config=demo_config(scale))
        admin.reset("demo start", actor="demo")
        self.set_dependency(True)
        listening = threading.Event()
        listener = threading.Thread(target=listen, daemon=True, args=(
            self.url, admin.keys.channel, self.name, self.out, listening))
        listener.start()
        procs = [self.ctx.Process(target=worker, daemon=True, args=(
            wid, self.url, self.name, scale, self.phase, self.stop, self.out))
            for wid in range(1, self.workers + 1)]
        for proc in procs:
            proc.start()
        ready, deadline = 0, time.monotonic() + 30
        while ready < self.workers + 1 and time.monotonic() < deadline:
            try:
                ready += self.out.get(timeout=0.5)[0] in ("ready", "subscribed")
            except queue.Empty:
                pass
        self.t0 = time.time()
        try:
            phases = [(1, True, "dependency healthy", 1.5 * scale),
                      (2, False, "dependency failing", 2.0 * scale),
                      (3, True, "dependency healthy again", 0.0)]
            ends: dict[int, float] = {}
            for number, healthy, title, seconds in phases:
                start = time.time() - self.t0
                self.set_dependency(healthy)
                self.phase.value = number
                if number < 3:
                    self.drain(seconds)
                else:
                    self.recover(admin)
                ends[number] = time.time() - self.t0
                self.drain(0.05)
                self.flush(f"\nphase {number}: {title} ({start:.2f}s - {ends[number]:.2f}s)",
                           start)
            self.stop.set()
            deadline = time.monotonic() + 10
            while len(self.counts) < self.workers and time.monotonic() < deadline:
                self.drain(0.1)
        finally:
            self.stop.set()
            listening.set()
            for proc in procs:
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
            listener.join(2)
            final = admin.state
            self.client.delete(flag_key(self.name))
        return self.summary(final)

    def recover(self, admin: CircuitBreaker) -> None:
        """Phase 3: run until the fleet has closed the breaker again, then a little longer."""
        deadline = time.monotonic() + 1.2 * self.scale + 6.0
        while time.monotonic() < deadline:
            self.drain(0.1)
            if self.heard and self.heard[-1]["to"] == "CLOSED" and admin.state is State.CLOSED:
                break
        self.drain(0.5 * self.scale)

    def summary(self, final: State) -> dict[str, Any]:
        by_key = {(src, dst, at_ms): wid for wid, src, dst, at_ms in self.made}
        transitions = [{"from": e["from"], "to": e["to"], "reason": e["reason"],
                        "t": round(e["at_ms"] / 1000 - self.t0, 3),
                        "by_worker": by_key.get((e["from"], e["to"], e["at_ms"]))}
                       for e in self.heard]
        per_phase: dict[str, dict[str, dict[str, int]]] = {}
        for wid, phases in sorted(self.counts.items()):
            for number, tally in phases.items():
                if number:
                    per_phase.setdefault(str(number), {})[str(wid)] = tally
        trips = [t for t in transitions if t["to"] == "OPEN"]
        half_opens = [t for t in transitions if t["to"] == "HALF_OPEN"]
        probes = sum(t.get("probes", 0) for p in per_phase.values() for t in p.values())
        failing = per_phase.get("2", {})
        fail_fast = sorted(int(w) for w, t in failing.items() if t.get("rejected", 0) > 0)
        closing = [t for t in transitions if t["from"] == "HALF_OPEN" and t["to"] == "CLOSED"]
        checks = {
            "tripped_by_one_worker": bool(trips) and trips[0]["by_worker"] is not None,
            "all_workers_failed_fast": len(fail_fast) == self.workers,
            "probes_bounded": probes <= PROBES * len(half_opens),
            "recovered": bool(closing) and final is State.CLOSED,
            "each_transition_attributed": all(t["by_worker"] for t in transitions),
        }
        return {"breaker": self.name, "workers": self.workers, "final_state": final.value,
                "transitions": transitions, "phases": per_phase,
                "workers_failing_fast": fail_fast, "half_open_probes": probes,
                "permitted_calls_in_half_open": PROBES, "checks": checks,
                "ok": all(checks.values())}


def describe(note: str, detail: str) -> str:
    if note == "ok":
        return "calls succeed"
    if note == "failed":
        return "calls reach the dependency and fail"
    if note == "probe:ok":
        return "probe reached the dependency: ok"
    if note == "probe:failed":
        return "probe reached the dependency: failed"
    state = note.split(":", 1)[1]
    if state == State.OPEN.value:
        return f"rejected: OPEN, failing fast (a probe may be tried in {detail}s)"
    return f"rejected: {state} (the probes are taken by other workers)"


def print_tables(result: dict[str, Any]) -> None:
    print("\nper worker and phase: calls / ok / failed / rejected (fail fast) / probes")
    for number, workers in result["phases"].items():
        cells = []
        for wid, t in workers.items():
            cells.append(f"w{wid} {t.get('calls', 0):3}/{t.get('ok', 0):3}/"
                         f"{t.get('failed', 0):3}/{t.get('rejected', 0):3}/{t.get('probes', 0)}")
        print(f"  phase {number}:  " + "   ".join(cells))
    print("\nfleet-wide transitions (received on pub/sub), and the worker that made each:")
    for t in result["transitions"]:
        print(f"  {t['t']:6.2f}s  {t['from']:>9} -> {t['to']:9} by worker {t['by_worker']}"
              f"  ({t['reason']})")
    print("\nchecks: " + ", ".join(f"{k}={'yes' if v else 'NO'}"
                                   for k, v in result["checks"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distbreaker.demo", description=(
        "Four worker processes share one circuit breaker in Redis: trip and recovery."))
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every phase and wait duration (default 1.0)")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--name", default=NAME, help="breaker name (default payments)")
    options = parser.parse_args(argv)
    given = bool(os.environ.get("REDIS_URL"))
    with embedded_redis() as url:
        print(f"distbreaker demo: {options.workers} worker processes share the circuit "
              f"breaker {options.name!r} in Redis ({server_kind(given)}, {url})")
        config = demo_config(options.scale)
        print(f"window: last {config.sliding_window_size} calls, opens at "
              f"{config.failure_rate_threshold:g}% failures (min "
              f"{config.minimum_number_of_calls} calls), waits "
              f"{config.wait_duration_in_open_state:g}s, then {PROBES} probes fleet-wide")
        result = Demo(url, options.scale, options.workers, options.name).run()
    print_tables(result)
    print("SUMMARY " + json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
