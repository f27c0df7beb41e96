"""Replay, the pure part: the order of script calls a recorded timeline makes, the
judge of trips (the recorded outcomes' own failure rate), and the accounting of what a
config did with them. No I/O: `replay.py` makes the script calls and feeds the replies
here; tests drive it with hand-made replies.

Definitions (docs/guides/tuning.md):

- a *trip* is a transition CLOSED -> OPEN (a half-open verdict back to OPEN is a
  *reopen*, counted apart);
- *time open* is the time the breaker spent not CLOSED (OPEN and HALF_OPEN), until
  the end of the timeline;
- *calls rejected* and *failures avoided*: recorded calls (and their failures) that
  the breaker refused; *failures let through*: failures of the calls it permitted;
- the *truth* at time t is the failure rate of the recorded outcomes in t's bucket
  (`--truth-window`, 5 s by default, cut from the timeline's start); an *incident* is
  a run of buckets whose truth is at or above `target`;
- a *false trip* is a trip in a bucket whose truth was under `target`, as was the
  next bucket's (a failure starting late in a bucket shows in the next one);
- *time to detect* an incident: from its start to the first trip during it or in the
  bucket before it (0 then: the resolution is one bucket; 0 too when the breaker was
  not CLOSED as it began); an incident without a trip is *missed*.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable, Sequence
from typing import Any

from .timeline import Sample

#: A step's kinds, in the order they run when they share a millisecond.
ACQUIRE, RECORD = "acquire", "record"


@dataclasses.dataclass(frozen=True)
class Step:
    """One script call of the replay (or one local decision standing for it)."""

    t_ms: int
    kind: str
    index: int    # the sample's index in the timeline


def weights(samples: Sequence[Sample], scale: bool = True) -> list[int]:
    """How many calls each sample stands for: 1 / its sample rate (the fractions carried
    over, so a 30 % timeline replays as many calls as were made), or 1 (`scale` off)."""
    if not scale:
        return [1] * len(samples)
    out, carry = [], 0.0
    for sample in samples:
        carry += 1.0 / sample.rate
        whole = math.floor(carry + 1e-9)
        out.append(whole)
        carry -= whole
    return out


def plan(samples: Sequence[Sample]) -> list[Step]:
    """The replay's steps in time order: each sample's permission asked when its call
    started (its end minus its duration per call), its outcome recorded at its end."""
    steps: list[tuple[int, int, int, str]] = []
    for i, sample in enumerate(samples):
        per_call = sample.duration_ms // max(1, sample.calls)
        steps.append((sample.t_ms - per_call, 0, i, ACQUIRE))
        steps.append((sample.t_ms, 1, i, RECORD))
    heapq.heapify(steps)
    return [Step(t, kind, i) for t, _, i, kind in (heapq.heappop(steps)
                                                   for _ in range(len(steps)))]


class Truth:
    """What the dependency did, against which trips are judged: the recorded
    outcomes' failure rate per bucket of `bucket_ms` (aligned on the timeline's first
    ms). A bucket with fewer than `min_calls` calls takes its predecessor's rate (a
    quiet second says nothing new)."""

    def __init__(self, samples: Sequence[Sample], sample_weights: Sequence[int],
                 bucket_ms: int, min_calls: int = 1) -> None:
        self.bucket_ms = max(1, bucket_ms)
        self.start_ms = samples[0].t_ms if samples else 0
        calls: dict[int, int] = {}
        fails: dict[int, int] = {}
        for sample, w in zip(samples, sample_weights, strict=True):
            b = (sample.t_ms - self.start_ms) // self.bucket_ms
            calls[b] = calls.get(b, 0) + sample.calls * w
            fails[b] = fails.get(b, 0) + sample.failed * w
        n = (max(calls) + 1) if calls else 0
        self.rates: list[float | None] = []
        last: float | None = None
        for b in range(n):
            if calls.get(b, 0) >= max(1, min_calls):
                last = 100.0 * fails[b] / calls[b]
            self.rates.append(last)

    def rate_at(self, t_ms: int) -> float | None:
        """Failure rate (percent) of the bucket holding `t_ms` (None: no calls yet)."""
        b = (t_ms - self.start_ms) // self.bucket_ms
        if not self.rates:
            return None
        return self.rates[min(max(b, 0), len(self.rates) - 1)]

    def incidents(self, target: float) -> list[tuple[int, int]]:
        """(start, end) ms of each run of buckets whose failure rate is at or above
        `target`."""
        out: list[tuple[int, int]] = []
        start: int | None = None
        for b, rate in enumerate(self.rates):
            t = self.start_ms + b * self.bucket_ms
            failing = rate is not None and rate >= target
            if failing and start is None:
                start = t
            elif not failing and start is not None:
                out.append((start, t))
                start = None
        if start is not None:
            out.append((start, self.start_ms + len(self.rates) * self.bucket_ms))
        return out


@dataclasses.dataclass
class ReplayResult:
    """What one config did with the timeline."""

    label: str
    changes: dict[str, Any]
    trips: int = 0
    reopens: int = 0
    time_open_s: float = 0.0
    calls: int = 0
    calls_rejected: int = 0
    failures: int = 0
    failures_let_through: int = 0
    failures_avoided: int = 0
    false_trips: int = 0
    incidents: int = 0
    missed_incidents: int = 0
    detect_s: list[float] = dataclasses.field(default_factory=list)
    #: (server ms, from, to) of every transition the replay saw.
    transitions: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)
    start_ms: int = 0
    end_ms: int = 0

    @property
    def mean_detect_s(self) -> float | None:
        return sum(self.detect_s) / len(self.detect_s) if self.detect_s else None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["mean_detect_s"] = self.mean_detect_s
        out["transitions"] = [list(t) for t in self.transitions]
        return out


class Tally:
    """Accounts one config's replay: fed every local decision and every reply's
    transitions, in time order; `result()` judges the trips against the truth."""

    def __init__(self, label: str, changes: dict[str, Any], start_ms: int) -> None:
        self.r = ReplayResult(label, dict(changes), start_ms=start_ms, end_ms=start_ms)
        self._state = "CLOSED"
        self._left_at: int | None = None
        self._trip_times: list[int] = []

    def permitted(self, sample: Sample, weight: int) -> None:
        self.r.calls += sample.calls * weight
        self.r.failures += sample.failed * weight
        self.r.failures_let_through += sample.failed * weight

    def rejected(self, sample: Sample, weight: int) -> None:
        self.r.calls += sample.calls * weight
        self.r.failures += sample.failed * weight
        self.r.calls_rejected += sample.calls * weight
        self.r.failures_avoided += sample.failed * weight

    def transition(self, t_ms: int, frm: str, to: str) -> None:
        self.r.transitions.append((t_ms, frm, to))
        if to == "OPEN":
            if frm == "CLOSED":
                self.r.trips += 1
                self._trip_times.append(t_ms)
            elif frm == "HALF_OPEN":
                self.r.reopens += 1
        if frm == "CLOSED" and to != "CLOSED" and self._left_at is None:
            self._left_at = t_ms
        if to == "CLOSED" and self._left_at is not None:
            self.r.time_open_s += (t_ms - self._left_at) / 1000.0
            self._left_at = None
        self._state = to

    def _state_at(self, t_ms: int) -> str:
        state = "CLOSED"
        for at, _, to in self.r.transitions:
            if at > t_ms:
                break
            state = to
        return state

    def result(self, end_ms: int, truth: Truth, target: float) -> ReplayResult:
        r = self.r
        r.end_ms = end_ms
        if self._left_at is not None:
            r.time_open_s += max(0, end_ms - self._left_at) / 1000.0
            self._left_at = None
        # A failure that starts late in a bucket shows in the next one: a trip in the
        # bucket before a failing one is that incident's detection, not a false trip.
        grace = truth.bucket_ms
        r.false_trips = sum(1 for t in self._trip_times
                            if (truth.rate_at(t) or 0.0) < target
                            and (truth.rate_at(t + grace) or 0.0) < target)
        incidents = truth.incidents(target)
        r.incidents = len(incidents)
        for start, end in incidents:
            first = next((t for t in self._trip_times if start - grace <= t < end), None)
            if first is None and self._state_at(start) != "CLOSED":
                first = start   # already open (or probing) when it began
            if first is None:
                r.missed_incidents += 1
            else:
                r.detect_s.append(max(0, first - start) / 1000.0)
        return r


# -- sweeps ---------------------------------------------------------------------------

def _number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def parse_sweep(spec: str) -> tuple[str, list[Any]]:
    """``field=30..70:10`` (from, to inclusive, step) or ``field=a,b,c``: the field and
    its values."""
    field, sep, values = spec.partition("=")
    field = field.strip().replace("-", "_")
    if not sep or not field or not values.strip():
        raise ValueError(f"--sweep wants FIELD=FROM..TO:STEP or FIELD=A,B,C, got {spec!r}")
    if ".." in values:
        span, _, step_text = values.partition(":")
        lo_text, _, hi_text = span.partition("..")
        try:
            lo, hi = _number(lo_text), _number(hi_text)
            step = _number(step_text) if step_text else 1
        except ValueError:
            raise ValueError(f"--sweep {spec!r}: FROM, TO and STEP must be numbers") from None
        if not all(math.isfinite(x) for x in (lo, hi, step)):
            raise ValueError(f"--sweep {spec!r}: FROM, TO and STEP must be finite numbers")
        if step <= 0 or hi < lo:
            raise ValueError(f"--sweep {spec!r}: needs FROM <= TO and STEP > 0")
        if (hi - lo) / step >= 1000:
            raise ValueError(f"--sweep {spec!r}: more than 1000 values")
        n = math.floor((hi - lo) / step + 1e-9) + 1
        out: list[Any] = []
        for i in range(n):
            v = lo + i * step
            out.append(round(v, 9) if isinstance(v, float) else v)
        return field, out
    items: list[Any] = []
    for item in values.split(","):
        item = item.strip()
        try:
            items.append(_number(item))
        except ValueError:
            items.append(item)
    return field, items


def sweep_changes(sweeps: Iterable[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """Every combination of the sweeps' values (the first sweep varies slowest)."""
    combos: list[dict[str, Any]] = [{}]
    for field, values in sweeps:
        combos = [{**c, field: v} for c in combos for v in values]
    return combos
