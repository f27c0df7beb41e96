"""The adaptive bulkhead's settings, call priorities, and what a finished call reports.

The limit itself moves in lua/bulkhead.lua, by server time, from the outcomes every
worker reports (docs/ADAPTIVE.md has the algorithm and its references); this module
only turns settings and outcomes into the script's arguments.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from .._runtime.classify import parse_retry_after, status_of
from .._runtime.options import check_int
from ..errors import BulkheadFull, CallNotPermitted, Overloaded

#: Named priorities, most important first (an int is accepted too: 0 is critical).
PRIORITIES = {"critical": 0, "normal": 1, "sheddable": 2}
_MILLION = 1_000_000


@dataclasses.dataclass(frozen=True)
class AdaptiveLimit:
    """A fleet-wide concurrency limit that finds the dependency's capacity.

    It starts at `initial_limit` (default: `min_limit` x 4, within the bounds) and
    stays in [`min_limit`, `max_limit`]. Successes are gathered fleet-wide in windows
    (`window` seconds and 24 calls); each window's mean latency is compared with a
    **no-load reference**: the mean latency at a limit the dependency does not queue
    behind (the first windows', re-measured every `probe_interval` seconds at 3/4 of the
    limit and averaged), which a standing queue therefore cannot become. Slow start
    grows it x1.3 per window. Above `tolerance` x the reference, or above
    `latency_target` (an SLO the limit never trades away), it is cut to limit x
    reference / latency (at least half; the window after a cut confirms nothing);
    otherwise the queue the latency shows is held at half a call (3 % of a large
    limit), with `smoothing` as the gain. A failure, timeout or overload answer multiplies it by
    `backoff_ratio` (at most once per window); an `Overloaded` error's retry_after
    also pauses increases, and after a 429 the 429s, not the latency, mark the
    capacity. `sample_rate`: a worker reports its successes in batches of
    1 / sample_rate (count and mean latency), which keeps the Redis cost of an
    adaptive limit close to a fixed one's. Failures, timeouts and 429s are reported
    at once. docs/ADAPTIVE.md has the algorithm and when each parameter matters.
    """

    min_limit: int = 1
    max_limit: int = 200
    initial_limit: int | None = None
    backoff_ratio: float = 0.9
    tolerance: float = 1.5
    smoothing: float = 0.5
    sample_rate: float = 0.25
    latency_target: float | None = None
    probe_interval: float = 10.0
    window: float = 0.2

    def __post_init__(self) -> None:
        check_int(self.min_limit, "min_limit", 1, 1_000_000)
        check_int(self.max_limit, "max_limit", self.min_limit, 1_000_000)
        if self.initial_limit is None:
            object.__setattr__(self, "initial_limit",
                               min(self.max_limit, max(self.min_limit, 4 * self.min_limit)))
        check_int(self.initial_limit, "initial_limit", self.min_limit, self.max_limit)
        for field, low, high in (("backoff_ratio", 0.1, 0.999), ("tolerance", 1.0, 10.0),
                                 ("smoothing", 0.001, 1.0), ("sample_rate", 0.01, 1.0),
                                 ("probe_interval", 0.1, 86400.0), ("window", 0.01, 60.0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not low <= value <= high:
                raise ValueError(f"{field} must be a number in [{low}, {high}], got {value!r}")
        target = self.latency_target
        if target is not None and (isinstance(target, bool) or not isinstance(
                target, (int, float)) or not 0.001 <= target <= 3600):
            raise ValueError(f"latency_target must be None or seconds in [0.001, 3600], "
                             f"got {target!r}")

    @classmethod
    def build(cls, value: AdaptiveLimit | dict[str, Any] | None) -> AdaptiveLimit | None:
        """An AdaptiveLimit from itself, a mapping of its fields (config files), or None."""
        if value is None or isinstance(value, AdaptiveLimit):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise TypeError(f"unknown adaptive option(s): {', '.join(unknown)}")
            return cls(**value)
        raise TypeError(f"adaptive must be an AdaptiveLimit or a mapping, got {value!r}")

    @property
    def batch(self) -> int:
        """Successes a worker gathers before it reports them (count and mean latency)."""
        return max(1, round(1 / self.sample_rate))

    def wire(self) -> str:
        """ARGV[7] of the bulkhead script."""
        target = 0 if self.latency_target is None else max(1, round(self.latency_target * 1000))
        return ",".join(str(v) for v in (
            self.min_limit, self.max_limit, self.initial_limit,
            round(self.backoff_ratio * _MILLION), round(self.tolerance * _MILLION),
            round(self.smoothing * _MILLION), target, max(1, round(self.probe_interval * 1000)),
            max(1, round(self.window * 1000))))


class SuccessBatch:
    """One process's successes not reported yet: a report carries their count and mean
    latency, every `size` of them (so the fleet's windows see every success)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.count = 0
        self.total_ms = 0.0

    def add(self, latency_ms: float) -> tuple[int, int] | None:
        """Add one success; (count, mean latency ms) when the batch is due, else None."""
        with self.lock:
            self.count += 1
            self.total_ms += latency_ms
            if self.count < self.size:
                return None
            count, mean = self.count, round(self.total_ms / self.count)
            self.count, self.total_ms = 0, 0.0
            return count, mean

    def put_back(self, count: int, mean_ms: int) -> None:
        """A report that did not reach Redis: its successes go with the next one."""
        with self.lock:
            self.count += count
            self.total_ms += count * mean_ms


def priority_level(priority: str | int | None) -> int:
    """0 critical, 1 normal (the default), 2 and above sheddable."""
    if priority is None:
        return 1
    if isinstance(priority, str):
        try:
            return PRIORITIES[priority.lower()]
        except KeyError:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)} or an int "
                             f">= 0, got {priority!r}") from None
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)} or an int >= 0, "
                         f"got {priority!r}")
    return priority


def priority_share(level: int, critical_reserve: float, sheddable_share: float) -> int:
    """The share of the limit (millionths) calls of `level` may use: critical all of
    it, normal all but the critical reserve, sheddable at most `sheddable_share`."""
    if level <= 0:
        return _MILLION
    normal = 1.0 - critical_reserve
    share = normal if level == 1 else min(normal, sheddable_share)
    return max(1, round(share * _MILLION))


def outcome_of(error: BaseException | None) -> tuple[str, int]:
    """What a finished call reports to an adaptive limit: ("ok" | "drop" | "429" | "",
    Retry-After ms). Rejections by distbreaker itself and cancellations report nothing."""
    if error is None:
        return "ok", 0
    if not isinstance(error, Exception) or isinstance(error, (BulkheadFull, CallNotPermitted)):
        return "", 0
    if isinstance(error, Overloaded) or status_of(error) == 429:
        retry_after = getattr(error, "retry_after", None)
        if retry_after is None:  # an HTTP client's error: its response's header
            response = getattr(error, "response", None)
            headers = getattr(response, "headers", None) or getattr(error, "headers", None)
            header = headers.get("Retry-After") if hasattr(headers, "get") else None
            retry_after = parse_retry_after(header) if header is not None else 0.0
        return "429", max(0, round(float(retry_after or 0.0) * 1000))
    return "drop", 0
