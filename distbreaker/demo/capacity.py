"""A capacity-limited HTTP upstream, for the overload bench (scripts/bench_overload.py).

Standard library only (`httpserver.JsonServer`). It plays a provider that caps
concurrency per account at a capacity C that only its operator (the bench) knows:

- every call arriving while ``in_flight`` (calls in progress, this one and the ones
  being refused included) exceeds C is an **overload call**: answered ``429`` with
  ``Retry-After`` (or ``503``, `over_status`) after `reject_latency`;
- an admitted call answers 200 after `base_latency` seconds of work, served at a rate
  of ``1 / (1 + in_flight / C) ** exponent`` while it runs (processor sharing,
  re-read every few milliseconds): with ``n`` calls in flight it takes about
  ``base_latency * (1 + n / C) ** exponent``. Latency rises with concurrency, and
  refusals in progress slow the admitted calls too: overload costs goodput;
- while failing (``POST /admin {"fail_for": seconds}``) every call answers 503 after
  `reject_latency` (an outage, not overload: not counted as overload calls).

With ``queue`` > 0 it plays a thread-pool server instead, one that never refuses
early: C slots, each serving one call for a lognormal time of mean `base_latency`
(spread `sigma`, independent of the load); a call finding every slot busy waits in
a FIFO queue of at most `queue` calls (an **overload call**: it had to queue), and
only a call finding the queue full is answered 503 at once (an overload call too).
Latency climbs with the queue; nothing says "too many" before the queue is full.

Operator endpoints (not counted as calls):

- ``GET /stats``: counts since the last restart (calls, ok, overload_calls, failed,
  statuses, max_in_flight, max_admitted) and a per-`bucket` series of the same;
- ``POST /admin`` with a JSON object of any of ``capacity``, ``base_latency``,
  ``exponent``, ``over_status``, ``retry_after``, ``reject_latency``, ``bucket``,
  ``fail_for`` (seconds from now): changed at run time, e.g. a recovery run fails it
  for a while and brings it back at half capacity; answers the settings;
- ``POST /restart``: counts and clock to zero; ``GET /healthz``: the settings.

Run it with ``python -m distbreaker.demo.capacity --port 8081 --capacity 8``, or
in-process with ``CapacityUpstream(Settings(...)).start()``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import threading
import time
from collections import Counter, deque
from typing import Any

from .httpserver import Answer, JsonServer, serve_until_interrupted

OVER_STATUSES = (429, 503)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the upstream behaves; every field can change at run time (``POST /admin``)."""

    capacity: int = 8
    base_latency: float = 0.02
    exponent: float = 1.0
    over_status: int = 429
    retry_after: float = 1.0
    reject_latency: float = 0.005
    bucket: float = 0.25
    queue: int = 0            # > 0: queue beyond C (FIFO, this long), 503 when full
    sigma: float = 0.5        # queueing: the lognormal spread of the service time

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) \
                or self.capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {self.capacity!r}")
        if isinstance(self.queue, bool) or not isinstance(self.queue, int) or self.queue < 0:
            raise ValueError(f"queue must be an integer >= 0, got {self.queue!r}")
        for field in ("base_latency", "exponent", "retry_after", "reject_latency", "sigma"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{field} must be a number >= 0, got {value!r}")
        if not isinstance(self.bucket, (int, float)) or not self.bucket > 0:
            raise ValueError(f"bucket must be a number > 0, got {self.bucket!r}")
        if self.over_status not in OVER_STATUSES:
            raise ValueError(f"over_status must be one of {OVER_STATUSES}, "
                             f"got {self.over_status!r}")

    def slowdown(self, in_flight: int) -> float:
        """How much slower than alone work is served with `in_flight` calls in progress."""
        return float((1 + in_flight / self.capacity) ** self.exponent)

    def latency(self, in_flight: int) -> float:
        """Seconds an admitted call takes while `in_flight` calls (itself too) stay in
        progress."""
        return self.base_latency * self.slowdown(in_flight)

    def service_time(self) -> float:
        """A queueing upstream's service time: lognormal, mean `base_latency`."""
        if self.sigma <= 0:
            return self.base_latency
        mu = math.log(max(self.base_latency, 1e-9)) - self.sigma ** 2 / 2
        return random.lognormvariate(mu, self.sigma)

    def replace(self, changes: dict[str, Any]) -> Settings:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)


class Tally:
    """What reached the upstream since the last restart, guarded by one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.admitted = 0
        self.waiting: deque[threading.Event] = deque()   # queueing: FIFO of waiting calls
        self.restart()

    def restart(self) -> None:
        """Counts and clock to zero; the calls in progress stay counted in flight (they
        still load the server, and they leave later)."""
        with self._lock:
            self._t0 = time.monotonic()
            self.max_in_flight = self.in_flight
            self.max_admitted = self.admitted
            self.totals: Counter[str] = Counter()
            self.statuses: Counter[int] = Counter()
            self.series: dict[int, Counter[str]] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def arrive(self, settings: Settings,
               failing: bool) -> tuple[str, int, threading.Event | None]:
        """Count one arriving call; its fate (ok, queued, overload, failed), the in-flight
        count it sees (itself included) and, when queued, the event that gives it a slot."""
        with self._lock:
            self.in_flight += 1
            in_flight = self.in_flight
            wait: threading.Event | None = None
            if failing:
                fate = "failed"
            elif settings.queue and self.admitted >= settings.capacity:
                if len(self.waiting) < settings.queue:
                    fate, wait = "queued", threading.Event()
                    self.waiting.append(wait)
                    self.totals["queued"] += 1
                else:
                    fate = "overload"
            elif in_flight > settings.capacity and not settings.queue:
                fate = "overload"
            else:
                fate = "ok"
                self.admitted += 1
                self.max_admitted = max(self.max_admitted, self.admitted)
            self.max_in_flight = max(self.max_in_flight, in_flight)
            counted = "overload" if fate == "queued" else fate  # a queued call is beyond C
            self.totals["calls"] += 1
            self.totals[counted] += 1
            at = self._bucket(settings)
            at["calls"] += 1
            at[counted] += 1
            at["max_in_flight"] = max(at["max_in_flight"], in_flight)
            if fate == "ok":
                at["max_admitted"] = max(at["max_admitted"], self.admitted)
            return fate, in_flight, wait

    def leave(self, fate: str, status: int, settings: Settings | None = None) -> None:
        with self._lock:
            self.in_flight -= 1
            if fate in ("ok", "queued"):
                self.admitted -= 1
            self.statuses[status] += 1
            if settings is not None:
                self._hand_over(settings)

    def _hand_over(self, settings: Settings) -> None:
        """Queueing: free slots go to the longest-waiting calls (under the lock)."""
        while self.waiting and self.admitted < settings.capacity:
            self.admitted += 1
            self.waiting.popleft().set()

    def capacity_changed(self, settings: Settings) -> None:
        with self._lock:
            self._hand_over(settings)

    def _bucket(self, settings: Settings) -> Counter[str]:
        return self.series.setdefault(int(self.elapsed() / settings.bucket), Counter())

    def snapshot(self, settings: Settings) -> dict[str, Any]:
        with self._lock:
            return {
                "elapsed": round(self.elapsed(), 3), "calls": self.totals["calls"],
                "ok": self.totals["ok"], "overload_calls": self.totals["overload"],
                "failed": self.totals["failed"],
                "statuses": {str(s): n for s, n in sorted(self.statuses.items())},
                "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "max_admitted": self.max_admitted, "bucket": settings.bucket,
                "series": [{"t": round(index * settings.bucket, 3), **counts}
                           for index, counts in sorted(self.series.items())],
            }


class CapacityUpstream(JsonServer):
    """The server: `start()` serves in a background thread, `serve_forever()` in this one."""

    def __init__(self, settings: Settings | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.settings = settings or Settings()
        self.fail_until = 0.0  # monotonic
        self.tally = Tally()
        self._lock = threading.Lock()
        super().__init__(host, port)

    def failing(self) -> bool:
        return time.monotonic() < self.fail_until

    def describe(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.settings),
                "failing_for": round(max(0.0, self.fail_until - time.monotonic()), 3)}

    def configure(self, changes: dict[str, Any]) -> None:
        """Apply ``POST /admin`` changes (all or none; ValueError on bad input)."""
        changes = dict(changes)
        fail_for = changes.pop("fail_for", None)
        if fail_for is not None and (not isinstance(fail_for, (int, float)) or fail_for < 0):
            raise ValueError(f"fail_for must be a number of seconds >= 0, got {fail_for!r}")
        with self._lock:
            self.settings = self.settings.replace(changes)
            if fail_for is not None:
                self.fail_until = time.monotonic() + fail_for
        self.tally.capacity_changed(self.settings)  # queueing: more slots serve the queue

    def handle(self, method: str, path: str, body: bytes) -> Answer:
        if method == "GET" and path == "/stats":
            return 200, self.tally.snapshot(self.settings), {}
        if method == "GET" and path == "/healthz":
            return 200, self.describe(), {}
        if method == "POST" and path == "/restart":
            self.tally.restart()
            return 200, self.describe(), {}
        if method == "POST" and path == "/admin":
            try:
                changes = json.loads(body or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("want a JSON object")
                self.configure(changes)
            except ValueError as error:
                return 400, {"error": str(error)}, {}
            return 200, self.describe(), {}
        return self._call()

    def _call(self) -> Answer:
        settings = self.settings
        fate, in_flight, wait = self.tally.arrive(settings, self.failing())
        status, headers = 200, {}
        try:
            if wait is not None:
                wait.wait()
            if fate in ("ok", "queued") and settings.queue:
                time.sleep(settings.service_time())
            elif fate == "ok":
                self._serve(settings)
            else:
                time.sleep(settings.reject_latency)
                status = 503 if fate == "failed" or settings.queue else settings.over_status
                headers = {"Retry-After": f"{max(1, math.ceil(settings.retry_after))}"}
            return status, {"fate": fate, "in_flight": in_flight}, headers
        finally:
            # before the answer is sent: a client that got its answer and calls again
            # never finds itself still counted
            self.tally.leave(fate, status, self.settings)


    def _serve(self, settings: Settings) -> None:
        """`base_latency` seconds of work at the rate the current concurrency allows."""
        work, done = settings.base_latency, 0.0
        step = max(0.002, work / 5)
        last = time.monotonic()
        while done < work:
            slowdown = settings.slowdown(self.tally.in_flight)
            time.sleep(min(step, (work - done) * slowdown))
            now = time.monotonic()
            done += (now - last) / slowdown
            last = now


def main(argv: list[str] | None = None) -> int:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="python -m distbreaker.demo.capacity", description=(
        "An upstream whose latency rises with concurrency and which answers 429 beyond "
        "a capacity (changeable at run time: POST /admin)."))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--capacity", type=int, default=defaults.capacity,
                        help=f"concurrent calls served (default {defaults.capacity})")
    parser.add_argument("--base-latency", type=float, default=defaults.base_latency,
                        help=f"seconds per call when idle (default {defaults.base_latency})")
    parser.add_argument("--exponent", type=float, default=defaults.exponent,
                        help="latency = base * (1 + in_flight/capacity) ** exponent "
                             f"(default {defaults.exponent})")
    parser.add_argument("--over-status", type=int, default=defaults.over_status,
                        choices=OVER_STATUSES, help="the answer beyond capacity (default 429)")
    parser.add_argument("--retry-after", type=float, default=defaults.retry_after,
                        help="Retry-After of refusals, seconds (default 1)")
    parser.add_argument("--queue", type=int, default=defaults.queue,
                        help="> 0: a queueing server: calls beyond C wait in a FIFO queue "
                             "this long (503 when full) and service times are lognormal "
                             "(default 0: refuse beyond C)")
    parser.add_argument("--sigma", type=float, default=defaults.sigma,
                        help=f"queueing: lognormal spread of service times (default "
                             f"{defaults.sigma})")
    parser.add_argument("--bucket", type=float, default=defaults.bucket,
                        help=f"seconds per /stats series point (default {defaults.bucket})")
    options = parser.parse_args(argv)
    try:
        settings = Settings(capacity=options.capacity, base_latency=options.base_latency,
                            exponent=options.exponent, over_status=options.over_status,
                            retry_after=options.retry_after, bucket=options.bucket,
                            queue=options.queue, sigma=options.sigma)
    except ValueError as exc:
        parser.error(str(exc))
    upstream = CapacityUpstream(settings, options.host, options.port)
    print(f"capacity upstream on http://{options.host}:{upstream.port} "
          f"capacity {settings.capacity}", flush=True)
    return serve_until_interrupted(upstream)


if __name__ == "__main__":
    sys.exit(main())
