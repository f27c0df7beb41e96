"""A flaky HTTP upstream on a timeline, for the demo, docker-compose and tests.

Standard library only (`httpserver.JsonServer`: ``http.server``, one thread per
connection). It plays a
payment gateway whose health follows a timeline of phases, e.g.
``ok:6,failing:10,slow:6,recovering:8`` (seconds):

- ``ok`` / ``recovering``: 200 after ``--latency`` seconds;
- ``failing``: 503 after ``--latency`` seconds (an overloaded gateway answers fast);
- ``slow``: 200 after ``--slow-latency`` seconds (a slow-call-rate trip, not an error).

After the last phase the upstream stays in it, or starts over with ``--loop``.
It counts every call it serves (per phase, per status, per second, peak
concurrency) so a demo can show the load that actually reached it:

- ``GET /stats``: those counts as JSON; ``POST /restart``: clock and counts to zero;
- ``GET /healthz``: 200, not counted; any other path is a counted call.

Run it with ``python -m distbreaker.upstream --port 8080 --timeline ...``, or
in-process with ``FlakyUpstream(...).start()`` (tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time
from collections import Counter
from typing import Any

from .httpserver import Answer, JsonServer, serve_until_interrupted

MODES = ("ok", "failing", "slow", "recovering")
DEFAULT_TIMELINE = "ok:6,failing:10.5,slow:6,recovering:7.5"
STATUS = {"ok": 200, "failing": 503, "slow": 200, "recovering": 200}


@dataclasses.dataclass(frozen=True)
class Phase:
    """One stretch of the timeline: a mode held for `seconds`."""

    mode: str
    seconds: float


class Timeline:
    """The upstream's health as a function of the time since (re)start."""

    def __init__(self, phases: list[Phase], loop: bool = False) -> None:
        if not phases:
            raise ValueError("a timeline needs at least one phase")
        for phase in phases:
            if phase.mode not in MODES:
                raise ValueError(f"unknown mode {phase.mode!r} (one of {', '.join(MODES)})")
            if not phase.seconds > 0:
                raise ValueError(f"phase {phase.mode!r} must last > 0 seconds")
        self.phases = phases
        self.loop = loop
        self.total = sum(p.seconds for p in phases)

    @classmethod
    def parse(cls, text: str, loop: bool = False, scale: float = 1.0) -> Timeline:
        """``"ok:6,failing:10"`` (seconds, multiplied by `scale`)."""
        phases = []
        for item in text.split(","):
            mode, _, seconds = item.strip().partition(":")
            try:
                phases.append(Phase(mode.strip(), float(seconds) * scale))
            except ValueError:
                raise ValueError(f"bad timeline item {item!r} (want mode:seconds)") from None
        return cls(phases, loop)

    def mode_at(self, elapsed: float) -> str:
        """The mode `elapsed` seconds after the start."""
        if self.loop:
            elapsed %= self.total
        for phase in self.phases:
            if elapsed < phase.seconds:
                return phase.mode
            elapsed -= phase.seconds
        return self.phases[-1].mode

    def bounds(self) -> list[tuple[str, float, float]]:
        """(mode, start, end) of each phase of one pass."""
        out, at = [], 0.0
        for phase in self.phases:
            out.append((phase.mode, at, at + phase.seconds))
            at += phase.seconds
        return out

    def __str__(self) -> str:
        return ",".join(f"{p.mode}:{p.seconds:g}" for p in self.phases)


class Counts:
    """What reached the upstream, guarded by one lock (handlers run in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.restart()

    def restart(self) -> None:
        with self._lock:
            self.started = time.time()
            self._t0 = time.monotonic()
            self.calls = 0
            self.by_mode: dict[str, Counter[int]] = {}
            self.per_second: dict[int, Counter[str]] = {}
            self.in_flight = 0
            self.max_in_flight = 0

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def begin(self, mode: str, elapsed: float) -> None:
        with self._lock:
            self.calls += 1
            self.per_second.setdefault(int(elapsed), Counter())[mode] += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def end(self, mode: str, status: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.by_mode.setdefault(mode, Counter())[status] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "started": self.started, "elapsed": round(self.elapsed(), 3),
                "calls": self.calls, "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "by_mode": {m: {str(s): n for s, n in c.items()} for m, c in self.by_mode.items()},
                "per_second": {str(s): dict(c) for s, c in sorted(self.per_second.items())},
            }


class FlakyUpstream(JsonServer):
    """The server: `start()` serves in a background thread, `serve_forever()` in this one."""

    def __init__(self, timeline: Timeline, host: str = "127.0.0.1", port: int = 0,
                 latency: float = 0.02, slow_latency: float = 1.0) -> None:
        self.timeline = timeline
        self.latency = latency
        self.slow_latency = slow_latency
        self.counts = Counts()
        super().__init__(host, port)

    def mode(self) -> str:
        return self.timeline.mode_at(self.counts.elapsed())

    def handle(self, method: str, path: str, body: bytes) -> Answer:
        if method == "GET" and path == "/stats":
            return 200, self.counts.snapshot(), {}
        if method == "GET" and path == "/healthz":
            return 200, {"mode": self.mode()}, {}
        if method == "POST" and path == "/restart":
            self.counts.restart()
            return 200, {"timeline": str(self.timeline)}, {}
        return self._call()

    def _call(self) -> Answer:
        counts = self.counts
        elapsed = counts.elapsed()
        mode = self.timeline.mode_at(elapsed)
        status = STATUS[mode]
        counts.begin(mode, elapsed)
        try:
            time.sleep(self.slow_latency if mode == "slow" else self.latency)
            return status, {"mode": mode, "t": round(elapsed, 3)}, {}
        finally:
            counts.end(mode, status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distbreaker.upstream", description=(
        "A flaky HTTP upstream: ok -> failing (503) -> slow -> recovering on a timeline."))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--timeline", default=DEFAULT_TIMELINE,
                        help=f"mode:seconds,... with modes {', '.join(MODES)} "
                             f"(default {DEFAULT_TIMELINE})")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every phase")
    parser.add_argument("--loop", action="store_true", help="start the timeline over at its end")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per answer")
    parser.add_argument("--slow-latency", type=float, default=1.0,
                        help="seconds per answer in the slow phase")
    options = parser.parse_args(argv)
    try:
        timeline = Timeline.parse(options.timeline, options.loop, options.scale)
    except ValueError as exc:
        parser.error(str(exc))
    upstream = FlakyUpstream(timeline, options.host, options.port, options.latency,
                             options.slow_latency)
    print(f"flaky upstream on http://{options.host}:{upstream.port} timeline {timeline}"
          f"{' (looping)' if options.loop else ''}", flush=True)
    return serve_until_interrupted(upstream)


if __name__ == "__main__":
    sys.exit(main())
