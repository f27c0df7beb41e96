"""A worker process of the quorum-trip fleet test: records `failures` failed calls on
one breaker, then reports what it sees (module level: spawn needs an importable target)."""

from __future__ import annotations

from typing import Any

from distbreaker import CircuitBreaker
from distbreaker.errors import CallNotPermitted

QUORUM = {"sliding_window_size": 6, "minimum_number_of_calls": 2, "min_failing_workers": 2,
          "wait_duration_in_open_state": 30.0, "quorum_window": 30.0}


def fail_then_report(url: str, name: str, failures: int, results: Any) -> None:
    breaker = CircuitBreaker(name, redis=url, **QUORUM)
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
