"""A worker process of the quorum-trip fleet test: records `failures` failed calls on
one breaker, then reports what it sees (module level: spawn needs an importable target)."""

from __future__ import annotations

import time
from typing import Any

from distbreaker import CircuitBreaker
from distbreaker.errors import CallNotPermitted

QUORUM = {"sliding_window_size": 6, "minimum_number_of_calls": 2, "min_failing_workers": 2,
          "wait_duration_in_open_state": 30.0, "quorum_window": 30.0}


def fail_then_report(url: str, name: str, failures: int, results: Any) -> None:
    fail_with_config(url, name, failures, QUORUM, results)


#: The fault scenario: 8 workers, a low threshold so that one bad worker of 8 exceeds
#: the fleet's failure rate (12 % > 10 %) while the quorum asks for 3 workers.
FLEET = {"sliding_window_size": 50, "minimum_number_of_calls": 10,
         "failure_rate_threshold": 10.0, "min_failing_workers": 3,
         "wait_duration_in_open_state": 60.0, "quorum_window": 60.0, "redis_timeout": 5.0}


def run_for(url: str, name: str, bad: bool, start_at: float, seconds: float,
            results: Any) -> None:
    """Call the breaker for `seconds` from wall-clock `start_at` (all workers start
    together); a bad worker's calls all fail. Reports (bad, calls, failures,
    rejections, the reasons of the rejections)."""
    breaker = CircuitBreaker(name, redis=url, **FLEET)
    while time.time() < start_at:
        time.sleep(0.01)
    calls = failures = rejections = 0
    reasons: set[str] = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            breaker.call((lambda: 1 / 0) if bad else (lambda: "ok"))
            calls += 1
        except ZeroDivisionError:
            calls, failures = calls + 1, failures + 1
        except CallNotPermitted as rejection:
            rejections += 1
            reasons.add(str(rejection.reason))
        time.sleep(0.002)
    results.put((bad, calls, failures, rejections, sorted(reasons)))


def fail_with_config(url: str, name: str, failures: int, config: dict[str, Any],
                     results: Any) -> None:
    """`fail_then_report` with a given config."""
    breaker = CircuitBreaker(name, redis=url, **config)
    seen: list[str] = []
    for _ in range(failures):
        try:
            breaker.call(lambda: 1 / 0)
            seen.append("ok")
        except ZeroDivisionError:
            seen.append("failed")
        except CallNotPermitted as rejection:
            seen.append(f"rejected:{rejection.reason}")
    results.put((seen, breaker.state.value))
