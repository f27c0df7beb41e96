"""The recorded timeline and its JSONL form (`distbreaker record export`).

One JSON object per line, one sampled record call each (docs/KEY_SCHEMA.md, "Outcome
recording")::

    {"name": "payments", "t_ms": 1796208168228, "ok": 1, "failed": 0, "slow": 0,
     "duration_ms": 41, "worker": "web-1:4242", "rate": 0.1, "state": "CLOSED",
     "id": "1796208168228-0"}

`t_ms` is the server time of the record (the call's end), `ok` / `failed` / `slow`
the outcome counts it carried (1 / 0 / 0 for one successful call; a batched flush
carries many, at the flush's time), `duration_ms` their total duration, `rate` the
sample rate in force (each entry stands for 1 / rate calls), `state` the breaker's
state after the call. Only `t_ms` and one of `ok` / `failed` are required; other
keys are ignored, so a timeline can be written by hand or generated (`seed`).
Pure: no I/O but the lines given.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterable, Iterator, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Sample:
    """One recorded record call."""

    t_ms: int
    ok: int = 0
    failed: int = 0
    slow: int = 0
    duration_ms: int = 0
    worker: str = ""
    rate: float = 1.0
    state: str = ""
    name: str = ""

    @property
    def calls(self) -> int:
        return self.ok + self.failed

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "t_ms": self.t_ms, "ok": self.ok, "failed": self.failed,
                "slow": self.slow, "duration_ms": self.duration_ms, "worker": self.worker,
                "rate": self.rate, "state": self.state}


class TimelineError(ValueError):
    """A line that is not a recorded outcome (the message names the line)."""


#: Limits of a line (what the breaker script can be fed exactly): times up to the year
#: 9999, counts up to 10^9 per entry, rates down to one in a million (the stream's unit).
MAX_T_MS = 253_402_300_799_999
MAX_COUNT = 1_000_000_000
MAX_DURATION_MS = 1_000_000_000_000
MIN_RATE = 1e-6


def _int(obj: Mapping[str, Any], key: str, line: int, default: int | None = 0,
         most: int = MAX_COUNT) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise TimelineError(f"line {line}: {key} must be an integer in [0, {most}], "
                            f"got {value!r}")
    return value


def parse_entry(obj: Any, line: int = 0) -> Sample:
    if not isinstance(obj, Mapping):
        raise TimelineError(f"line {line}: expected a JSON object, got {obj!r}")
    if "t_ms" not in obj:
        raise TimelineError(f"line {line}: t_ms is missing")
    rate = obj.get("rate", 1.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) \
            or not MIN_RATE <= rate <= 1:
        raise TimelineError(f"line {line}: rate must be in [{MIN_RATE:g}, 1], got {rate!r}")
    sample = Sample(t_ms=_int(obj, "t_ms", line, most=MAX_T_MS), ok=_int(obj, "ok", line),
                    failed=_int(obj, "failed", line), slow=_int(obj, "slow", line),
                    duration_ms=_int(obj, "duration_ms", line, most=MAX_DURATION_MS),
                    worker=str(obj.get("worker", "")), rate=float(rate),
                    state=str(obj.get("state", "")), name=str(obj.get("name", "")))
    if sample.calls == 0:
        raise TimelineError(f"line {line}: an entry needs ok or failed > 0")
    if sample.slow > sample.calls:
        raise TimelineError(f"line {line}: slow > ok + failed")
    return sample


def read_jsonl(lines: Iterable[str]) -> list[Sample]:
    """The samples of a JSONL text, sorted by time (blank lines skipped)."""
    samples = []
    number = 0
    try:
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as error:
                raise TimelineError(f"line {number}: not JSON ({error.msg})") from None
            samples.append(parse_entry(obj, number))
    except UnicodeDecodeError:
        raise TimelineError(f"line {number + 1}: not UTF-8 text (a JSONL file from "
                            "`distbreaker record export`?)") from None
    samples.sort(key=lambda s: s.t_ms)
    return samples


def write_jsonl(samples: Iterable[Sample | Mapping[str, Any]]) -> Iterator[str]:
    for sample in samples:
        obj = sample.to_json() if isinstance(sample, Sample) else dict(sample)
        yield json.dumps(obj, separators=(",", ":")) + "\n"


def seed(seconds: int = 600, calls_per_second: int = 20, fail_from: int = 120,
         fail_until: int = 300, failure_rate: float = 0.9, base_rate: float = 0.02,
         duration_ms: int = 40, start_ms: int = 1_700_000_000_000,
         rng_seed: int = 27, name: str = "seed") -> list[Sample]:
    """The seed scenario: a dependency that fails then recovers. `calls_per_second`
    calls spread over each second, failing with `base_rate` except between `fail_from`
    and `fail_until` seconds, where they fail with `failure_rate` (deterministic)."""
    rng = random.Random(rng_seed)
    out = []
    step = 1000 / calls_per_second
    for second in range(seconds):
        rate = failure_rate if fail_from <= second < fail_until else base_rate
        for i in range(calls_per_second):
            failed = rng.random() < rate
            out.append(Sample(t_ms=start_ms + second * 1000 + int(i * step),
                              ok=0 if failed else 1, failed=1 if failed else 0,
                              duration_ms=duration_ms, worker=f"seed:{i % 4}",
                              name=name))
    return out
